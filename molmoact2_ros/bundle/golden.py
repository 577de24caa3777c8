"""Golden files and parity: per-component I/O replay and the end-to-end trace.

Every row is judged by ``comparison.measure``: it passes only when its cosine similarity AND
the fraction of elements within ``|a − b| <= atol + rtol·|golden|`` reach the limits of its
component and precision (integer tensors such as input ids must be equal). A failing row
names the criterion it failed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import GoldenError
from .comparison import E2E, FP32, Limits, ToleranceTable, measure
from .variants import COMPONENTS

DEFAULT_MIN_COSINE = FP32.min_cosine
DEFAULT_ATOL = FP32.atol
DEFAULT_RTOL = FP32.rtol
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
    """One compared tensor; ``failed`` names the criteria it failed ("" when it passed)."""

    stage: str
    tensor: str
    shape: tuple[int, ...]
    cosine: float
    max_abs: float
    within_tol: float
    passed: bool
    note: str = ""
    failed: str = ""
    limits: Limits | None = None


def compare(
    stage: str,
    tensor: str,
    got: np.ndarray,
    want: np.ndarray,
    *,
    limits: Limits | None = None,
    min_cosine: float | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    min_within: float | None = None,
) -> ParityRow:
    """Compare two arrays under ``limits`` (default: float32 parity), single limits replaced
    by the keyword arguments; a shape mismatch is a failing row, not an exception."""
    base = limits or FP32
    given = {"min_cosine": min_cosine, "atol": atol, "rtol": rtol, "min_within": min_within}
    lim = Limits(**{k: getattr(base, k) if v is None else v for k, v in given.items()})
    m = measure(got, want, lim)
    want = np.asarray(want)
    note = m.reason if m.failed and not np.isfinite(m.cosine) else ""
    return ParityRow(stage, tensor, tuple(want.shape), m.cosine, m.max_abs, m.within,
                     m.passed, note, m.reason, lim)


def component_parity(
    bundle_golden: Path,
    run: Runner,
    contracts: Mapping,
    *,
    components: Iterable[str] = COMPONENTS,
    table: ToleranceTable | None = None,
    precision: Callable[[str], str] | str = "fp32",
    **overrides,
) -> list[ParityRow]:
    """Feed each session its golden inputs and compare every golden output under the limits
    of its component and precision (``precision``: one for all, or per component)."""
    table = (table or ToleranceTable()).override(**overrides)
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
        prec = precision if isinstance(precision, str) else precision(component)
        for name in names_out:
            if name not in outputs:
                rows.append(ParityRow(component, name, tuple(data[name].shape), float("nan"),
                                      float("inf"), 0.0, False, "session returned no such output",
                                      "session returned no such output"))
                continue
            rows.append(compare(component, name, outputs[name], data[name],
                                limits=table.limits(component, prec, name)))
    return rows


def e2e_limits(table: ToleranceTable | None, precision: str, tensor: str) -> Limits:
    """Limits of one end-to-end trace row (component ``e2e``)."""
    return (table or ToleranceTable()).limits(E2E, precision, tensor)


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


#: A bias value at or below this is "masked" (softmax gives it weight 0 in float32 and fp16).
MASKED_AT = -1e4


def bias_for_comparison(run: np.ndarray, golden: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A golden bias filled below fp16's range (the model's ``finfo(float32).min``) is
    compared as its masked pattern: where each side masks (<= -1e4) must agree."""
    golden = np.asarray(golden)
    if golden.size == 0 or float(golden.min()) >= -65504.0:
        return np.asarray(run), golden
    return ((np.asarray(run) <= MASKED_AT).astype(np.int64),
            (golden <= MASKED_AT).astype(np.int64))


def format_table(rows: Iterable[ParityRow]) -> str:
    """A fixed-width parity table."""
    lines = [
        f"{'stage':<26} {'tensor':<24} {'shape':<22} {'cosine':>10} {'max_abs':>10} "
        f"{'in_tol':>7}  result"
    ]
    for r in rows:
        shape = "x".join(str(d) for d in r.shape)
        verdict = "PASS" if r.passed else "FAIL"
        note = f"  {r.failed or r.note}" if (r.failed or r.note) else ""
        lines.append(
            f"{r.stage:<26} {r.tensor:<24} {shape:<22} {r.cosine:>10.6f} {r.max_abs:>10.3g} "
            f"{r.within_tol:>7.3f}  {verdict}{note}"
        )
    return "\n".join(lines)
