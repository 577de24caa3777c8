"""Every command the README and docs show exists as shown: each ``molmoact2`` command runs with
``--help`` and has every option the docs give it; every ``ros2 launch`` argument is declared by
its launch file, every ``ros2 run`` executable is installed, every ``make`` target exists."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

from molmoact2_ros.cli.app import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
#: options of other tools the docs name in backticks (pip, colcon, rosdep, ros2, apt, git)
FOREIGN_OPTIONS = {"--break-system-packages", "--system-site-packages", "--packages-select",
                   "--from-paths", "--ignore-src", "--ros-args", "--merge-install",
                   "--symlink-install", "--cmake-args", "--rosdistro", "--clock", "--loop",
                   "--rate", "--no-cache-dir", "--event-handlers", "--packages-up-to",
                   "--help", "--storage", "--durations", "--num-gpus"}
PLACEHOLDER = re.compile(r"^[A-Z][A-Z_]*$")  # COMMAND, BUNDLE, ...


def _snippets(text: str) -> list[str]:
    """Shell text of a Markdown file: fenced code (continuation lines joined, comments cut)
    and inline code spans."""
    out = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.DOTALL):
        joined = re.sub(r"\\\n\s*", " ", block)
        out += [line.split(" #")[0] for line in joined.splitlines()
                if not line.lstrip().startswith("#")]
    prose = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    out += [span.replace("\n", " ") for span in re.findall(r"`([^`]+)`", prose)]
    return out


def _tokens(snippet: str, start: str) -> list[list[str]]:
    """The tokens after each occurrence of the command ``start`` in ``snippet``."""
    found = []
    for match in re.finditer(rf"(?:^|[\s;(&|]){re.escape(start)}(?=\s|$)", snippet):
        rest = re.split(r"&&|\|\||;|\|", snippet[match.end():])[0]
        try:
            words = shlex.split(rest.replace("[", " ").replace("]", " "), posix=True)
        except ValueError:  # an unbalanced quote in prose: split on spaces
            words = rest.split()
        found.append(words)
    return found


def _subparsers():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    globals_ = {s for a in parser._actions for s in a.option_strings}
    return parser, sub.choices, globals_


def documented_invocations(docs: list[Path] = DOCS) -> list[tuple[str, str, list[str]]]:
    """(file, command, options) for every ``molmoact2 COMMAND ...`` the docs show."""
    _, commands, globals_ = _subparsers()
    out = []
    for path in docs:
        for snippet in _snippets(path.read_text(encoding="utf-8")):
            for words in _tokens(snippet, "molmoact2"):
                words = [w for w in words if w not in ("...", "…")]
                while words and words[0] in globals_:
                    words = words[2:] if words[0] == "--appbuilder" else words[1:]
                if not words or PLACEHOLDER.match(words[0]) or words[0] not in commands \
                        and not words[0].islower():
                    continue
                options = [w.split("=")[0] for w in words[1:] if w.startswith("--")]
                out.append((path.name, words[0], options))
    return out


def test_the_docs_show_commands():
    shown = {command for _, command, _ in documented_invocations()}
    assert {"demo", "parity", "replay", "libero", "bench", "doctor", "device-report"} <= shown


def test_every_documented_command_runs_with_help_and_has_its_options(capsys):
    _, commands, _ = _subparsers()
    problems, helped = [], set()
    for name, command, options in documented_invocations():
        if command not in commands:
            problems.append(f"{name}: molmoact2 {command}: no such command")
            continue
        if command not in helped:
            assert main([command, "--help"]) == 0, command
            assert f"usage: molmoact2 {command}" in capsys.readouterr().out
            helped.add(command)
        known = {s for a in commands[command]._actions for s in a.option_strings}
        problems += [f"{name}: molmoact2 {command} {o}: no such option" for o in options
                     if o not in known]
    assert problems == []


def _tool_options() -> set[str]:
    """Options of the repository's other scripts (``reference/export_reference.py``, ...)."""
    found = set()
    for path in ROOT.glob("*/*.py"):
        if path.parts[-2] in ("molmoact2_ros", "tests", "launch"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
                found |= {a.value for a in node.args if isinstance(a, ast.Constant)
                          and str(a.value).startswith("--")}
    return found


def _sections(text: str) -> list[tuple[str, str]]:
    parts = re.split(r"^## (.+)$", text, flags=re.MULTILINE)
    return list(zip(parts[1::2], parts[2::2]))


def test_every_option_the_docs_name_exists():
    """An option in backticks belongs to a command of its cli.md section (or, elsewhere, to
    some command); other tools' options are listed in FOREIGN_OPTIONS."""
    _, commands, globals_ = _subparsers()
    by_command = {c: {s for a in p._actions for s in a.option_strings} for c, p in
                  commands.items()}
    every = set().union(*by_command.values()) | globals_ | FOREIGN_OPTIONS | _tool_options()
    problems = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        sections = _sections(text) if path.name == "cli.md" else [("", text)]
        for heading, body in sections:
            for paragraph in re.sub(r"```.*?```", "", body, flags=re.DOTALL).split("\n\n"):
                # the section's commands and any command the paragraph names ("bench's --json")
                named = [c for c in commands if re.search(
                    rf"(?<![\w-]){re.escape(c)}(?![\w-])", heading + " " + paragraph)]
                allowed = set().union(*(by_command[c] for c in named)) | globals_ | \
                    FOREIGN_OPTIONS if heading and named else every
                for span in re.findall(r"`(--[a-z][\w-]*)", paragraph):
                    if span not in allowed:
                        problems.append(f"{path.name} {heading}: {span}")
    assert problems == []


def _declared(launch_file: Path) -> set[str]:
    from molmoact2_ros.bundle.variants import VARIANTS

    names = set()
    for node in ast.walk(ast.parse(launch_file.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == \
                "DeclareLaunchArgument" and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant):
                names.add(arg.value)
            elif isinstance(arg, ast.JoinedStr):  # f"bundle_{v}" over the variants
                prefix = "".join(p.value for p in arg.values if isinstance(p, ast.Constant))
                names |= {prefix + v for v in VARIANTS}
    return names


def test_every_documented_launch_argument_is_declared():
    problems, seen = [], 0
    for path in DOCS:
        for snippet in _snippets(path.read_text(encoding="utf-8")):
            for words in _tokens(snippet, "ros2 launch"):
                if len(words) < 2 or words[0] != "molmoact2_ros":
                    continue
                launch = ROOT / "launch" / words[1]
                if not launch.is_file():
                    problems.append(f"{path.name}: no launch file {words[1]}")
                    continue
                declared = _declared(launch)
                seen += 1
                problems += [f"{path.name}: {words[1]} has no argument {w.split(':=')[0]}"
                             for w in words[2:] if ":=" in w and w.split(":=")[0] not in declared]
    assert seen and problems == []


def test_every_documented_ros2_run_executable_is_installed():
    installed = set(re.findall(r"scripts/(\w+)", (ROOT / "CMakeLists.txt").read_text()))
    shown = {words[1] for path in DOCS for snippet in _snippets(path.read_text(encoding="utf-8"))
             for words in _tokens(snippet, "ros2 run")
             if len(words) > 1 and words[0] == "molmoact2_ros"}
    assert shown and shown <= installed, shown - installed


def test_every_documented_make_target_exists():
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, flags=re.MULTILINE))
    problems, seen = [], 0
    for path in DOCS:
        for snippet in _snippets(path.read_text(encoding="utf-8")):
            for words in _tokens(snippet, "make"):
                while words[:1] and words[0].startswith("-"):
                    words = words[2:] if words[0] in ("-C", "-f") else words[1:]
                words = [w for w in words if "=" not in w]
                if words and re.fullmatch(r"[a-z][\w-]*", words[0]):
                    seen += 1
                    if words[0] not in targets:
                        problems.append(f"{path.name}: make {words[0]}")
    assert seen and problems == []


@pytest.mark.parametrize("text, expected", [
    ("```bash\nmolmoact2 replay BAG \\\n    --golden G  # a comment --nope\n```",
     [("replay", ["--golden"])]),
    ("see `molmoact2 --appbuilder fake parity B --backend htp` and `molmoact2 COMMAND --help`",
     [("parity", ["--backend"])]),
])
def test_the_reader_finds_commands_and_options(text, expected, tmp_path):
    """The extraction is not blind: continuation lines, comments, global options."""
    doc = tmp_path / "example.txt"
    doc.write_text(text)
    assert [(c, o) for _, c, o in documented_invocations([doc])] == expected
