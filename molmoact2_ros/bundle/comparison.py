"""The one comparison every check uses: ``parity``, ``device-report``, ``replay --golden``,
``compare``, the replay checker node and ``make demo``.

A tensor (or chunk) matches its golden only when BOTH hold:

* cosine similarity >= ``min_cosine``, and
* the fraction of elements with ``|got − golden| <= atol + rtol·|golden|`` is >= ``min_within``.

Cosine alone cannot see a scale error (a golden times 1.05 has cosine 1.0); the within
fraction can. Limits are set per component and precision (``PARITY_DEFAULTS``), and a bundle
may carry its own for known cases in ``golden/tolerances.json`` (``ToleranceTable``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from ..errors import BundleError
from .schema import Field, check_fields, read_json_object
from .variants import COMPONENTS

TOLERANCES_FILE = "tolerances.json"
TOLERANCES_FORMAT = "molmoact2_tolerances.v1"
#: precisions a limit is set for: ONNX Runtime float32, HTP fp16 contexts, quantised contexts
PRECISIONS = ("fp32", "fp16", "w4a16")
#: the end-to-end trace rows (host glue + every session) are looked up under this name
E2E = "e2e"


@dataclass(frozen=True)
class Limits:
    """When a tensor matches: cosine >= ``min_cosine`` and at least ``min_within`` of its
    values within ``atol + rtol·|golden|``. ``atol`` may be one value per last-axis index
    (per action dimension, e.g. in normalised units)."""

    min_cosine: float
    atol: float | tuple[float, ...]
    rtol: float
    min_within: float

    def atol_for(self, shape: tuple[int, ...]) -> np.ndarray | float:
        """``atol`` broadcast over the last axis of ``shape`` (one per dimension)."""
        if isinstance(self.atol, (int, float)):
            return float(self.atol)
        values = np.asarray(self.atol, np.float64)
        if not shape or shape[-1] != values.size:
            raise ValueError(f"{values.size} per-dimension atol values for a tensor of shape "
                             f"{list(shape)}")
        return values

    def describe(self) -> str:
        atol = (self.atol if isinstance(self.atol, (int, float))
                else "[" + ", ".join(f"{a:g}" for a in self.atol) + "]")
        return (f"cosine >= {self.min_cosine:g} and >= {self.min_within:.0%} within "
                f"{atol} + {self.rtol:g}*|golden|")

    def to_json(self) -> dict:
        atol = self.atol if isinstance(self.atol, (int, float)) else list(self.atol)
        return {"min_cosine": self.min_cosine, "atol": atol, "rtol": self.rtol,
                "min_within": self.min_within}


@dataclass(frozen=True)
class Measure:
    """Metrics of one comparison and the criteria it failed (empty when it passed)."""

    cosine: float
    max_abs: float
    within: float
    worst: tuple[int, ...]
    failed: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return not self.failed

    @property
    def reason(self) -> str:
        return "; ".join(self.failed)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    if na == 0.0 and nb == 0.0:
        return 1.0
    if na == 0.0 or nb == 0.0:
        return 0.0
    return float(np.vdot(a, b) / (na * nb))


def measure(got, want, limits: Limits, *, exact: bool | None = None) -> Measure:
    """Compare ``got`` with the golden ``want`` under ``limits``.

    Integer and boolean goldens (input ids, masks) must be equal (``exact``). A shape
    mismatch or a NaN/inf is a failed comparison, never an exception.
    """
    a = np.asarray(got)
    b = np.asarray(want)
    if exact is None:
        exact = bool(np.issubdtype(b.dtype, np.integer) or b.dtype == bool)
    if a.shape != b.shape and a.size != b.size:
        return Measure(float("nan"), float("inf"), 0.0, (),
                       (f"shape {list(a.shape)} vs golden {list(b.shape)}",))
    a = a.reshape(b.shape).astype(np.float64)
    b = b.astype(np.float64)
    if not np.all(np.isfinite(a)):
        return Measure(float("nan"), float("inf"), 0.0, (), ("output has NaN/inf",))
    diff = np.abs(a - b)
    if diff.size == 0:
        return Measure(1.0, 0.0, 1.0, ())
    worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(diff)), diff.shape))
    max_abs = float(diff.max())
    cos = cosine(a.reshape(-1), b.reshape(-1))
    if exact:
        within = float(np.mean(diff == 0))
        failed = () if max_abs == 0.0 else (f"values differ ({1 - within:.1%} of them); "
                                            "integers must be equal",)
        return Measure(cos, max_abs, within, worst, failed)
    within = float(np.mean(diff <= limits.atol_for(b.shape) + limits.rtol * np.abs(b)))
    failed = []
    if not cos >= limits.min_cosine:
        failed.append(f"cosine {cos:.6f} < {limits.min_cosine:g}")
    if not within >= limits.min_within:
        failed.append(f"within {within:.1%} < {limits.min_within:.1%} "
                      f"(|run - golden| <= atol + {limits.rtol:g}*|golden|)")
    return Measure(cos, max_abs, within, worst, tuple(failed))


# -- parity limits per component and precision -------------------------------------------------
#: ONNX Runtime float32 against a float32 golden: every element within 1e-3 + 1e-2·|golden|.
FP32 = Limits(min_cosine=0.9999, atol=1e-3, rtol=1e-2, min_within=1.0)
#: fp16 contexts (HTP) against a float32 golden: fp16 carries ~3 decimal digits.
FP16 = Limits(min_cosine=0.9999, atol=5e-3, rtol=2e-2, min_within=0.99)
#: weight-quantised contexts (any suffix): looser, and a bundle should state its own.
W4A16 = Limits(min_cosine=0.999, atol=2e-2, rtol=5e-2, min_within=0.95)
PARITY_DEFAULTS: dict[str, Limits] = {"fp32": FP32, "fp16": FP16, "w4a16": W4A16}


def precision_of(backend: str, suffix: str = "") -> str:
    """``fp32`` on ONNX Runtime; on the HTP ``fp16``, or the context suffix's name
    (``_w4a16`` → ``w4a16``)."""
    if backend != "htp":
        return "fp32"
    return suffix.lstrip("_") if suffix else "fp16"


@dataclass(frozen=True)
class LimitRow:
    """One row of ``golden/tolerances.json``: limits for a component (and optionally one
    tensor) at one precision, with why they differ from the defaults."""

    component: str
    precision: str
    limits: Limits
    tensor: str = ""
    why: str = ""


@dataclass(frozen=True)
class ToleranceTable:
    """Parity limits per (component, precision[, tensor]): the bundle's rows, else defaults."""

    rows: tuple[LimitRow, ...] = ()
    source: str = ""
    defaults: Mapping[str, Limits] = field(default_factory=lambda: dict(PARITY_DEFAULTS))

    def limits(self, component: str, precision: str, tensor: str = "") -> Limits:
        """The most specific row (tensor, then component) or the precision's default."""
        for row in self.rows:
            if (row.component, row.precision, row.tensor) == (component, precision, tensor):
                return row.limits
        for row in self.rows:
            if (row.component, row.precision, row.tensor) == (component, precision, ""):
                return row.limits
        return self.defaults.get(precision, self.defaults["w4a16"])  # another quantisation

    def override(self, **changes) -> ToleranceTable:
        """Every limit with ``changes`` applied (``--min-cosine`` on the command line)."""
        changes = {k: v for k, v in changes.items() if v is not None}
        if not changes:
            return self
        return ToleranceTable(
            tuple(replace(r, limits=replace(r.limits, **changes)) for r in self.rows),
            self.source, {k: replace(v, **changes) for k, v in self.defaults.items()})


_LIMIT_FIELDS = (
    Field("component", str, required=True, choices=(*COMPONENTS, E2E)),
    Field("precision", str, required=True),
    Field("tensor", str),
    Field("min_cosine", float),
    Field("atol", float, minimum=0.0),
    Field("rtol", float, minimum=0.0),
    Field("min_within", float, minimum=0.0),
    Field("why", str),
)


def _check_applies(path: Path, where: str, values: dict) -> None:
    """A row must be able to apply: its precision is fp32, fp16 or the suffix of contexts the
    bundle holds (``ctx/<component>_<precision>_socid...``), and its tensor one its
    component's golden holds (a row that never applies would be silently ignored)."""
    precision, folder = values["precision"], Path(path).parent
    ctx = folder.parent / "ctx"
    known = set(PRECISIONS)
    for p in ctx.glob("*_socid*") if ctx.is_dir() else ():
        base = p.name.split("_socid")[0]
        component = max((c for c in COMPONENTS if base.startswith(c)), key=len, default=base)
        if base[len(component):].lstrip("_"):
            known.add(base[len(component):].lstrip("_"))
    if precision not in known:
        raise BundleError(f"{path}: {where}precision is {precision!r}; it applies to none of "
                          f"this bundle's contexts: use fp32, fp16 or a context suffix "
                          f"({', '.join(sorted(known))})")
    tensor = values.get("tensor")
    if not tensor:
        return
    component = values["component"]
    pattern = "e2e_trace*.npz" if component == E2E else f"{component}_io.npz"
    held: set[str] = set()
    for npz in sorted(folder.glob(pattern)):
        try:
            with np.load(npz, allow_pickle=False) as data:
                held.update(data.files)
        except (OSError, ValueError):
            continue  # an unreadable golden is reported where it is read
    if held and tensor not in held:
        raise BundleError(f"{path}: {where}tensor {tensor!r} is in no {component} golden "
                          f"({pattern}); it holds {', '.join(sorted(held))}")


def load_tolerances(golden_dir: Path) -> ToleranceTable:
    """``golden/tolerances.json`` if the bundle has one (checked field by field), else the
    defaults. Every row must say ``why`` its limits differ."""
    path = Path(golden_dir) / TOLERANCES_FILE
    if not path.is_file():
        return ToleranceTable()
    data = read_json_object(path, "golden/tolerances.json (see docs/bundle_format.md)")
    top = check_fields(path, data, (Field("format", str, required=True,
                                          choices=(TOLERANCES_FORMAT,)),
                                    Field("limits", list, required=True)),
                       allow_unknown=False)
    rows = []
    for i, item in enumerate(top["limits"]):
        where = f"limits[{i}]: "
        if not isinstance(item, dict):
            raise BundleError(f"{path}: {where}each limit is an object")
        values = check_fields(path, item, _LIMIT_FIELDS, where=where, allow_unknown=False)
        if not values.get("why"):
            raise BundleError(f"{path}: {where}why is missing; say why this component needs "
                              "other limits (e.g. 'vision measured at 0.9984 on CPU')")
        for name in ("min_cosine", "min_within"):
            if name in values and not 0.0 < values[name] <= 1.0:
                raise BundleError(f"{path}: {where}{name} is {values[name]}; it must be in "
                                  "(0, 1]")
        _check_applies(path, where, values)
        base = PARITY_DEFAULTS.get(values["precision"], W4A16)
        limits = replace(base, **{k: values[k] for k in ("min_cosine", "atol", "rtol",
                                                         "min_within") if k in values})
        rows.append(LimitRow(values["component"], values["precision"], limits,
                             values.get("tensor", ""), values["why"]))
    return ToleranceTable(tuple(rows), str(path))
