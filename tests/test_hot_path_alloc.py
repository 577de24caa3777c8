"""The hot path allocates no more than 1 MiB per chunk (tracemalloc sees numpy's buffers)."""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest

from molmoact2_ros.bench.host import _settings, host_bundle, null_policy
from molmoact2_ros.control.controller import Controller, chunk_message_fields
from molmoact2_ros.host import fp16
from molmoact2_ros.host.images import decode_image

LIMIT_BYTES = 1 << 20


def _peak_growth(fn, repeats: int = 3) -> int:
    """Largest rise of traced memory above the level before a call, over ``repeats`` calls."""
    worst = 0
    for _ in range(repeats):
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        fn()
        worst = max(worst, tracemalloc.get_traced_memory()[1] - before)
    return worst


@pytest.fixture(params=["auto", "numpy", "numba"])
def fp16_kernel(request):
    """The fp16 embedding on the automatic choice (OpenCV 5 when installed), numba's kernel
    (where installed) and numpy's blocked path."""
    if request.param == "numba" and not fp16.CHOICE.available("numba"):
        pytest.skip("numba not installed")
    fp16.force(None if request.param == "auto" else request.param)
    yield request.param
    fp16.force(None)


@pytest.mark.parametrize("variant", ["lp_vtp_sd", "fused"])
@pytest.mark.parametrize("hw", [(256, 256), (480, 640)])
def test_chunk_allocates_under_1_mib(tmp_path, variant: str, hw: tuple, fp16_kernel) -> None:
    folder = host_bundle(tmp_path, variant)
    policy = null_policy(folder)
    fields: list = []
    controller = Controller(_settings(folder, variant),
                            publish=lambda p: fields.append(chunk_message_fields(p)),
                            policy_factory=lambda s: policy)
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (*hw, 3), dtype=np.uint8) for _ in range(2)]
    state = np.linspace(-0.5, 0.5, 8).astype(np.float32)

    def chunk() -> None:
        controller.on_observation(frames, state, time.time_ns())
        assert controller.process_pending() is not None
        fields.clear()

    controller.configure()
    controller.activate(worker=False)
    try:
        for _ in range(6):  # scratch buffers of both preprocessing threads, cached tables
            chunk()
        tracemalloc.start()
        try:
            growth = _peak_growth(chunk)
        finally:
            tracemalloc.stop()
    finally:
        controller.shutdown()
    assert growth <= LIMIT_BYTES, f"a chunk allocated {growth / 2**20:.2f} MiB"


def test_decoding_a_vga_frame_allocates_only_the_frame() -> None:
    raw = np.random.default_rng(1).integers(0, 256, 480 * 640 * 3, dtype=np.uint8).tobytes()
    decode_image("bgr8", 480, 640, 640 * 3, raw)
    tracemalloc.start()
    try:
        growth = _peak_growth(lambda: decode_image("bgr8", 480, 640, 640 * 3, raw))
    finally:
        tracemalloc.stop()
    assert growth <= 480 * 640 * 3 + 4096  # the decoded frame itself (the copy out of the msg)
