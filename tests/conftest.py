"""Shared fixtures: the tiny synthetic bundle (built once per session, or taken from make)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _package_logs_reach_caplog():
    """ROS's ``launch`` (imported by launch_testing's pytest plugin) makes loggers created
    after it non-propagating, which would hide the package's logs from ``caplog``."""
    import logging

    names = [n for n in list(logging.Logger.manager.loggerDict)
             if n == "molmoact2_ros" or n.startswith("molmoact2_ros.")]
    for name in {"molmoact2_ros", "molmoact2_ros.control.controller", "molmoact2_ros.runtime",
                 *names}:
        logging.getLogger(name).propagate = True


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    """Folder with one tiny bundle per variant (``MOLMOACT2_TINY_BUNDLE`` or built here)."""
    env = os.environ.get("MOLMOACT2_TINY_BUNDLE")
    if env and (Path(env) / "grid_sampler" / "bundle.json").is_file():
        return Path(env)
    pytest.importorskip("onnx")
    from molmoact2_ros.synth import write_tiny_bundles

    out = tmp_path_factory.mktemp("tiny-bundle")
    write_tiny_bundles(out)
    return out


@pytest.fixture(scope="session")
def reference_bundle(tmp_path_factory) -> Path:
    """The reference bundle's folder (checkpoint/, fused/, fused_2step/, reference/)."""
    from reference_helpers import REFERENCE_ARCHIVE, extract_reference_bundle

    if not REFERENCE_ARCHIVE.is_file():
        pytest.skip(f"{REFERENCE_ARCHIVE.name} is absent; regenerate it as "
                    "docs/reference_bundle.md describes")
    return extract_reference_bundle(REFERENCE_ARCHIVE, tmp_path_factory.mktemp("reference"))


@pytest.fixture(scope="module")
def libero_arm():
    """LIBERO physics only (no renderer), one env per module: for measuring the arm."""
    pytest.importorskip("libero")
    from molmoact2_ros.sim.libero_env import LiberoSim

    sim = LiberoSim(settle_steps=10, cameras=False)
    yield sim
    sim.close()


@pytest.fixture(params=["grid_sampler", "lp_vtp_sd", "fused"])
def variant_name(request) -> str:
    return request.param


def _is_launch_test(file: Path) -> bool:
    return "generate_test_description" in file.read_text(encoding="utf-8")


# Where ROS's launch_testing plugins are installed they import every test module while looking
# for launch tests, and a module-level ``pytest.importorskip`` raised there ends the whole
# collection. So plain test modules are collected here; only launch tests go to them.
if int(pytest.__version__.split(".")[0]) >= 7:

    @pytest.hookimpl(tryfirst=True)
    def pytest_pycollect_makemodule(module_path, parent):
        if _is_launch_test(module_path):
            return None
        if module_path.name == "__init__.py":
            return pytest.Package.from_parent(parent, path=module_path)
        return pytest.Module.from_parent(parent, path=module_path)

else:  # pytest 6 (Ubuntu 22.04 / Humble)

    @pytest.hookimpl(tryfirst=True)
    def pytest_pycollect_makemodule(path, parent):
        if _is_launch_test(Path(str(path))):
            return None
        if path.basename == "__init__.py":
            return pytest.Package.from_parent(parent, fspath=path)
        return pytest.Module.from_parent(parent, fspath=path)


@pytest.fixture
def no_leaks():
    """Fail the test if it leaves a thread, child process, fd or /dev/shm entry behind.

    Waits up to 60 s for things that stop asynchronously (joined threads, reaped workers;
    a loaded machine can take seconds).
    The image preprocessing pool is a process-wide cache and is not counted.
    """
    import threading
    import time

    from htp_helpers import Snapshot, leftover_threads

    threads_before = set(threading.enumerate())
    before = Snapshot.take()
    yield
    deadline = time.monotonic() + 60.0
    while True:
        threads = sorted(leftover_threads(threads_before))
        problems = Snapshot.take().leaks_since(before)
        if threads:
            problems.append(f"threads left: {threads}")
        if not problems or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not problems, "; ".join(problems)


#: left out of ``make test-quick`` (``-m "not slow"``): files that start LIBERO, Ray, the
#: resident HTP workers or ROS (by name), and files that replay or check whole bundles over
#: and over; ``make test`` runs everything. Measured with ``--durations`` (CONTRIBUTING.md).
SLOW_NAME_PARTS = ("libero", "cluster", "htp", "rclpy", "launch")
SLOW_FILES = frozenset({
    "test_resident_overlap.py", "test_runtime_faults.py", "test_replay_signals.py",
    "test_bench.py", "test_closed_loop.py", "test_device_report.py", "test_doctor.py",
    "test_checks.py", "test_replay.py", "test_bag_corpus.py", "test_seed_workspace.py",
    "test_state_convention.py", "test_checkpoint_layout.py", "test_export_host.py",
})
SLOW_TESTS = frozenset({"test_deterministic_bytes", "test_cli_parity_exit_status"})


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: left out of make test-quick (tests/conftest.py)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = item.path.name
        if name in SLOW_FILES or any(part in name for part in SLOW_NAME_PARTS) or \
                item.originalname in SLOW_TESTS:
            item.add_marker(pytest.mark.slow)


# -- the rclpy and launch tests, counted: `make test` prints how many ran and how many skipped,
# and `.ci/run` fails when a ROS 2 is sourced but none ran (MOLMOACT2_ROS_TESTS_REPORT: a JSON
# file the counts are written to at the end of the session)
def is_ros_test_file(name: str) -> bool:
    """The files that need ROS 2: the rclpy node tests and the launch tests."""
    return name.endswith("_rclpy.py") or name.startswith("test_launch_")


_ROS_COUNTS: dict = {"passed": 0, "failed": 0, "skipped": 0, "skipped_files": 0, "reasons": []}


def _ros_file(nodeid: str) -> bool:
    return is_ros_test_file(nodeid.split("::", 1)[0].rsplit("/", 1)[-1])


def pytest_collectreport(report):
    if report.skipped and _ros_file(report.nodeid) and "::" not in report.nodeid:
        _ROS_COUNTS["skipped_files"] += 1
        reason = getattr(report, "longrepr", None)
        if isinstance(reason, tuple) and len(reason) == 3:
            _ROS_COUNTS["reasons"].append(str(reason[2]).removeprefix("Skipped: "))


def pytest_runtest_logreport(report):
    if not _ros_file(report.nodeid):
        return
    if report.when == "call" or (report.when == "setup" and not report.passed):
        key = "skipped" if report.skipped else "passed" if report.passed else "failed"
        _ROS_COUNTS[key] += 1
        if report.skipped and isinstance(report.longrepr, tuple):
            _ROS_COUNTS["reasons"].append(str(report.longrepr[2]).removeprefix("Skipped: "))


def pytest_terminal_summary(terminalreporter):
    c = _ROS_COUNTS
    ran = c["passed"] + c["failed"]
    if not ran and not c["skipped"] and not c["skipped_files"]:
        return  # a selection without them
    line = (f"ROS 2 tests (rclpy and launch): {ran} ran ({c['passed']} passed), "
            f"{c['skipped']} skipped")
    if c["skipped_files"]:
        line += f", {c['skipped_files']} files skipped"
    if c["reasons"]:
        line += f" ({sorted(set(c['reasons']))[0]})"
    terminalreporter.write_line(line)
    out = os.environ.get("MOLMOACT2_ROS_TESTS_REPORT")
    if out:
        import json

        Path(out).write_text(json.dumps({"ran": ran, **c}), encoding="utf-8")
