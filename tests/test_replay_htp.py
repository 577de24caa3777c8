"""The cross-machine check on the tiny bundles: a golden recorded with ONNX Runtime, the same
bag replayed through the HTP worker code (fake qai_appbuilder) with fp16 tolerances."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("rosbags")
from htp_helpers import Snapshot, ensure_contexts, fake_env  # noqa: E402
from replay_helpers import FIRST_NS, obs_bag, run_cli, trace  # noqa: E402


@pytest.mark.parametrize("variant", ["lp_vtp_sd", "grid_sampler"])
def test_onnx_golden_passes_on_the_htp_worker_code(tiny_root, tmp_path, monkeypatch, capsys,
                                                   variant):
    ensure_contexts(tiny_root)
    fake_env(monkeypatch)
    tr = trace(tiny_root, variant)
    bag = obs_bag(tmp_path / "obs", tr, 3)
    golden = tmp_path / "golden"
    rc, out, err = run_cli(["replay", bag, "--bundle-root", tiny_root, "--variant", variant,
                            "--instruction", str(tr["instruction"]), "--seed", "7",
                            "--backend", "onnx", "--record", golden, "--no-progress"], capsys)
    assert rc == 0, out + err
    before = Snapshot.take()
    rc, out, err = run_cli(["replay", bag, "--bundle-root", tiny_root, "--backend", "htp",
                            "--golden", golden, "--no-progress"], capsys)
    assert rc == 0, out + err
    assert "compared 3 of 3 golden chunks: 3 passed, 0 failed, 0 missing, 0 extra" in out
    assert "cosine >= 0.999 and >= 95% within [0.0041," in out  # the htp default (fp16)
    assert "htp (qai_appbuilder: test fake)" in out  # the summary says what ran
    assert "settings differ" not in out  # the backend is not a compared setting
    assert Snapshot.take().leaks_since(before) == []


def test_noise_is_the_same_on_both_backends(tiny_root, monkeypatch):
    """The x0 each backend's flow starts from, for two stamps, equals the reference's
    ``default_rng([seed, stamp_ns])`` draw (the noise is drawn on the host, before the
    backend sees it)."""
    from molmoact2_ros.policy import Observation, Policy
    from molmoact2_ros.synth import reference_host as rh

    ensure_contexts(tiny_root)
    fake_env(monkeypatch)
    tr = trace(tiny_root, "lp_vtp_sd")
    seen: dict[str, list[np.ndarray]] = {}
    for backend in ("onnx", "htp"):
        with Policy.load(tiny_root / "lp_vtp_sd", "lp_vtp_sd", backend=backend, seed=7,
                         instruction=str(tr["instruction"])) as policy:
            run_action = policy.pipeline.run_action

            def spy(x0, steps, _run=run_action, _backend=backend):
                seen.setdefault(_backend, []).append(np.array(x0))
                return _run(x0, steps)

            policy.pipeline.run_action = spy
            for stamp in (FIRST_NS, FIRST_NS + 1):
                policy.predict(Observation(images=(tr["image_primary"], tr["image_wrist"]),
                                           state=tr["state"], stamp_ns=stamp))
    pad = np.asarray(tr["action_dim_is_pad"], np.float32).reshape(1, -1)
    for i, stamp in enumerate((FIRST_NS, FIRST_NS + 1)):
        want = rh.initial_noise([7, stamp], 10, pad)
        np.testing.assert_array_equal(seen["onnx"][i], want)
        np.testing.assert_array_equal(seen["htp"][i], want)
    assert not np.array_equal(seen["onnx"][0], seen["onnx"][1])  # 1 ns apart: other noise


def test_fp16_default_fails_nine_flow_steps_and_swapped_cameras_chunk_by_chunk(
        tiny_root, tmp_path, monkeypatch, capsys):
    """The calibrated fp16 limits: the HTP run with the golden's settings passes (test above),
    the same run with 9 flow steps instead of 10, or with the cameras swapped, fails every
    chunk and names the within criterion."""
    ensure_contexts(tiny_root)
    fake_env(monkeypatch)
    tr = trace(tiny_root, "grid_sampler")
    bag = obs_bag(tmp_path / "obs", tr, 4)
    swapped = obs_bag(tmp_path / "swapped", tr, 4, swap=True)
    golden = tmp_path / "golden"
    rc, out, err = run_cli(["replay", bag, "--bundle-root", tiny_root, "--variant",
                            "grid_sampler", "--instruction", str(tr["instruction"]), "--seed",
                            "7", "--flow-steps", "10", "--record", golden, "--no-progress"],
                           capsys)
    assert rc == 0, out + err
    for extra, obs in ((["--flow-steps", "9"], bag), ([], swapped)):
        rc, out, err = run_cli(["replay", obs, "--bundle-root", tiny_root, "--backend", "htp",
                                "--golden", golden, "--no-progress", *extra], capsys)
        assert rc == 1, out + err
        assert "compared 4 of 4 golden chunks: 0 passed, 4 failed" in out, out
        assert "within 4 of 4" in out.split("chunks failing each criterion: ")[1], out
