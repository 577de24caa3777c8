"""docs/parameters.md written from the parameter table (``params.PARAMS``), so the reference
page cannot drift from what the node declares.

Regenerate with ``make docs`` or ``python -m molmoact2_ros.control.params_doc docs/parameters.md``;
``tests/test_params_doc.py`` fails when the committed page differs from this output.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .params import CONFIGURE, LIVE, PARAMS, RELOAD, ParamSpec

REGENERATE = "make docs (or: python -m molmoact2_ros.control.params_doc docs/parameters.md)"

APPLY = {
    LIVE: "live: applies to the next chunk",
    RELOAD: "reload: a background session swap (inference pauses; rolled back if the load "
            "fails)",
    CONFIGURE: "configure: takes effect on the next configure transition",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _default(value) -> str:
    return f"`{json.dumps(value)}`" if value != "" else '`""`'


def _range(spec: ParamSpec) -> str:
    if spec.int_range:
        return f"[{spec.int_range[0]}, {spec.int_range[1]}]"
    if spec.float_range:
        return f"[{spec.float_range[0]:g}, {spec.float_range[1]:g}]"
    if spec.list_max:
        return "(0, " + "], (0, ".join(f"{v:g}" for v in spec.list_max) + "]"
    return ""


def markdown() -> str:
    """The whole page: a header, then one table row per parameter, in the table's order."""
    lines = [
        "# Node parameters",
        "",
        "<!-- generated from molmoact2_ros/control/params.py; do not edit by hand: "
        f"{REGENERATE} -->",
        "",
        "Every ROS parameter of the `molmoact2_policy` node, in the order the node declares "
        "them. `config/policy.yaml` sets the same defaults; `molmoact2 replay --set NAME=VALUE` "
        "takes any of them. A bad value is rejected with a one-line reason and the old value "
        "stays.",
        "",
        "When a change applies:",
        "",
        *(f"- {text}" for text in APPLY.values()),
        "",
        "| parameter | default | applies | range | description |",
        "|---|---|---|---|---|",
    ]
    for spec in PARAMS:
        lines.append(f"| `{spec.name}` | {_default(spec.default)} | {spec.apply} | "
                     f"{_range(spec)} | {_cell(spec.description)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write the page to the path given (default: print it)."""
    argv = sys.argv[1:] if argv is None else argv
    text = markdown()
    if not argv:
        sys.stdout.write(text)
        return 0
    Path(argv[0]).write_text(text, encoding="utf-8")
    print(f"wrote {argv[0]} ({len(PARAMS)} parameters)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
