"""Shared pieces of the ``molmoact2`` commands: help formatting, one-line errors, typed options."""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from ..bundle.variants import VARIANTS
from ..errors import MolmoActError

BACKENDS = ("onnx", "htp")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps description line breaks and appends ``(default: X)`` to every option that has one."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        shown = not (default is None or default is False or default is argparse.SUPPRESS
                     or default == [])
        if shown and "%(default)" not in text and (action.option_strings or action.nargs in
                                                    (argparse.OPTIONAL, argparse.ZERO_OR_MORE)):
            text += " (default: %(default)s)"
        allowed = getattr(action.type, "range_text", "")
        if allowed and "range" not in text:
            text += f" (range: {allowed})"
        return text


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line naming the command and its ``--help``."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # noqa: D102 (argparse API)
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def example(*commands: str) -> str:
    """The ``example:`` epilog every command's ``--help`` ends with (one or more command lines)."""
    return "example:\n" + "\n".join(f"  {c}" for c in commands)


def _number(kind: Callable, text: str):
    try:
        value = kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An ``int`` option type accepting ``[low, high]``: every integer option has a range
    (its help names it), so no value can ask for minutes of work or petabytes of memory."""

    def parse(text: str) -> int:
        value = _number(int, text)
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below the minimum {low}")
        if value > high:
            raise argparse.ArgumentTypeError(f"{value} is above the maximum {high}")
        return value

    parse.__name__ = f"integer in [{low}, {high}]"
    parse.range_text = f"{low}..{high}"
    return parse


def int_at_least(low: int, high: int = 1_000_000) -> Callable[[str], int]:
    """``int_in(low, high)``: a count with a floor (e.g. ``--chunks 0`` is refused)."""
    return int_in(low, high)


def check_paths(outputs: Iterable[tuple[str, object]], inputs: Iterable[tuple[str, object]]
                ) -> None:
    """Refuse any output that is, contains or lies inside one of the command's inputs.

    ``outputs`` and ``inputs`` are ``(label, path)`` pairs (``None`` paths are skipped).
    Called before anything is deleted or written: ``--force`` replaces outputs, never inputs
    (``replay BAG --record BAG --force`` would otherwise delete the recording).
    """
    ins = [(label, _real(path)) for label, path in inputs if path]
    for out_label, out_path in outputs:
        if not out_path:
            continue
        out = _real(out_path)
        for in_label, src in ins:
            if out == src:
                how = "is"
            elif src.is_relative_to(out):
                how = "contains"
            elif out.is_relative_to(src):
                how = "lies inside"
            else:
                continue
            raise MolmoActError(f"{out_label} {out_path} {how} the input {in_label} {src}; "
                                "write outputs to a new path (--force never replaces inputs)")


def _real(path: object) -> Path:
    """The absolute path with symlinks resolved (also for parts that do not exist yet)."""
    return Path(os.path.realpath(os.path.expanduser(str(path))))


def float_in(low: float, high: float, *, low_open: bool = False) -> Callable[[str], float]:
    """A ``float`` option type accepting ``[low, high]`` (``(low, high]`` with ``low_open``)."""

    def parse(text: str) -> float:
        value = _number(float, text)
        if value > high or value < low or (low_open and value == low):
            bracket = "(" if low_open else "["
            raise argparse.ArgumentTypeError(f"{value} is outside {bracket}{low}, {high}]")
        return value

    parse.__name__ = "number"
    parse.range_text = f"{'(' if low_open else '['}{low:g}, {high:g}]"
    return parse


def add_bundle_args(p: argparse.ArgumentParser) -> None:
    """The ``BUNDLE [--variant V]`` pair every bundle command takes, resolved the same way."""
    p.add_argument("bundle", help="a variant's bundle folder, or a root with one folder per "
                   "variant (as tiny-bundle writes)")
    p.add_argument("--variant", choices=list(VARIANTS),
                   help="which variant (default: the folder's bundle.json, or every variant "
                   "folder below a root)")


def add_backend_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backend", default="onnx", choices=list(BACKENDS),
                   help="onnx: ONNX Runtime on this machine; htp: the resident qai_appbuilder "
                   "workers (with --appbuilder fake: the test fake)")


def parse_suffix(text: str) -> tuple[str, str]:
    """``GROUP=SUFFIX`` of ``--suffix`` (groups as in the ``context_suffix.*`` parameters)."""
    from ..bundle.variants import SUFFIX_GROUPS

    group, sep, suffix = text.partition("=")
    if not sep or group not in SUFFIX_GROUPS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: use GROUP=SUFFIX with GROUP one of {', '.join(SUFFIX_GROUPS)}"
        )
    return group, suffix


#: the reference runtime's suffix switches → our suffix groups (ACTION_CTX_SUFFIX selects
#: action_step only, as ``context_suffix.action`` does)
SUFFIX_ENV = {"VISION_CTX_SUFFIX": "vision", "LLM_CTX_SUFFIX": "llm",
              "ACTION_CTX_SUFFIX": "action"}


def suffixes_from_env(given: list[tuple[str, str]] | None, environ=None) -> dict[str, str]:
    """``--suffix`` values, completed by the reference runtime's ``*_CTX_SUFFIX`` variables.

    A set variable is honoured with a notice on stderr naming the parameter it stands for; a
    ``--suffix`` of the same group wins (and the notice says so).
    """
    import os
    import sys

    environ = os.environ if environ is None else environ
    chosen = dict(given or [])
    for variable, group in SUFFIX_ENV.items():
        if variable not in environ:
            continue
        value = environ[variable]
        if group in chosen:
            print(f"notice: {variable}={value!r} (the reference runtime's switch) is ignored: "
                  f"--suffix {group}={chosen[group]} was given", file=sys.stderr)
            continue
        chosen[group] = value
        print(f"notice: {variable}={value!r} from the environment (the reference runtime's "
              f"switch) is taken as --suffix {group}={value} (context_suffix.{group} on the "
              "node)", file=sys.stderr)
    return chosen


#: the files a ``--report`` folder may receive (replay, compare, replay with several bags)
REPORT_FILES = ("summary.json", "summary.md", "verdicts.jsonl", "verdicts.jsonl.partial",
                "actions.png", "residuals.png", "error_per_chunk.png", "continuity.png",
                "latency.png", "error_distribution.png")


def check_report_dir(report: str | os.PathLike | None, force: bool, command: str,
                     plots: bool = True) -> None:
    """Refuse a ``--report`` folder before the run: a symlink or a file in its place, a
    report already there (unless ``--force``), a file of the report's names that this package
    did not write (even with ``--force``), or no matplotlib to draw its plots (naming the
    extra). Files of other names in the folder are left alone."""
    if not report:
        return
    from ..util.optional import require
    from ..util.outputs import check_file, check_folder

    folder = check_folder(report, what="--report")
    if (folder / "summary.json").exists() and not force:
        raise MolmoActError(f"--report {report} holds a report already; choose a new folder "
                            "or pass --force")
    for name in REPORT_FILES:
        if os.path.lexists(folder / name) and name != "verdicts.jsonl.partial":
            check_file(folder / name, force=True, what="--report file")
    if plots:
        require("matplotlib", f"{command} --report")
