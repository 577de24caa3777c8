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

    from htp_helpers import Snapshot

    threads_before = set(threading.enumerate())
    before = Snapshot.take()
    yield
    deadline = time.monotonic() + 60.0
    while True:
        threads = sorted(t.name for t in threading.enumerate()
                         if t not in threads_before and t.is_alive()
                         and not t.name.startswith("molmoact2-preprocess"))
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
