"""``cluster('local')`` on a real local Ray cluster of its own, started in a subprocess while
no other cluster of the suite is up (kept out of the modules with a cluster per module)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("ray")

from molmoact2_ros.cluster.connect import NICENESS_ENV  # noqa: E402

WAIT_S = 120.0

_NICE_PROBE = """
import os, sys
from molmoact2_ros.cluster.connect import cluster

with cluster("local", num_cpus=1) as ray:
    @ray.remote(num_cpus=1)
    def nice():
        return os.nice(0)
    print(os.nice(0), ray.get(nice.remote(), timeout=float(sys.argv[1])))
"""


def test_a_local_cluster_runs_its_workers_at_the_callers_priority(tmp_path):
    """Ray's default nice 15 lets any other work on the machine starve the actors that do a
    run's work while the driver waits; ``cluster('local')`` gives them the caller's."""
    env = {k: v for k, v in os.environ.items() if k != NICENESS_ENV}
    run = subprocess.run([sys.executable, "-c", _NICE_PROBE, str(WAIT_S * 5)],
                         capture_output=True, text=True, env=env, cwd=tmp_path,
                         timeout=WAIT_S * 10)
    assert run.returncode == 0, run.stderr[-3000:]
    driver, worker = (int(x) for x in run.stdout.split()[-2:])
    assert worker == driver, run.stdout
