"""A real local Ray cluster for a test module (no mocks of Ray)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from molmoact2_ros.cluster.connect import NICENESS_ENV


@contextmanager
def local_ray(num_cpus: int = 2) -> Iterator:
    """Ray with a local cluster of ``num_cpus`` for the ``with`` block. Its workers run at this
    process's priority, as ``cluster("local")`` starts them: at Ray's default nice 15 a busy CI
    machine starves the actors for many minutes (Ray adds the variable to the nice value the
    raylet inherits, so 0 means the caller's own)."""
    import ray

    with pytest.MonkeyPatch.context() as env:
        env.setenv(NICENESS_ENV, "0")  # added to the nice value the raylet inherits
        ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                 logging_level=logging.WARNING)
        try:
            yield ray
        finally:
            ray.shutdown()
