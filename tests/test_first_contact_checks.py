"""doctor, device-report and conventions on bundles no parity check can fault: a prompt budget
cut to the published 9 tokens, norm stats without a mask, without a mode, with NaN or with 5
dimensions for 7, and a seed workspace without host/."""

from __future__ import annotations

import json
import re
import shutil

import pytest
from budget_helpers import cut_budget_bundle

from molmoact2_ros.cli.app import main

LIBERO = ("metadata_by_tag", "libero")


@pytest.fixture(scope="module")
def cut_root(tiny_root, tmp_path_factory):
    return cut_budget_bundle(tiny_root, tmp_path_factory.mktemp("cut-budget"))


def _report(bundle, out) -> dict:
    main(["device-report", str(bundle), "--out", str(out)])
    return json.loads(out.with_name(out.name + ".json").read_text())


def test_doctor_device_report_and_conventions_print_the_budget(cut_root, tmp_path, capsys):
    pytest.importorskip("libero")
    main(["doctor", str(cut_root / "grid_sampler")])
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "prompt budget" in ln)
    assert "S=128: 119 fixed" in line and "9 tokens left for the task" in line, line
    assert "libero_spatial 0/10" in line and "libero_goal 10/10" in line, line
    assert "      | libero_spatial | 0/10 | 19 tokens | 138 |" in out.splitlines(), out
    report = _report(cut_root / "grid_sampler", tmp_path / "r.md")
    budget = report["variants"]["grid_sampler"]["prompt_budget"]
    assert (budget["budget"]["fixed"], budget["budget"]["left"]) == (119, 9)
    suites = {s["suite"]: s for s in budget["suites"]}
    assert suites["libero_spatial"]["fit"] == 0 and suites["libero_spatial"]["seq_needed"] == 138
    assert "| libero_spatial | 0/10 | 19 tokens | 138 |" in (tmp_path / "r.md").read_text()
    capsys.readouterr()
    main(["conventions", str(cut_root / "lp_vtp_sd")])
    out = capsys.readouterr().out
    assert "prompt budget: S=130: 119 fixed" in out and "11 tokens left" in out, out


def _edit_stats(tiny_root, tmp_path, fn):
    root = tmp_path / "grid_sampler"
    shutil.copytree(tiny_root / "grid_sampler", root, symlinks=True)
    path = root / "norm_stats.json"
    data = json.loads(path.read_text())
    fn(data, data["metadata_by_tag"]["libero"])
    path.write_text(json.dumps(data))
    return root


def _five(data, meta):
    for key in ("q01", "q99", "min", "max", "mask", "names"):
        meta["action_stats"][key] = meta["action_stats"][key][:5]


CASES = [
    ("no-mask", lambda d, m: [m["state_stats"].pop(k) for k in ("mask", "names")],
     "state_stats.mask is missing"),
    ("no-mode", lambda d, m: d.pop("norm_mode"), "norm_mode is missing"),
    ("nan", lambda d, m: m["action_stats"].__setitem__("q99", [float("nan")] * 7),
     "action_stats.q99[0] is nan"),
    ("five-for-seven", _five, "action_stats.q01 has 5 values but this policy needs 7"),
]


@pytest.mark.parametrize("name,edit,words", CASES, ids=[c[0] for c in CASES])
def test_bad_norm_stats_fail_in_doctor_and_device_report_naming_the_field(
        name, edit, words, tiny_root, tmp_path, capsys):
    root = _edit_stats(tiny_root, tmp_path, edit)
    assert main(["doctor", str(root)]) == 1
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if "norm stats" in ln)
    assert line.startswith("FAIL") and words in line, line
    report = _report(root, tmp_path / "r.md")
    facts = report["variants"]["grid_sampler"]["norm_stats"]
    assert facts["status"] == "FAIL" and words in facts["why"], facts
    assert "grid_sampler norm_stats.json" in capsys.readouterr().out


@pytest.mark.parametrize("name,edit,words", CASES, ids=[c[0] for c in CASES])
def test_bad_norm_stats_are_refused_by_the_node_naming_the_field(name, edit, words, tiny_root,
                                                                  tmp_path):
    from molmoact2_ros.control.controller import Controller
    from molmoact2_ros.control.params import Settings
    from molmoact2_ros.errors import MolmoActError

    root = _edit_stats(tiny_root, tmp_path, edit)
    ctl = Controller(Settings().with_changes({"backend": "onnx", "bundle.grid_sampler": str(root),
                                              "instruction": "put the bowl on the plate"}),
                     publish=lambda out: None)
    with pytest.raises(MolmoActError, match=re.escape(words)):
        ctl.configure()
    assert ctl.policy is None


def test_a_norm_stats_file_that_is_not_json_fails(tiny_root, tmp_path, capsys):
    root = _edit_stats(tiny_root, tmp_path, lambda d, m: None)
    (root / "norm_stats.json").write_text("q01: [0.1]")
    main(["doctor", str(root)])
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "norm stats" in ln)
    assert line.startswith("FAIL") and "norm_stats.json" in line and "JSON" in line, line


def test_good_norm_stats_report_their_source_mode_and_the_goldens(tiny_root, capsys):
    main(["doctor", str(tiny_root / "grid_sampler")])
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "norm stats" in ln)
    assert line.startswith("PASS") and "mode q01_q99" in line and "goldens agree" in line, line


def test_stats_that_are_not_the_goldens_fail(tiny_root, tmp_path, capsys):
    """Valid stats, but not the ones the goldens were made with (x's range doubled)."""
    def widen(data, meta):
        meta["action_stats"]["q99"][0] = meta["action_stats"]["q99"][0] * 2 + 1
    root = _edit_stats(tiny_root, tmp_path, widen)
    main(["doctor", str(root)])
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "norm stats" in ln)
    assert line.startswith("FAIL") and "de-normalised with these stats" in line, line


def test_doctor_on_a_seed_workspace_without_host_names_export_host(tiny_root, tmp_path, capsys):
    root = tmp_path / "grid_sampler"
    shutil.copytree(tiny_root / "grid_sampler", root, symlinks=True)
    shutil.rmtree(root / "host")
    assert main(["doctor", str(root), "--ignore-bundle-libs"]) == 1
    out = capsys.readouterr().out
    at = out.index("FAIL  host assets")
    fix = out[at:].splitlines()[1]
    assert "molmoact2 export-host CHECKPOINT" in fix and "conventions" in fix, fix
    assert "--write" in fix


def test_parity_takes_ignore_bundle_libs(tiny_root, capsys):
    assert main(["parity", str(tiny_root / "grid_sampler"), "--ignore-bundle-libs"]) == 0


def test_download_messages_name_the_repository(tiny_root, tmp_path):
    """A missing context, a missing bundle and a missing checkpoint shard each name where to
    download it from (docs/iq9075.md's table)."""
    from molmoact2_ros.bundle.bundle import Bundle, resolve_bundles
    from molmoact2_ros.bundle.checkpoint import safetensors_files
    from molmoact2_ros.errors import BundleError

    root = tmp_path / "grid_sampler"
    shutil.copytree(tiny_root / "grid_sampler", root, symlinks=True)
    shutil.rmtree(root / "ctx")
    with pytest.raises(BundleError, match="hf download "
                       "xpuenabler/molmoact2-libero_grid_sampler_qnn --local-dir"):
        Bundle.open(root).check("htp")
    with pytest.raises(BundleError, match="xpuenabler/MolmoAct2-LIBERO-LP-VTP-SD"):
        resolve_bundles(tmp_path / "nowhere")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "model.safetensors.index.json").write_text('{"weight_map": {"a": "a.safetensors"}}')
    with pytest.raises(BundleError, match="allenai/MolmoAct2-LIBERO"):
        safetensors_files(ckpt)
