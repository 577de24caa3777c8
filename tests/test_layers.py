"""The package's layers, read from the import graph: no module imports a layer above its own,
and rclpy is imported under ``ros/`` only (docs/architecture.md, "Layers")."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "molmoact2_ros"
ARCHITECTURE = PKG.parent / "docs" / "architecture.md"

#: Bottom to top; a unit may import its own rank or lower. The table in docs/architecture.md
#: is the same list (a test below keeps the two in step).
LAYERS: list[tuple[str, ...]] = [
    ("errors", "util"),
    ("bundle",),
    ("host", "synth"),
    ("runtime",),
    ("policy",),
    ("control",),
    ("replay",),
    ("sim",),
    ("ros", "node", "msg"),  # msg: the messages colcon generates into the package
    ("cluster",),
    ("bench",),
    ("firstrun",),
    ("cli",),
]
RANK = {unit: i for i, units in enumerate(LAYERS) for unit in units}
TOP_LEVEL_MODULES = {"__init__.py", "errors.py", "policy.py", "node.py"}


def _unit(module: str) -> str:
    """``molmoact2_ros.control.sync`` → ``control``; the package root is ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _module_name(path: Path) -> tuple[str, bool]:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def imports_of(path: Path) -> list[tuple[int, str]]:
    """Every package-internal module ``path`` imports, at top level or inside a function."""
    name, is_package = _module_name(path)
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                if not is_package:
                    base = base[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "molmoact2_ros" or target.startswith("molmoact2_ros."):
                # ``from . import x`` names a submodule or a name of the package root
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    resolved = sub if _exists(sub) else target
                    out.append((node.lineno, resolved))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names
                    if a.name == "molmoact2_ros" or a.name.startswith("molmoact2_ros.")]
    return out


def _exists(module: str) -> bool:
    path = PKG.parent.joinpath(*module.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def package_files() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if "msg" not in p.relative_to(PKG).parts[:1])


def test_first_contact_layer_never_imports_the_command_line():
    """firstrun/ holds doctor's checks and the device report; cli/ only parses and prints."""
    found = [f"{p.relative_to(PKG.parent)}:{line} imports {t}"
             for p in sorted((PKG / "firstrun").rglob("*.py")) for line, t in imports_of(p)
             if _unit(t) == "cli"]
    assert found == []


def test_command_modules_stay_thin():
    """No command module grows a layer of its own: each stays under 300 lines."""
    long = {p.name: n for p in sorted((PKG / "cli").glob("*.py"))
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 300}
    assert long == {}, f"move the logic below cli/: {long}"


def test_every_unit_has_a_layer():
    units = {_unit(_module_name(p)[0]) for p in package_files()} - {""}
    units = {u for u in units}
    assert units <= set(RANK), f"give these a layer in LAYERS and docs: {units - set(RANK)}"


def test_no_module_imports_a_layer_above_its_own():
    upward = []
    for path in package_files():
        name, _ = _module_name(path)
        here = _unit(name)
        if here == "":  # the package root re-exports the public surface
            continue
        for line, target in imports_of(path):
            there = _unit(target)
            if there and RANK[there] > RANK[here]:
                upward.append(f"{path.relative_to(PKG.parent)}:{line} ({here}) imports "
                              f"{target} ({there})")
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_the_checker_sees_an_upward_import(tmp_path, monkeypatch):
    """The graph reader is not blind: a lazy upward import inside a function is found."""
    fake = PKG / "control" / "_layer_probe.py"
    fake_text = "def f():\n    from ..cli.app import main\n    return main\n"
    try:
        fake.write_text(fake_text)
        found = [t for _, t in imports_of(fake)]
    finally:
        fake.unlink()
    assert found == ["molmoact2_ros.cli.app"]
    assert RANK[_unit(found[0])] > RANK["control"]


def test_rclpy_only_under_ros():
    pattern = re.compile(r"import rclpy|from rclpy")
    offenders = [str(p.relative_to(PKG.parent)) for p in package_files()
                 if pattern.search(p.read_text(encoding="utf-8"))
                 and p.relative_to(PKG).parts[0] != "ros"]
    assert offenders == []


def test_top_level_holds_only_the_root_modules():
    modules = {p.name for p in PKG.glob("*.py")}
    assert modules <= TOP_LEVEL_MODULES, modules - TOP_LEVEL_MODULES
    assert len(modules) <= 4


def test_architecture_doc_lists_the_same_layers():
    """docs/architecture.md's layer table names the units of LAYERS, bottom row first."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    table = text.split("<!-- layers -->")[1].split("<!-- /layers -->")[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    documented = []
    for row in rows[1:]:
        cell = re.sub(r"\([^)]*\)", "", row.split("|")[2])
        documented.append(tuple(re.findall(r"`([a-z_]+)[/.]", cell)))
    assert documented == LAYERS[::-1]


def test_architecture_doc_names_every_control_module():
    """The control row names each module of ``control/`` (split by the decision it makes), so
    a new one cannot hide from the next maintainer."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    table = text.split("<!-- layers -->")[1].split("<!-- /layers -->")[0]
    row = next(line for line in table.splitlines() if line.startswith("| control |"))
    named = set(re.findall(r"`([a-z_]+\.py)`", row))
    modules = {p.name for p in (PKG / "control").glob("*.py")} - {"__init__.py"}
    assert modules - named == set()
