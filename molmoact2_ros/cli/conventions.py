"""Read the host-glue conventions off a bundle's goldens; compare or repair ``conventions.json``.

The goldens show the mask value, padding side, bidirectional image attention, encoder-mask
policy, Euler placement and whether vision already adds the ``<im_patch>`` embedding;
``euler_baked_steps`` only through the primary trace's step count, ``flip_images_180`` not at
all (a default to verify).
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict
from pathlib import Path

from ..bundle.bundle import Bundle, resolve_bundles
from ..bundle.conventions import Conventions
from ..host.convention_check import (  # noqa: F401  (re-exported: the command's vocabulary)
    MATCH,
    MISMATCH,
    UNKNOWN,
    UNREADABLE,
    Finding,
    check_conventions,
    conventions_from_goldens,
    format_findings,
    infer_from_bias,
    unverified,
)


def diff_lines(old: Conventions, new: Conventions) -> list[str]:
    """``-``/``+`` lines for every choice that differs (what ``conventions --write`` changes)."""
    a, b = asdict(old), asdict(new)
    out = []
    for key in sorted(a):
        if a[key] != b[key]:
            out += [f"-  {key}: {json.dumps(a[key])}", f"+  {key}: {json.dumps(b[key])}"]
    return out


def write_inside(root: Path, target: Path, text: str) -> Path | None:
    """Write ``target`` inside the bundle ``root`` without following a symlink out of it
    (an untrusted bundle must not choose where the write goes): symlinks are refused, the
    previous file is kept beside it (``keep_previous``), the text goes to a temporary file
    beside the target and replaces it in one step."""
    from ..errors import BundleError

    for path in (target.parent, target):
        if path.is_symlink():
            raise BundleError(f"{path} is a symlink (to {os.readlink(path)}); conventions "
                              "--write only writes inside the bundle: replace the link with "
                              "a plain file or folder")
    target.parent.mkdir(parents=True, exist_ok=True)
    real_root = Path(os.path.realpath(root))
    if not Path(os.path.realpath(target.parent)).is_relative_to(real_root):
        raise BundleError(f"{target.parent} resolves outside the bundle {root}; conventions "
                          "--write only writes inside the bundle")
    from ..util.outputs import keep_previous, replace_bytes

    kept = keep_previous(target)
    replace_bytes(target, text.encode("utf-8"))
    return kept


def _print_decoded(bundle: Bundle) -> bool:
    """The golden decoder's report; False when the golden's prompt differs from ours."""
    from ..errors import MolmoActError
    from ..host.prompt_decode import decode_golden_prompt, format_decoded

    names = ("prompt.json", "tokenizer.json", "embeddings.npy")
    if not all(bundle.host_path(n).is_file() for n in names) or not (
            bundle.root / "golden" / "llm_split0_io.npz").is_file():
        print("golden decoder: needs host/ (prompt.json, tokenizer.json, embeddings.npy) and "
              "golden/llm_split0_io.npz; skipped")
        return True
    try:
        decoded = decode_golden_prompt(bundle)
    except MolmoActError as exc:
        print(f"golden decoder: MISMATCH: the package cannot build the golden's prompt ({exc})")
        return False
    print(format_decoded(decoded))
    return decoded.first_difference is None and not decoded.note


def cmd_conventions(args: argparse.Namespace) -> int:
    from ..firstrun.prompt_stats import budget_lines

    ok, written, names = True, [], []
    for name, path in resolve_bundles(Path(args.bundle), args.variant):
        bundle = Bundle.open(path, name)
        names.append(name)
        target = bundle.host_path("conventions.json")
        current = bundle.conventions() if target.is_file() or not args.write else None
        findings = check_conventions(bundle, current) if current else []
        if findings:
            print(f"== {name} {path}")
            print(format_findings(findings))
        if args.write and (current is None or any(f.verdict == MISMATCH for f in findings)):
            fixed, findings = conventions_from_goldens(bundle, current)
            print(f"-- {target}" if current else f"-- {target} (new)")
            print("\n".join(diff_lines(current or Conventions(), fixed)) or "   (no change)")
            kept = write_inside(bundle.root, target, fixed.to_json() + "\n")
            if kept is not None:
                print(f"   previous file kept as {kept}")
            written.append(target)
            findings = check_conventions(bundle)
        ok &= all(f.verdict != MISMATCH for f in findings)
        ok &= _print_decoded(bundle)
        print("\n".join(budget_lines(bundle)))
        open_choices = unverified(findings) if findings else list(UNREADABLE)
        print(f"{name}: not verifiable from the goldens (keep conventions.json's values and "
              f"check them by hand): {', '.join(open_choices)}")
    verdict = "every convention the goldens show matches" if ok else "MISMATCH (see above)"
    fix = "" if ok or args.write else "; repair with: molmoact2 conventions --write " + args.bundle
    print(f"conventions: {', '.join(names)}: {verdict}"
          + (f"; wrote {len(written)} conventions.json" if written else "") + fix)
    return 0 if ok else 1


def register(subparsers) -> None:
    """Add ``molmoact2 conventions`` to the CLI."""
    from .args import add_bundle_args, example

    p = subparsers.add_parser(
        "conventions", help="read the host-glue conventions off the goldens; compare or repair",
        description="Read each host-glue choice off the bundle's golden files and compare it "
        "with host/conventions.json.\nExit 1 on any MISMATCH; --write repairs the file from "
        "the goldens and shows the diff. The choices no golden shows are listed as not\n"
        "verifiable: check them by hand against the checkpoint's code.",
        epilog=example("molmoact2 conventions /data/molmoact2/grid_sampler",
                       "molmoact2 conventions /data/molmoact2/grid_sampler --write"))
    add_bundle_args(p)
    p.add_argument("--write", action="store_true",
                   help="rewrite host/conventions.json with what the goldens show (prints the "
                   "diff; choices the goldens do not show keep their value)")
    p.set_defaults(func=cmd_conventions)
