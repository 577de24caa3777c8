"""The seed workspace's own end-to-end check: ``golden/step0_boundary.npz`` through
action_context and the flow loop against ``golden/trace.json``'s final actions."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from ..bundle.variants import ACTION_CONTEXT, ACTION_STEP
from ..errors import BundleError
from .status import FAIL, NOT_RUN, PASS

#: The seed's end-to-end check passes when our final-action cosine is within this of the one
#: the reference runtime recorded in trace.json (or reaches the limit below without one).
FINAL_ACTION_MARGIN = 1e-3
FINAL_ACTION_MIN_COSINE = 0.999
SEED_TRACE, SEED_BOUNDARY = "trace.json", "step0_boundary.npz"


# -- the seed workspace -----------------------------------------------------------------------
def seed_conventions(folder: Path):
    """Conventions of a bundle without host/ (the seed workspace): the defaults, with whether
    Euler is inside action_step read off the action_step golden's output name."""
    from ..bundle.conventions import Conventions

    conv = Conventions()
    path = folder / "golden" / "action_step_io.npz"
    if path.is_file():
        with np.load(path, allow_pickle=False) as data:
            if "velocity" in data.files and "next_trajectory" not in data.files:
                return Conventions(**{**conv.__dict__, "euler_in_graph": False})
    return conv


def _first(mapping, names: tuple[str, ...], what: str, path: Path):
    for name in names:
        if name in mapping:
            return mapping[name]
    held = ", ".join(sorted(mapping)) or "nothing"
    raise BundleError(f"{path} has no {what} (looked for {', '.join(names)}); it holds: {held}")


def read_seed_trace(trace_path: Path) -> dict:
    """``golden/trace.json`` of a seed workspace, its numbers checked: ``final_action_cosine``
    (or ``cosine``) a number in [-1, 1], ``flow_steps`` (or ``num_flow_steps``) a count;
    read as ``recorded_cosine`` and ``flow_steps`` (None when absent). Called before the
    report's first section, so a bad file is bad input (exit 2), not a step's traceback."""
    try:
        trace = json.loads(Path(trace_path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BundleError(f"{trace_path} is not readable JSON ({exc})") from None
    if not isinstance(trace, dict):
        raise BundleError(f"{trace_path} holds {type(trace).__name__}, not a JSON object")
    for names, kind, low, high in ((("final_action_cosine", "cosine"), "recorded_cosine",
                                    -1.0, 1.0),
                                   (("flow_steps", "num_flow_steps"), "flow_steps", 1, 10_000)):
        name = next((n for n in names if n in trace), None)
        value = trace.get(name) if name else None
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if kind == "flow_steps" and number and value != int(value):
            number = False
        if value is not None and not (number and math.isfinite(value) and low <= value <= high):
            want = "a number in [-1, 1]" if kind == "recorded_cosine" else "a whole number of steps"
            raise BundleError(f"{trace_path}: {name} is {value!r} ({type(value).__name__}); it "
                              f"must be {want}")
        trace[kind] = None if value is None else (float(value) if kind == "recorded_cosine"
                                                  else int(value))
    return trace


def seed_e2e(pipeline, folder: Path, conventions, variant, limit: float) -> dict:
    """The seed's own end-to-end check: from ``step0_boundary.npz`` (the action expert's inputs
    at the first step) through action_context and the whole flow loop on this runtime, the
    final actions against ``trace.json``'s, and our cosine against the reference runtime's."""
    from ..bundle.golden import compare, load_npz
    from ..host.flow import run_flow

    golden = folder / "golden"
    trace_path, boundary_path = golden / SEED_TRACE, golden / SEED_BOUNDARY
    missing = [p.name for p in (trace_path, boundary_path) if not p.is_file()]
    if missing:
        return {"status": NOT_RUN, "why": f"no golden/{' or golden/'.join(missing)} (the seed "
                "workspace's end-to-end check)"}
    trace = read_seed_trace(trace_path)
    final = np.asarray(_first(trace, ("final_action", "final_actions", "actions_normalized"),
                              "final action", trace_path), np.float32)
    steps = trace["flow_steps"] or variant.default_flow_steps
    recorded = trace["recorded_cosine"]
    boundary = load_npz(boundary_path, what="the seed's end-to-end check")
    noise = _first(boundary, ("noise", "x0", "trajectory"), "initial noise", boundary_path)
    enc = _first(boundary, ("encoder_attention_mask",), "encoder mask", boundary_path)
    pad = boundary.get("action_dim_is_pad")
    if pad is None:
        from ..host.prompt import action_dim_is_pad

        pad = action_dim_is_pad(variant.action_dim, variant.max_action_dim)
    if "k_ctx" in boundary and "v_ctx" in boundary:
        ctx = {"k_ctx": boundary["k_ctx"], "v_ctx": boundary["v_ctx"]}
    else:
        keys = _first(boundary, ("keys",), "keys (or k_ctx)", boundary_path)
        values = _first(boundary, ("values",), "values (or v_ctx)", boundary_path)
        ctx = pipeline.run_component(ACTION_CONTEXT, {"keys": keys, "values": values})
    out = "next_trajectory" if conventions.euler_in_graph else "velocity"
    pad = np.asarray(pad, np.float32).reshape(1, -1)

    def step(x: np.ndarray, t: np.ndarray) -> np.ndarray:
        feeds = {"trajectory": x, "timestep": t, "k_ctx": ctx["k_ctx"], "v_ctx": ctx["v_ctx"],
                 "encoder_attention_mask": enc, "action_dim_is_pad": pad}
        return np.asarray(pipeline.run_component(ACTION_STEP, feeds)[out], np.float32)

    x = run_flow(step, np.asarray(noise, np.float32).reshape(1, variant.horizon, -1), pad,
                 steps, conventions)
    actions = x[0, :, : final.shape[-1]]
    row = compare("seed e2e", "final action", actions, final, min_cosine=limit)
    threshold = limit if recorded is None else min(limit, float(recorded) - FINAL_ACTION_MARGIN)
    passed = bool(math.isfinite(row.cosine) and row.cosine >= threshold)
    return {"status": PASS if passed else FAIL, "cosine": row.cosine, "max_abs": row.max_abs,
            "reference_cosine": None if recorded is None else float(recorded),
            "threshold": threshold, "flow_steps": steps, "note": row.note}

