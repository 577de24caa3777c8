"""Episode videos: both cameras the right way up, side by side, with the instruction, the step
and the success drawn above them; H.264 MP4 through imageio's ffmpeg plugin (``sim`` extra)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from ..errors import MissingDependencyError
from .libero_env import SIM_EXTRA, upright

BANNER_PX = 48
FPS = 20


def _imageio():
    try:
        import imageio.v2 as imageio
        import imageio_ffmpeg  # noqa: F401  (the ffmpeg binary imageio writes MP4 with)
    except ImportError as exc:
        raise MissingDependencyError(
            f"episode videos need imageio and imageio-ffmpeg ({exc}): {SIM_EXTRA}; or pass "
            "--video none") from None
    return imageio


def compose(raw_images, instruction: str, step: int, success: bool) -> np.ndarray:
    """One video frame: upright agentview | upright wrist, a text banner on top."""
    from PIL import Image, ImageDraw

    row = np.concatenate([upright(np.asarray(im)) for im in raw_images], axis=1)
    h, w = row.shape[:2]
    frame = np.zeros((h + BANNER_PX, w, 3), np.uint8)
    frame[BANNER_PX:] = row
    img = Image.fromarray(frame)
    draw = ImageDraw.Draw(img)
    line = textwrap.shorten(instruction, width=max(w // 6, 20), placeholder="...")
    draw.text((4, 3), line, fill=(255, 255, 255))
    status = "SUCCESS" if success else "running"
    draw.text((4, 25), f"step {step}", fill=(255, 255, 255))
    draw.text((w // 2, 25), status, fill=(80, 230, 80) if success else (230, 200, 80))
    return np.asarray(img)


class EpisodeVideo:
    """Streams frames to an MP4 as the episode runs (nothing held in memory)."""

    def __init__(self, path: Path, instruction: str, fps: int = FPS) -> None:
        imageio = _imageio()
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.instruction = instruction
        self.frames = 0
        self._writer = imageio.get_writer(str(self.path), fps=fps, codec="libx264",
                                          quality=6, macro_block_size=16,
                                          ffmpeg_log_level="error")

    def add(self, raw_images, step: int, success: bool) -> None:
        self._writer.append_data(compose(raw_images, self.instruction, step, success))
        self.frames += 1

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def check_video_support() -> None:
    """Fail before anything runs when videos are asked for and cannot be written."""
    _imageio()
