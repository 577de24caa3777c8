"""Golden files and parity: per-component I/O replay and the end-to-end trace.

Metrics per tensor: cosine similarity, max-abs error and the fraction within
``|a − b| <= atol + rtol·|b|``. A row passes when cosine >= ``min_cosine`` (and, for integer
tensors such as input ids, when they are equal).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import GoldenError
from .variants import COMPONENTS

DEFAULT_MIN_COSINE = 0.9999
DEFAULT_ATOL = 1e-3
DEFAULT_RTOL = 1e-2
TRACE_FILES = ("e2e_trace.npz", "e2e_trace_alt.npz")

Runner = Callable[[str, Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


def load_npz(path: Path, required: Iterable[str] = (), *, what: str = "") -> dict[str, np.ndarray]:
    """Load a golden npz (never pickles) and check that ``required`` keys are present."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise GoldenError(f"golden file {path} is missing") from None
    except ValueError as exc:
        raise GoldenError(f"{path} holds object arrays or is corrupt ({exc}); it cannot be "
                          "loaded without pickle, which parity refuses") from None
    except Exception as exc:  # zipfile.BadZipFile, EOFError on truncated files
        raise GoldenError(f"{path} is not a readable .npz ({type(exc).__name__}: {exc})") from None
    missing = [k for k in required if k not in arrays]
    if missing:
        held = ", ".join(f"{k}{list(v.shape)}" for k, v in arrays.items()) or "nothing"
        raise GoldenError(
            f"{path} lacks {missing} needed for {what or 'parity'}; it holds: {held}"
        )
    return arrays


@dataclass(frozen=True)
class ParityRow:
    """One compared tensor."""

    stage: str
    tensor: str
    shape: tuple[int, ...]
    cosine: float
    max_abs: float
    within_tol: float
    passed: bool
    note: str = ""


def compare(
    stage: str,
    tensor: str,
    got: np.ndarray,
    want: np.ndarray,
    *,
    min_cosine: float = DEFAULT_MIN_COSINE,
    atol: float = DEFAULT_ATOL,
    rtol: float = DEFAULT_RTOL,
) -> ParityRow:
    """Compare two arrays; a shape mismatch is a failing row, not an exception."""
    got = np.asarray(got)
    want = np.asarray(want)
    if got.size != want.size:
        return ParityRow(stage, tensor, tuple(want.shape), float("nan"), float("inf"), 0.0,
                         False, f"shape {list(got.shape)} vs golden {list(want.shape)}")
    exact = np.issubdtype(want.dtype, np.integer) or want.dtype == bool
    a = got.reshape(-1).astype(np.float64)
    b = want.reshape(-1).astype(np.float64)
    if not np.all(np.isfinite(a)):
        return ParityRow(stage, tensor, tuple(want.shape), float("nan"), float("inf"), 0.0,
                         False, "output has NaN/inf")
    diff = np.abs(a - b)
    max_abs = float(diff.max()) if diff.size else 0.0
    within = float(np.mean(diff <= atol + rtol * np.abs(b))) if diff.size else 1.0
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0.0 and nb == 0.0:
        cos = 1.0
    elif na == 0.0 or nb == 0.0:
        cos = 0.0
    else:
        cos = float(np.dot(a, b) / (na * nb))
    passed = max_abs == 0.0 if exact else cos >= min_cosine
    return ParityRow(stage, tensor, tuple(want.shape), cos, max_abs, within, passed)


def component_parity(
    bundle_golden: Path,
    run: Runner,
    contracts: Mapping,
    *,
    components: Iterable[str] = COMPONENTS,
    **tolerances,
) -> list[ParityRow]:
    """Feed each session its golden inputs and compare every golden output."""
    rows = []
    for component in components:
        contract = contracts[component]
        names_in = [s.name for s in contract.inputs]
        names_out = [s.name for s in contract.outputs]
        data = load_npz(
            Path(bundle_golden) / f"{component}_io.npz",
            names_in + names_out,
            what=f"{component} parity",
        )
        outputs = run(component, {k: data[k] for k in names_in})
        for name in names_out:
            if name not in outputs:
                rows.append(ParityRow(component, name, tuple(data[name].shape), float("nan"),
                                      float("inf"), 0.0, False, "session returned no such output"))
                continue
            rows.append(compare(component, name, outputs[name], data[name], **tolerances))
    return rows


TRACE_INPUTS = ("image_primary", "image_wrist", "state", "instruction", "flow_steps", "noise")
TRACE_CHECKS = (
    "pixel_values",
    "input_ids",
    "attention_bias",
    "encoder_attention_mask",
    "hidden_states",
    "actions_normalized",
    "chunk",
)


def format_table(rows: Iterable[ParityRow]) -> str:
    """A fixed-width parity table."""
    lines = [
        f"{'stage':<26} {'tensor':<24} {'shape':<22} {'cosine':>10} {'max_abs':>10} "
        f"{'in_tol':>7}  result"
    ]
    for r in rows:
        shape = "x".join(str(d) for d in r.shape)
        verdict = "PASS" if r.passed else "FAIL"
        note = f"  {r.note}" if r.note else ""
        lines.append(
            f"{r.stage:<26} {r.tensor:<24} {shape:<22} {r.cosine:>10.6f} {r.max_abs:>10.3g} "
            f"{r.within_tol:>7.3f}  {verdict}{note}"
        )
    return "\n".join(lines)
