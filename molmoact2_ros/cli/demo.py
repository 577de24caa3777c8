"""``molmoact2 demo``: the pipeline on each bundle's sample observation, numbers explained."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ..bundle.bundle import resolve_bundles
from ..runtime.appbuilder import describe
from ..util.progress import progress

EXPLANATION = """\
What this shows: the whole pipeline (preprocess, vision, llm_split0..3, action_context,
action_step x flow steps, de-normalisation) on the bundle's sample observation. With the tiny
bundles the model is tiny and random and runs on this machine's CPU through ONNX Runtime (the
test fake of qai_appbuilder runs it the same way): the actions are meaningless and the
latencies say nothing about the IQ-9075's NPU. The runtime's own overhead around the NPU (a
few ms per chunk) is what `molmoact2 bench` measures; correctness is `molmoact2 parity`."""


def cmd_demo(args: argparse.Namespace) -> int:
    from ..bundle.golden import load_npz
    from ..policy import Observation, Policy

    bundles = resolve_bundles(Path(args.bundle), args.variant)
    print(EXPLANATION)
    medians: dict[str, float] = {}
    bad: list[str] = []
    for name, path in bundles:
        trace = load_npz(path / "golden" / "e2e_trace.npz",
                         ("image_primary", "image_wrist", "state", "instruction"),
                         what="the demo's sample observation")
        with Policy.load(path, name, backend=args.backend, seed=0,
                         instruction=str(trace["instruction"])) as policy:
            obs = Observation(images=(trace["image_primary"], trace["image_wrist"]),
                              state=trace["state"])
            timings: dict[str, list[float]] = {}
            runs = range(args.warmup + args.chunks)
            for i in progress(runs, f"demo {name}", label=lambda i: "warm-up" if i < args.warmup
                              else f"chunk {i - args.warmup + 1}"):
                chunk = policy.predict(obs)
                if i >= args.warmup:
                    for key, value in chunk.latency_ms.items():
                        timings.setdefault(key, []).append(value)
                shape = (policy.variant.horizon, policy.variant.action_dim)
                if chunk.actions.shape != shape or not np.all(np.isfinite(chunk.actions)):
                    bad.append(f"{name} chunk {i + 1}")
            print(f"\n== {name}: {policy.flow_steps} flow steps, backend "
                  f"{describe(args.backend)}, median and p95 of {args.chunks} chunks "
                  f"({args.warmup} warm-up chunks run first, not timed)")
            print(f"{'stage':<16} {'median ms':>10} {'p95 ms':>10}")
            for key, values in timings.items():
                print(f"{key:<16} {np.median(values):>10.2f} "
                      f"{np.percentile(values, 95):>10.2f}")
            medians[name] = float(np.median(timings.get("total", [np.nan])))
            print(f"last chunk (de-normalised, {shape[0]} x {shape[1]}):")
            print(np.array2string(chunk.actions, precision=4, suppress_small=True))
    per_variant = ", ".join(f"{n} {ms:.0f} ms" for n, ms in medians.items())
    verdict = (f"every chunk finite and {len(medians)} variant(s) ran" if not bad
               else f"FAIL: non-finite or misshapen chunks: {', '.join(bad)}")
    print(f"\ndemo: {verdict}; median total per chunk on {describe(args.backend)}: "
          f"{per_variant}")
    return 1 if bad else 0


def register(subparsers) -> None:
    """Add ``molmoact2 demo`` to the CLI."""
    from .args import add_backend_arg, add_bundle_args, example, int_in

    p = subparsers.add_parser(
        "demo", help="run the pipeline on the bundle's sample observation, with latencies",
        description="Run the whole pipeline on each variant's sample observation (golden/"
        "e2e_trace.npz) and print\nper-stage latency (median and p95, warm-up excluded) and "
        "the last de-normalised chunk.",
        epilog=example("molmoact2 demo .cache/tiny-bundle --variant lp_vtp_sd --chunks 5"))
    add_bundle_args(p)
    add_backend_arg(p)
    p.add_argument("--chunks", type=int_in(1, 100_000), default=10,
                   help="timed chunks per variant")
    p.add_argument("--warmup", type=int_in(0, 1000), default=2,
                   help="untimed chunks run first (first-call allocations, caches)")
    p.set_defaults(func=cmd_demo)
