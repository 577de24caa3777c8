"""Doctor's bundle checks: every context file, then, in spawned workers as the node runs them,
each context's load and contract, golden parity through the HTP backend and per-component
latency; ``run_checks`` is every check in order, the machine's first."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from ..bundle.variants import COMPONENTS
from ..errors import MolmoActError
from .machine import Check, check_dsp_arch, machine_checks, probe_qai_appbuilder
from .status import FAIL, PASS, SKIP


# -- bundle ----------------------------------------------------------------------------------
def check_context_files(bundle, suffixes) -> Iterator[Check]:
    from ..bundle.bundle import MIN_CONTEXT_BYTES
    from ..bundle.variants import download_hint

    for component in COMPONENTS:
        path = bundle.context_path(component, suffixes.for_component(component))
        name = f"context {component}"
        if not path.is_file():
            yield Check(name, FAIL, f"{path} is missing",
                        f"{download_hint(bundle.variant.name, 'its ctx/ folder')}, or choose "
                        "a suffix it ships")
        elif path.stat().st_size < MIN_CONTEXT_BYTES:
            yield Check(name, FAIL, f"{path.name} is {path.stat().st_size} bytes (truncated)",
                        download_hint(bundle.variant.name, "the file"))
        else:
            yield Check(name, PASS, f"{path.name} ({path.stat().st_size / 2**20:.1f} MiB)")


def _describe(infos) -> str:
    return ", ".join(f"{i.name}{list(i.shape)} {i.dtype}" for i in infos)


def check_host_files(bundle) -> Check:
    """host/ (tokenizer, embeddings, prompt, conventions): a seed workspace has none, and
    without it the node cannot build a prompt (the contexts still load on the defaults)."""
    from ..bundle.bundle import HOST_FILES

    missing = [n for n in HOST_FILES if not bundle.host_path(n).is_file()]
    if not missing:
        return Check("host assets", PASS, f"{bundle.root / 'host'}: {', '.join(HOST_FILES)}")
    from ..bundle.variants import HOST_CHECKPOINTS

    repo = HOST_CHECKPOINTS.get(bundle.variant.name)
    where = (f"(hf download {repo} --local-dir CHECKPOINT)" if repo else
             "(the checkpoint this variant was exported from is not published: its bundle "
             "names a MolmoAct2-LIBERO-ViT10L base; docs/iq9075.md)")
    return Check("host assets", FAIL, f"{bundle.root / 'host'} lacks {', '.join(missing)}",
                 f"molmoact2 export-host CHECKPOINT {bundle.root} writes host/ from the Hugging "
                 f"Face checkpoint {where}; molmoact2 conventions {bundle.root} --write writes "
                 "conventions.json alone from the goldens")


def check_pipeline(bundle, suffixes, timeout_s: float, repeats: int,
                   ignore_bundle_libs: bool = False) -> Iterator[Check]:
    """Load every context in spawned workers, check contracts, parity and latency."""
    from ..bundle.comparison import load_tolerances, precision_of
    from ..bundle.golden import component_parity
    from ..runtime.htp_backend import ResidentPipeline
    from .seed import seed_conventions

    conventions = bundle.conventions() if bundle.host_path("conventions.json").is_file() \
        else seed_conventions(bundle.root)
    try:
        pipeline = ResidentPipeline.open(
            bundle, suffixes, conventions=conventions, call_timeout_s=timeout_s,
            start_timeout_s=max(timeout_s, 300.0), bundle_libs=not ignore_bundle_libs,
        )
    except MolmoActError as exc:
        yield Check("contexts load", FAIL, str(exc),
                    "run with the QNN log (log_level INFO) and check the QAIRT version the "
                    "contexts were built with against the QNN runtime line above")
        return
    with pipeline:
        for component, (inputs, outputs) in pipeline.declared.items():
            yield Check(f"load {component}", PASS,
                        f"in {_describe(inputs)} -> out {_describe(outputs)}")
        yield Check("contracts", PASS, f"seven sessions chain ({dict(pipeline.geometry.dims)})")
        golden = [c for c in COMPONENTS if bundle.golden_path(f"{c}_io.npz").is_file()]
        if golden:
            rows = component_parity(
                bundle.root / "golden", pipeline.run_component, pipeline.contracts,
                components=golden, table=load_tolerances(bundle.root / "golden"),
                precision=lambda c: precision_of("htp", suffixes.for_component(c)))
            bad = [r for r in rows if not r.passed]
            worst = min(r.cosine for r in rows)
            if bad:
                listed = ", ".join(f"{r.stage}.{r.tensor} ({r.failed})" for r in bad)
                yield Check("golden parity", FAIL, f"{len(bad)}/{len(rows)} rows fail: {listed}",
                            "the contexts do not compute what the goldens recorded: wrong "
                            "suffix or conventions, or a bad compile")
            else:
                yield Check("golden parity", PASS,
                            f"{len(rows)} rows over {len(golden)} components, min cosine "
                            f"{worst:.6f}")
        else:
            yield Check("golden parity", SKIP, "no golden/<component>_io.npz in the bundle")
        yield _latency(pipeline, bundle.variant, repeats)


def _latency(pipeline, variant, repeats: int) -> Check:
    x0 = np.zeros((1, variant.horizon, variant.max_action_dim), np.float32)
    samples: dict[str, list[float]] = {}
    for _ in range(repeats + 1):
        pipeline.run_vision()
        pipeline.run_action(x0, variant.default_flow_steps)
        for key, value in pipeline.last_timings_ms.items():
            samples.setdefault(key, []).append(value)
    parts = [f"{k} {np.median(v[1:]):.1f}" for k, v in samples.items()]
    return Check("latency (ms)", PASS,
                 f"median of {repeats}: " + ", ".join(parts)
                 + f" (action_step: all {variant.default_flow_steps} steps)")


def run_checks(bundle_dir: Path, variant: str | None, suffixes: dict[str, str],
               timeout_s: float, repeats: int, ignore_bundle_libs: bool = False) -> list[Check]:
    """Every check in order; later ones are skipped when what they need is missing."""
    probe = probe_qai_appbuilder()
    checks = machine_checks(probe, host_kernels=True)
    try:
        from ..bundle.bundle import Bundle, Suffixes, resolve_bundles

        found = resolve_bundles(bundle_dir, variant)
        chosen = Suffixes.from_mapping(suffixes)
    except MolmoActError as exc:
        return checks + [Check("bundle", FAIL, str(exc), "give a variant's bundle folder, or a "
                               "root of variant folders (optionally with --variant)")]
    for name, folder in found:
        try:
            bundle = Bundle.open(folder, name)
        except MolmoActError as exc:
            checks.append(Check(f"bundle {name}", FAIL, str(exc), "fix or remove this folder"))
            continue
        checks += _bundle_checks(bundle, chosen, probe, timeout_s, repeats, ignore_bundle_libs)
    return checks


def _bundle_checks(bundle, chosen, probe: dict, timeout_s: float, repeats: int,
                   ignore_bundle_libs: bool = False) -> list[Check]:
    """One variant's bundle: its files, its norm stats and prompt budget, then (with
    qai_appbuilder) loads, parity, latency."""
    from .prompt_stats import budget_check, norm_stats_check

    checks = [Check("bundle", PASS, f"{bundle.root} ({bundle.variant.name})"),
              check_dsp_arch(bundle.variant.dsp_arch), check_host_files(bundle),
              norm_stats_check(bundle), budget_check(bundle)]
    files = list(check_context_files(bundle, chosen))
    checks += files
    if "error" in probe:
        checks.append(Check("contexts load", SKIP, "needs qai_appbuilder"))
    elif any(c.status == FAIL for c in files):
        checks.append(Check("contexts load", SKIP, "needs every context file"))
    else:
        checks += list(check_pipeline(bundle, chosen, timeout_s, repeats, ignore_bundle_libs))
    return checks

