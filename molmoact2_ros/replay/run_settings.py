"""One replay run's settings: the golden (a chunk bag or a trace), the options given, the
golden's settings and replay's defaults merged in that order and validated, the chunk limits;
the same for one bag and for many. ``parse_set`` types ``--set NAME=VALUE`` pairs."""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path
from typing import Any

from ..bundle.bundle import bundle_parameters
from ..errors import MolmoActError


def parse_set(items: list[str]) -> dict[str, Any]:
    """``--set NAME=VALUE`` pairs typed by the parameter's default; unknown names and values
    of the wrong type are refused with the nearest parameter name or the expected type."""
    from ..control.params import PARAMS_BY_NAME

    out: dict[str, Any] = {}
    for item in items:
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise MolmoActError(f"--set {item!r}: write NAME=VALUE, e.g. --set sync.slop_s=0.02")
        spec = PARAMS_BY_NAME.get(key)
        if spec is None:
            near = difflib.get_close_matches(key, list(PARAMS_BY_NAME), n=1)
            hint = f"; did you mean {near[0]}?" if near else "; see config/policy.yaml"
            raise MolmoActError(f"--set {key}: no such parameter{hint}")
        out[key] = _typed(key, spec.default, text.strip())
    return out


def _typed(key: str, default: Any, text: str) -> Any:
    try:
        if isinstance(default, bool):
            low = text.lower()
            if low not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                raise ValueError(text)
            return low in ("1", "true", "yes", "on")
        if isinstance(default, list):
            kind = type(default[0]) if default else str
            return [kind(x) for x in text.split(",") if x]
        return type(default)(text)
    except ValueError:
        kind = "true/false" if isinstance(default, bool) else (
            f"comma-separated {type(default[0]).__name__}s" if isinstance(default, list)
            else type(default).__name__)
        raise MolmoActError(f"--set {key}={text!r}: expected {kind} (default {default!r})"
                            ) from None


def load_golden(path: Path):
    """A chunk bag (``GoldenChunks``) or a trace npz (dict of arrays)."""
    from ..bundle.golden import load_npz
    from ..replay.chunkbag import read_chunk_bag

    path = Path(path)
    if path.is_file() and path.suffix == ".npz":
        return load_npz(path, ["chunk", "noise", "instruction", "seed", "flow_steps"],
                        what="replay --golden")
    return read_chunk_bag(path)


def golden_and_settings(args: argparse.Namespace):
    """The golden (a chunk bag, a trace's dict, or None), its settings, the run's settings
    checked against them, the tolerance, and the settings that differ from the golden's; one
    place for one bag and for many."""
    from ..control.params import Settings, validate_changes

    golden = load_golden(Path(args.golden)) if args.golden else None
    trace = golden if isinstance(golden, dict) else None
    if trace is not None:
        golden_settings = {"instruction": str(trace["instruction"]),
                           "seed": int(trace["seed"]), "flow_steps": int(trace["flow_steps"])}
    else:
        golden_settings = dict(golden.settings) if golden is not None else {}
    changes, differences = run_changes(args, golden_settings)
    from .chunk_match import check_atol

    ok, reason = validate_changes(changes, Settings())
    if not ok:
        raise MolmoActError(reason)
    settings = Settings().with_changes(changes)
    tol = tolerance_from_args(args, args.backend)
    check_atol(tol, len(settings["action_names"]))  # before the run, not at the match
    return golden, trace, golden_settings, settings, tol, differences


def run_changes(args: argparse.Namespace, golden_settings: dict) -> tuple[dict, list[str]]:
    """Parameter changes of this run: arguments first, then the golden's settings, then
    replay's defaults; returns them with the settings that differ from the golden's."""
    from ..replay.chunkbag import settings_differences

    given = {"variant": args.variant, "instruction": args.instruction, "seed": args.seed,
             "flow_steps": args.flow_steps}
    changes: dict[str, Any] = {"backend": args.backend, "max_observation_age_s": args.max_age}
    for key in ("variant", "instruction", "seed", "flow_steps", "context_suffix.vision",
                "context_suffix.llm", "context_suffix.action",
                "context_suffix.action_context", "execution.start",
                "execution.blend"):
        value = given.get(key)
        if value is None and key in golden_settings:
            value = golden_settings[key]
        if value is not None:
            changes[key] = value
    changes.setdefault("variant", "grid_sampler")
    changes.setdefault("seed", 0)  # replay is reproducible by default (the node's -1 is random)
    folders = bundle_parameters(args.bundle_root)
    changes.update(folders)
    overrides = parse_set(args.set or [])
    changes.update(overrides)
    variant = changes["variant"]
    if not changes.get(f"bundle.{variant}"):  # name both variants, not "bundle.<v> is empty"
        held = ", ".join(k.removeprefix("bundle.") for k in folders)
        source = ("--set" if "variant" in overrides else "--variant" if args.variant
                  else "the golden's settings" if "variant" in golden_settings
                  else "replay's default")
        raise MolmoActError(
            f"--bundle-root {args.bundle_root} holds {held}, but this run's variant is "
            f"{variant} (from {source}); give a root or folder that holds {variant}, or "
            f"--variant {next(iter(folders)).removeprefix('bundle.')}")
    if not str(changes.get("instruction") or "").strip():
        raise MolmoActError("no instruction: pass --instruction 'put the bowl on the plate' "
                            "(or --golden with a recorded run)")
    run = {**changes}
    for key in ("flip_images.primary", "flip_images.wrist"):  # the node's default unless set
        run.setdefault(key, "none")
    if "flow_steps" in golden_settings and not run.get("flow_steps"):
        from ..bundle.variants import get_variant

        run["flow_steps"] = get_variant(run["variant"]).default_flow_steps
    return changes, settings_differences(golden_settings, run)


def tolerance_from_args(args: argparse.Namespace, backend: str):
    """The calibrated default of ``backend`` with the limits given on the command line."""
    from ..bundle.comparison import Limits
    from ..replay.chunk_match import default_tolerance

    base = default_tolerance(backend)
    return Limits(*(getattr(base, k) if getattr(args, k, None) is None else getattr(args, k)
                    for k in ("min_cosine", "atol", "rtol", "min_within")))
