"""The package against the model's own computation: the reference bundle, a tiny MolmoAct2
built by LeRobot's own classes, its goldens computed by PyTorch (``predict_action`` from raw
images, state and instruction). No torch here: the goldens are in the committed archive.

Every convention the host glue chooses is checked twice: the package reproduces
``predict_action`` within 1e-4 (ONNX Runtime and the HTP runtime over the test fake), and each
convention, changed alone, makes that comparison fail (the mutation tests at the end).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from molmoact2_ros.bundle.bundle import Bundle
from molmoact2_ros.bundle.checkpoint import read_settings
from molmoact2_ros.cli.app import main as cli_main
from molmoact2_ros.cli.export_host import export_host
from molmoact2_ros.errors import PromptError
from molmoact2_ros.host.prompt_decode import decode_golden_prompt
from molmoact2_ros.policy import Observation, Policy

#: predict_action against Policy.predict, de-normalised chunk and pre-clip trajectory
TOL = 1e-4
MODES = {"both": "checkpoint", "continuous": "checkpoint_continuous"}
BUNDLES = {10: "fused", 2: "fused_2step"}


def _cases(root: Path) -> list[dict]:
    return json.loads((root / "MANIFEST.json").read_text())["cases"]


@pytest.fixture(scope="module")
def ref(reference_bundle, tmp_path_factory) -> dict:
    """The reference bundles with host/ written by export-host from the checkpoint of each
    action_mode, no hand edit: {(steps, mode): bundle folder}, plus the root."""
    out = {"root": reference_bundle}
    work = tmp_path_factory.mktemp("reference")
    for steps, name in BUNDLES.items():
        for mode, ckpt in MODES.items():
            dst = work / f"{name}_{mode}"
            shutil.copytree(reference_bundle / name, dst)
            export_host(reference_bundle / ckpt, dst)
            if mode == "continuous":
                # the goldens were recorded with the "both" checkpoint; this copy runs the
                # continuous one, whose config.json rule (padding_only) replaces theirs
                conv = dst / "host" / "conventions.json"
                data = json.loads(conv.read_text())
                assert data["encoder_mask"] == "exclude_eos"  # what the goldens show
                data["encoder_mask"] = read_settings(reference_bundle / ckpt).encoder_mask
                conv.write_text(json.dumps(data))
            out[(steps, mode)] = dst
    return out


def _observation(case: dict) -> Observation:
    return Observation(images=(case["image_primary"], case["image_wrist"]),
                       state=case["state"], instruction=str(case["instruction"]))


def _load(root: Path, entry: dict) -> dict:
    return dict(np.load(root / entry["file"], allow_pickle=False))


def _deltas(policy: Policy, case: dict) -> tuple[float, float]:
    """max |d| of the de-normalised chunk and of the pre-clip trajectory (normalised)."""
    policy.set_flow_steps(int(case["flow_steps"]))
    chunk = policy.predict(_observation(case), noise=case["noise"])
    d_chunk = float(np.abs(chunk.actions - case["chunk"]).max())
    d_traj = float(np.abs(chunk.actions_normalized - case["trajectory"][:, :7]).max())
    return d_chunk, d_traj


def _check_all(ref: dict, backend: str) -> dict:
    """Every case on one backend: fitting ones within TOL, the rest refused."""
    root = ref["root"]
    worst: dict = {}
    for (steps, mode), bundle in ((k, v) for k, v in ref.items() if k != "root"):
        entries = [e for e in _cases(root) if e["flow_steps"] == steps and e["action_mode"] == mode]
        with Policy.load(bundle, "fused", backend=backend, flow_steps=steps) as policy:
            for entry in entries:
                case = _load(root, entry)
                if not entry["fits"]:
                    with pytest.raises(PromptError, match="tokens"):
                        policy.predict(_observation(case), noise=case["noise"])
                    continue
                d_chunk, d_traj = _deltas(policy, case)
                worst[entry["file"]] = (d_chunk, d_traj)
                assert d_chunk <= TOL and d_traj <= TOL, (entry, d_chunk, d_traj)
    return worst


def test_parity_on_the_reference_bundles(ref, capsys):
    for key in ((10, "both"), (2, "both")):
        assert cli_main(["parity", str(ref[key])]) == 0, capsys.readouterr().out
        assert "30/30 rows pass" in capsys.readouterr().out


def test_export_host_reads_the_released_checkpoint(ref):
    prompt = json.loads((ref[(10, "both")] / "host" / "prompt.json").read_text())
    assert (prompt["bos_token"], prompt["eos_token"], prompt["pad_token"]) == (
        "<|im_end|>", "<|im_end|>", "<|endoftext|>")
    conv = Bundle.open(ref[(2, "both")]).conventions()
    assert (conv.euler_baked_steps, conv.encoder_mask, conv.padding_side) == (
        2, "exclude_eos", "right")


def test_predict_matches_predict_action_on_onnx(ref):
    worst = _check_all(ref, "onnx")
    assert len(worst) == 24  # 3 observations x 2 instructions x 2 modes x 2 step counts


def test_predict_matches_predict_action_on_the_htp_runtime(ref, monkeypatch, tmp_path):
    """The resident HTP runtime (workers, arena, the action worker's flow loop) over the test
    fake, with float32-I/O stand-in contexts: the same 1e-4."""
    from htp_helpers import fake_env

    from molmoact2_ros.bundle.variants import COMPONENTS, get_variant
    from molmoact2_ros.synth.contexts import fake_context_bytes

    fake_env(monkeypatch)
    spec = get_variant("fused")
    htp = {"root": ref["root"]}
    for key in ((10, "both"), (2, "continuous")):
        dst = tmp_path / f"htp_{key[0]}_{key[1]}"
        shutil.copytree(ref[key], dst)
        (dst / "ctx").mkdir()
        for component in COMPONENTS:
            onnx = (dst / "onnx" / spec.onnx_dir(component) / "model.onnx").read_bytes()
            (dst / "ctx" / spec.context_file(component)).write_bytes(fake_context_bytes(
                component, onnx, soc_id=spec.soc_id, dsp_arch=spec.dsp_arch,
                float_io="float32"))
        htp[key] = dst
    worst = _check_all(htp, "htp")
    assert len(worst) == 12  # 3 observations x 2 instructions x 2 bundles


def test_parity_on_the_htp_fake_with_fp16_io(ref, monkeypatch, tmp_path, capsys):
    """The golden bias's finfo.min, cast into fp16 sessions, still masks: parity passes at
    the fp16 limits (the fake's default fp16 I/O, as a context compiled for the HTP)."""
    from htp_helpers import fake_env

    from molmoact2_ros.bundle.variants import get_variant
    from molmoact2_ros.synth.contexts import write_fake_contexts

    fake_env(monkeypatch)
    dst = tmp_path / "fused"
    shutil.copytree(ref[(10, "both")], dst)
    write_fake_contexts(dst, get_variant("fused"), suffixes=("",))
    assert cli_main(["parity", str(dst), "--backend", "htp"]) == 0
    assert "30/30 rows pass" in capsys.readouterr().out


def test_replay_of_a_bag_of_its_observations(ref, tmp_path, capsys):
    from replay_helpers import run_cli

    for key in ((10, "both"), (2, "both")):
        trace = ref[key] / "golden" / "e2e_trace_alt.npz"
        bag = tmp_path / f"obs_{key[0]}"
        rc, out, err = run_cli(["trace-to-bag", trace, bag], capsys)
        assert rc == 0, out + err
        rc, out, err = run_cli(["replay", bag, "--bundle-root", ref[key], "--variant", "fused",
                                "--golden", trace,
                                "--atol", "1e-4", "--no-progress"], capsys)
        assert rc == 0, out + err
        assert "golden chunks: 3 passed, 0 failed" in out, out


def test_the_golden_decoder_reads_the_exporters_prompt(ref, tmp_path, capsys):
    d = decode_golden_prompt(Bundle.open(ref[(10, "both")]))
    manifest = json.loads((ref["root"] / "MANIFEST.json").read_text())
    assert d.instruction == manifest["instructions"]["short"]
    assert d.first_difference is None and (d.padding_side, d.pad_count) == ("right", 6)
    assert d.special_places["<|im_end|>"][0] == 0  # BOS
    assert d.special_places["<im_start>"] == [4, 205] and d.special_places["<im_end>"] == [201, 402]
    assert int(d.is_image.sum()) == 392
    assert cli_main(["conventions", str(ref[(10, "both")])]) == 0
    assert "the package's prompt equals the golden's, token for token" in capsys.readouterr().out
    # the wrong BOS is named with its position and both tokens
    bad = tmp_path / "wrong_bos"
    shutil.copytree(ref[(10, "both")], bad)
    path = bad / "host" / "prompt.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "bos_token": "<|endoftext|>"}))
    assert cli_main(["conventions", str(bad)]) == 1
    assert ("first difference at position 0: golden '<|im_end|>', package '<|endoftext|>'"
            in capsys.readouterr().out)


def test_one_libero_step_with_the_reference_policy(ref):
    """LIBERO's rendered cameras and state through the reference policy: a task whose
    instruction fits S, one chunk, its first row applied for one control step."""
    pytest.importorskip("libero")
    from molmoact2_ros.sim.libero_env import LiberoSim

    sim = LiberoSim(settle_steps=2)
    try:
        with Policy.load(ref[(10, "both")], "fused", backend="onnx", seed=0) as policy:
            for task_id in range(10):
                language = sim.task("libero_goal", task_id).language
                try:
                    policy.plan(language)
                except PromptError:
                    continue
                break
            else:
                pytest.fail("no libero_goal instruction fits the reference bundle's S")
            obs = sim.reset("libero_goal", task_id, 0)
            chunk = policy.predict(Observation(images=obs.images, state=obs.state,
                                               instruction=language))
        assert chunk.actions.shape == (10, 7) and np.isfinite(chunk.actions).all()
        after = sim.step(chunk.actions[0])
        assert after.step == 1 and np.isfinite(after.state).all()
        assert not np.allclose(after.state, obs.state)
    finally:
        sim.close()


# -- each convention, changed alone, fails the comparison ------------------------------------
def _one_case(ref, steps=10, mode="both", kind="short", obs=0) -> dict:
    name = f"reference/e2e_o{obs}_{kind}_{mode}_{steps}steps.npz"
    return dict(np.load(ref["root"] / name, allow_pickle=False))


def _mutated(ref, tmp_path, key, *, prompt=None, conventions=None) -> Path:
    dst = tmp_path / "mutated"
    shutil.copytree(ref[key], dst)
    for name, change in (("prompt.json", prompt), ("conventions.json", conventions)):
        if change:
            path = dst / "host" / name
            path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    return dst


def _delta(bundle: Path, case: dict, wrap=None) -> float:
    with Policy.load(bundle, "fused", backend="onnx") as policy:
        if wrap is not None:
            wrap(policy)
        return _deltas(policy, case)[0]


MUTATIONS = {
    "bos_token": dict(prompt={"bos_token": "<|endoftext|>"}),
    "padding_side": dict(conventions={"padding_side": "left"}),
    "image_block": dict(prompt={"image_start_token": "<im_end>", "image_end_token": "<im_start>"}),
    "mask_value": dict(conventions={"mask_value": -1.0}),
    "encoder_mask": dict(conventions={"encoder_mask": "padding_only"}),
    "euler_baked_steps": dict(conventions={"euler_baked_steps": 10}, steps=2),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_a_changed_convention_fails_the_reference(ref, tmp_path, name):
    change = dict(MUTATIONS[name])
    steps = change.pop("steps", 10)
    case = _one_case(ref, steps=steps)
    assert _delta(ref[(steps, "both")], case) <= TOL  # unchanged: the reference holds
    d = _delta(_mutated(ref, tmp_path, (steps, "both"), **change), case)
    assert d > TOL, f"{name}: chunk max |d| {d:.3g} still within {TOL}"


def test_cross_image_attention_is_needed(ref, monkeypatch):
    """The bidirectional block spans both cameras; within each camera only, it fails."""
    from molmoact2_ros.host import prompt as hp

    original = hp.attention_bias

    def per_camera(valid, is_image, conv):
        edges = np.flatnonzero(np.diff(np.concatenate([[0], is_image.astype(np.int8)])) == 1)
        camera = np.searchsorted(edges, np.arange(valid.size), side="right") * is_image
        bias = original(valid, is_image, replace(conv, bidirectional_image_attention=False))
        same = (camera[:, None] == camera[None, :]) & is_image[:, None] & is_image[None, :]
        bias[0, 0][same & valid[None, :]] = 0.0
        return bias

    case = _one_case(ref)
    monkeypatch.setattr(hp, "attention_bias", per_camera)
    d = _delta(ref[(10, "both")], case)
    assert d > TOL, f"cross-image attention: chunk max |d| {d:.3g} still within {TOL}"


def test_noise_masking_is_needed(ref):
    case = _one_case(ref)

    def unmasked(policy):
        run = policy.pipeline.run_action
        raw = np.asarray(case["noise"], np.float32)
        policy.pipeline.run_action = lambda x0, steps, *a, **k: run(raw.copy(), steps, *a, **k)

    d = _delta(ref[(10, "both")], case, unmasked)
    assert d > TOL, f"noise masking: chunk max |d| {d:.3g} still within {TOL}"


def test_the_euler_schedule_is_needed(ref, monkeypatch):
    from molmoact2_ros.host import flow

    case = _one_case(ref)
    monkeypatch.setattr(flow, "timesteps", lambda n: (np.arange(1, n + 1, dtype=np.float32)
                                                      / np.float32(n)))
    d = _delta(ref[(10, "both")], case)
    assert d > TOL, f"Euler schedule t=(i+1)/N: chunk max |d| {d:.3g} still within {TOL}"
