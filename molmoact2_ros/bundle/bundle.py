"""Bundle layout: the one place that knows where a variant's files live, and checks them.

```
<bundle>/bundle.json                 optional manifest {"variant": ...}
<bundle>/ctx/{component}{suffix}_socid77_archv73.bin    HTP context binaries
<bundle>/onnx/<component dir>[suffix]/*.onnx            per-component ONNX graphs
<bundle>/golden/<component>_io.npz, e2e_trace*.npz      parity data
<bundle>/norm_stats.json (or golden/norm_stats.json)
<bundle>/host/tokenizer.json, embeddings.npy, prompt.json, conventions.json
<bundle>/qnn_libs/, dsp_libs/        optional QNN runtime / DSP skel (the seed workspace's)
```
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import BundleError
from .conventions import Conventions
from .normstats import NormStats
from .schema import check_manifest, read_json_object
from .variants import (
    COMPONENTS,
    SUFFIX_GROUPS,
    VARIANTS,
    VariantSpec,
    download_hint,
    get_variant,
)

HOST_FILES = ("tokenizer.json", "embeddings.npy", "prompt.json", "conventions.json")
#: Smallest size a real context binary can have; anything smaller is a truncated download.
MIN_CONTEXT_BYTES = 4096


@dataclass(frozen=True)
class Suffixes:
    """Context suffix per component group: "" (fp16) or e.g. "_w4a16"."""

    vision: str = ""
    llm: str = ""
    action: str = ""  # action_step only, as the reference runtime's ACTION_CTX_SUFFIX
    action_context: str = ""  # "" (fp16) unless a quantised action_context is named

    def for_component(self, component: str) -> str:
        """The suffix ``component`` loads with."""
        for group, members in SUFFIX_GROUPS.items():
            if component in members:
                return getattr(self, group)
        if component in COMPONENTS:
            return ""
        raise BundleError(f"unknown component {component!r}")

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, str]) -> Suffixes:
        unknown = set(mapping) - set(SUFFIX_GROUPS)
        if unknown:
            raise BundleError(
                f"unknown context_suffix groups {sorted(unknown)}; use {sorted(SUFFIX_GROUPS)}"
            )
        for group, suffix in mapping.items():
            if suffix and (not suffix.startswith("_") or "/" in suffix or ".." in suffix):
                raise BundleError(
                    f"context_suffix.{group}={suffix!r} is not a suffix like '_w4a16' or ''"
                )
        return cls(**mapping)


@dataclass
class Bundle:
    """A bundle folder for one variant."""

    root: Path
    variant: VariantSpec
    manifest: dict = field(default_factory=dict)

    @classmethod
    def open(cls, root: Path | str, variant: str | None = None) -> Bundle:
        """Open a variant folder, or the ``variant`` folder below a root (``resolve_bundle``)."""
        name, folder = resolve_bundle(root, variant)
        manifest: dict = {}
        manifest_path = folder / "bundle.json"
        if manifest_path.is_file():
            manifest = read_json_object(manifest_path, "bundle.json")
            check_manifest(manifest_path, manifest, tuple(VARIANTS))
        return cls(root=folder, variant=get_variant(name), manifest=manifest)

    # -- paths ------------------------------------------------------------------------------
    def context_path(self, component: str, suffix: str = "") -> Path:
        return self.root / "ctx" / self.variant.context_file(component, suffix)

    def onnx_path(self, component: str, suffix: str = "") -> Path:
        folder = self.root / "onnx" / (self.variant.onnx_dir(component) + suffix)
        preferred = folder / "model.onnx"
        if preferred.is_file():
            return preferred
        graphs = sorted(folder.glob("*.onnx")) if folder.is_dir() else []
        if len(graphs) == 1:
            return graphs[0]
        if not graphs:
            hint = (
                " (quantised sets ship as HTP contexts only: use backend htp, or suffix '')"
                if suffix
                else ""
            )
            raise BundleError(f"{component}: no ONNX graph in {folder}{hint}")
        raise BundleError(
            f"{component}: {folder} holds several graphs ({[g.name for g in graphs]}); "
            "keep one or name it model.onnx"
        )

    def golden_path(self, name: str) -> Path:
        return self.root / "golden" / name

    def host_path(self, name: str) -> Path:
        return self.root / "host" / name

    def library_dir(self, name: str) -> str:
        """``qnn_libs``/``dsp_libs`` of a bundle laid out like the seed workspace, else ""."""
        folder = self.root / name
        return str(folder) if folder.is_dir() else ""

    @property
    def norm_stats_path(self) -> Path:
        for candidate in (self.root / "norm_stats.json", self.root / "golden" / "norm_stats.json"):
            if candidate.is_file():
                return candidate
        return self.root / "norm_stats.json"

    # -- loading ------------------------------------------------------------------------------
    def conventions(self) -> Conventions:
        return Conventions.from_json(self.host_path("conventions.json"))

    def norm_stats(self) -> NormStats:
        v = self.variant
        return NormStats.from_json(
            self.norm_stats_path, action_dim=v.action_dim, state_dim=v.state_dim,
            horizon=v.horizon,
        )

    def check(self, backend: str = "onnx", suffixes: Suffixes | None = None) -> None:
        """Fail early, listing every missing or truncated file with its fix."""
        suffixes = suffixes or Suffixes()
        problems = []
        for name in HOST_FILES:
            path = self.host_path(name)
            if not path.is_file() or path.stat().st_size == 0:
                problems.append(f"{path} is missing or empty")
        if not self.norm_stats_path.is_file():
            problems.append(f"{self.norm_stats_path} is missing")
        if backend == "htp":
            problems += self.context_problems(suffixes)
        else:
            problems += self.onnx_problems(suffixes)
        self._raise(problems, backend)

    def onnx_problems(self, suffixes: Suffixes) -> list[str]:
        """Missing or empty ONNX graphs for these suffixes."""
        problems = []
        for component in COMPONENTS:
            try:
                path = self.onnx_path(component, suffixes.for_component(component))
            except BundleError as exc:
                problems.append(str(exc))
                continue
            if path.stat().st_size == 0:
                problems.append(f"{path} is empty (truncated download)")
        return problems

    def context_problems(self, suffixes: Suffixes) -> list[str]:
        """Missing or truncated context binaries for these suffixes."""
        problems = []
        for component in COMPONENTS:
            path = self.context_path(component, suffixes.for_component(component))
            if not path.is_file():
                problems.append(f"{path} is missing")
            elif path.stat().st_size < MIN_CONTEXT_BYTES:
                problems.append(f"{path} is only {path.stat().st_size} bytes (truncated)")
        return problems

    def check_contexts(self, suffixes: Suffixes | None = None) -> None:
        """Only the context binaries (what the resident runtime itself needs)."""
        self._raise(self.context_problems(suffixes or Suffixes()), "htp")

    def _raise(self, problems: list[str], backend: str) -> None:
        if problems:
            raise BundleError(
                f"bundle {self.root} ({self.variant.name}, backend {backend}) is incomplete:\n  - "
                + "\n  - ".join(problems)
                + f"\n{download_hint(self.variant.name)}, or rebuild it (molmoact2 "
                "tiny-bundle for tests)"
            )


#: Entries that mark a folder as one variant's bundle (rather than a root of variant folders).
_BUNDLE_MARKERS = ("bundle.json", "ctx", "onnx", "golden", "host")


def _declared_variant(folder: Path) -> str | None:
    """The variant ``folder/bundle.json`` names (checked against its schema), if any."""
    manifest = folder / "bundle.json"
    if not manifest.is_file():
        return None
    data = read_json_object(manifest, "bundle.json")
    return check_manifest(manifest, data, tuple(VARIANTS)).get("variant")


def resolve_bundles(path: Path | str, variant: str | None = None) -> list[tuple[str, Path]]:
    """``(variant, folder)`` pairs for a bundle folder or a root of per-variant folders.

    Every command and the node resolve bundle paths here, so a variant folder, a root
    (``<root>/<variant>/``), a missing path and an empty folder mean the same everywhere.
    """
    if variant is not None:
        get_variant(variant)  # an unknown name is reported with the valid ones
    if not str(path).strip():
        raise BundleError("no bundle path given; set it to a bundle folder or a root of "
                          "variant folders")
    folder = Path(path).expanduser()
    if not folder.exists():
        raise BundleError(f"bundle path {folder} does not exist; build one with "
                          f"'molmoact2 tiny-bundle DIR' or {download_hint(variant, 'one')}")
    if not folder.is_dir():
        raise BundleError(f"bundle path {folder} is a file; give the bundle folder")
    if any((folder / marker).exists() for marker in _BUNDLE_MARKERS):
        declared = _declared_variant(folder)
        if variant is None and declared is None:
            raise BundleError(f"{folder} has no bundle.json naming its variant; add --variant "
                              f"(one of {', '.join(VARIANTS)})")
        if variant is not None and declared is not None and variant != declared:
            raise BundleError(f"{folder} holds variant {declared!r}, not {variant!r}; give "
                              f"the {variant} folder (the node's bundle.{variant}, or a "
                              "command's BUNDLE) or leave the variant out")
        return [(variant or declared, folder.resolve())]
    present = [v for v in VARIANTS if (folder / v).is_dir()]
    if variant is not None:
        if variant not in present:
            found = f"it has {', '.join(present)}" if present else "it has no variant folders"
            raise BundleError(f"{folder} holds no {variant} bundle (no {variant}/ folder; "
                              f"{found})")
        present = [variant]
    if not present:
        raise BundleError(f"{folder} holds no bundle: no bundle.json, ctx/, onnx/, golden/ or "
                          f"host/, and no variant folder ({', '.join(VARIANTS)})")
    return [(name, (folder / name).resolve()) for name in present]


def resolve_bundle(path: Path | str, variant: str | None = None) -> tuple[str, Path]:
    """Exactly one ``(variant, folder)``; a root with several variants needs ``variant``."""
    found = resolve_bundles(path, variant)
    if len(found) > 1:
        raise BundleError(f"{path} holds {len(found)} variants ({', '.join(n for n, _ in found)})"
                          "; choose one with --variant")
    return found[0]


def bundle_parameters(path: Path | str) -> dict[str, str]:
    """``bundle.<variant>`` parameter values for a root of variant folders or one variant's
    folder (replay's ``--bundle-root``, the launch file's ``bundle_root``)."""
    return {f"bundle.{name}": str(folder) for name, folder in resolve_bundles(path)}
