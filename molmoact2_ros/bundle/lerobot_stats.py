"""A LeRobot fine-tune's normaliser statistics as a ``norm_stats.json`` document.

A LeRobot fine-tune replaces the normaliser statistics with its dataset's and keeps them in the
policy processor's safetensors (``policy_preprocessor_step_N_normalizer_processor.safetensors``,
flat keys ``<feature>.<stat>``), its mode in the processor's JSON config (``norm_map``), not in
a ``norm_stats.json``. The document written here records that file as its ``source``.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import BundleError
from .normstats import FORMAT, MODES

#: LeRobot's NormalizationMode values and the norm_stats.json modes they are.
LEROBOT_MODES = {"QUANTILES": "q01_q99", "MIN_MAX": "min_max", "QUANTILE10": "q10_q90"}
#: norm_stats.json feature → LeRobot feature key
FEATURES = {"state_stats": "observation.state", "action_stats": "action"}


def find_processor(checkpoint: Path) -> Path | None:
    """The normaliser state of a LeRobot checkpoint's preprocessor (it holds state and action
    statistics), else of any processor; None when there is none."""
    found = sorted(Path(checkpoint).glob("*normalizer_processor.safetensors"))
    pre = [p for p in found if p.name.startswith("policy_preprocessor")]
    return (pre or found or [None])[0]


def processor_mode(path: Path) -> str | None:
    """The mode the processor's JSON config names for state and action (None if there is no
    config); different modes for the two are refused (one file holds one mode)."""
    config = path.with_name(path.name.split("_step_")[0] + ".json")
    if not config.is_file():
        return None
    try:
        steps = json.loads(config.read_text(encoding="utf-8")).get("steps", [])
        step = next(s for s in steps if s.get("state_file") == path.name)
        norm_map = step.get("config", {}).get("norm_map", {})
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError, StopIteration) as exc:
        raise BundleError(f"{config}: no step with state_file {path.name} and a norm_map "
                          f"({type(exc).__name__}); name the mode with --norm-mode") from None
    modes = {norm_map.get("STATE"), norm_map.get("ACTION")}
    if len(modes) != 1 or None in modes:
        raise BundleError(f"{config}: norm_map {norm_map} gives state and action different or "
                          "no modes; one norm_stats.json holds one: name it with --norm-mode")
    lerobot = modes.pop()
    if lerobot not in LEROBOT_MODES:
        raise BundleError(f"{config}: norm_map mode {lerobot!r} is not one of "
                          f"{sorted(LEROBOT_MODES)}; the policy cannot use it")
    return LEROBOT_MODES[lerobot]


def stats_from_processor(path: Path, mode: str | None = None, meta: dict | None = None) -> dict:
    """The ``norm_stats.json`` document of a LeRobot normaliser safetensors. ``mode`` (as
    named by the user) wins over the processor config's; with neither it is refused."""
    from ..util.optional import require

    require("safetensors", "reading a LeRobot processor's statistics")
    from safetensors.numpy import load_file

    path = Path(path)
    try:
        tensors = load_file(str(path))
    except Exception as exc:  # SafetensorError, OSError
        raise BundleError(f"{path} is not a readable safetensors file ({exc})") from None
    mode = mode or processor_mode(path)
    if mode is None:
        raise BundleError(f"{path}: no processor config names the normalisation mode; name it "
                          f"with --norm-mode ({', '.join(MODES)}; LeRobot's MolmoAct2 default "
                          "QUANTILES is q01_q99)")
    if mode not in MODES:
        raise BundleError(f"--norm-mode {mode!r}: choose one of {', '.join(MODES)}")
    out = dict(meta or {})
    for name, feature in FEATURES.items():
        stats = {key.rsplit(".", 1)[1]: value for key, value in tensors.items()
                 if key.rsplit(".", 1)[0] == feature}
        missing = [k for k in MODES[mode] if k not in stats]
        if missing:
            raise BundleError(f"{path}: no {feature}.{missing[0]} (it has "
                              f"{sorted(k for k in tensors if k.startswith(feature + '.'))}); "
                              f"mode {mode} needs {' and '.join(MODES[mode])}")
        if "mask" not in stats:
            raise BundleError(f"{path}: no {feature}.mask, and a processor holds no dimension "
                              "names to derive it from (LeRobot: names containing 'gripper' "
                              "pass raw); give --norm-stats a norm_stats.json with its mask")
        out[name] = {k: ([bool(x) for x in v.reshape(-1)] if k == "mask"
                         else [float(x) for x in v.reshape(-1)])
                     for k, v in stats.items() if v.ndim <= 1}
    return {"format": FORMAT, "norm_mode": mode, "source": f"LeRobot processor {path}",
            "metadata_by_tag": {"libero": out}}
