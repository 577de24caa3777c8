"""Episode videos: both cameras the right way up, side by side, with the instruction, the step
and the status drawn above them; the last second holds the outcome (SUCCESS, FAILURE: the steps
ran out, REFUSED) and the file is named by it. H.264 MP4 through imageio's ffmpeg plugin
(``sim`` extra)."""

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


#: how an episode ends, as drawn on its last frames and named in its file
OUTCOMES = ("success", "failure", "refused")
#: banner colours: running amber, success green, failure and refusal red
_COLOURS = {"running": (230, 200, 80), "success": (80, 230, 80), "failure": (235, 80, 80),
            "refused": (235, 80, 80)}
#: the outcome is held this many frames (1 s) at the end of every video
OUTCOME_FRAMES = FPS


def compose(raw_images, instruction: str, step: int, status: str = "running",
            note: str = "") -> np.ndarray:
    """One video frame: upright agentview | upright wrist, a text banner on top with the step
    and ``status`` (``running`` or an outcome, upper case, with an optional note)."""
    from PIL import Image, ImageDraw

    row = np.concatenate([upright(np.asarray(im)) for im in raw_images], axis=1)
    h, w = row.shape[:2]
    frame = np.zeros((h + BANNER_PX, w, 3), np.uint8)
    frame[BANNER_PX:] = row
    img = Image.fromarray(frame)
    draw = ImageDraw.Draw(img)
    line = textwrap.shorten(instruction, width=max(w // 6, 20), placeholder="...")
    draw.text((4, 3), line, fill=(255, 255, 255))
    draw.text((4, 25), f"step {step}", fill=(255, 255, 255))
    text = status if status == "running" else status.upper()
    if note:
        text = textwrap.shorten(f"{text}: {note}", width=max(w // 12, 20), placeholder="...")
    draw.text((w // 2 if not note else w // 4, 25), text, fill=_COLOURS[status])
    return np.asarray(img)


class EpisodeVideo:
    """Streams frames to an MP4 as the episode runs (nothing held in memory); ``finish`` holds
    the outcome on the last second and names the file by it (``<stem>_<outcome>.mp4``)."""

    def __init__(self, folder: Path, stem: str, instruction: str, *, size: int = 256,
                 fps: int = FPS) -> None:
        imageio = _imageio()
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.stem = stem
        self.path = self.folder / f"{stem}_running.mp4"
        self.instruction = instruction
        self.size = int(size)
        self.frames = 0
        self._last: tuple | None = None
        self._writer = imageio.get_writer(str(self.path), fps=fps, codec="libx264",
                                          quality=6, macro_block_size=16,
                                          ffmpeg_log_level="error")

    def add(self, raw_images, step: int, success: bool) -> None:
        self._writer.append_data(compose(raw_images, self.instruction, step,
                                         "success" if success else "running"))
        self._last = (raw_images, step)
        self.frames += 1

    def finish(self, outcome: str, note: str = "") -> Path:
        """Hold ``outcome`` (success, failure: steps used up, refused) for the last second,
        close, and rename the file to ``<stem>_<outcome>.mp4``; returns the new path."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome {outcome!r}; one of {', '.join(OUTCOMES)}")
        if self._last is None:  # nothing rendered (a refused instruction): a black scene
            black = np.zeros((self.size, self.size, 3), np.uint8)
            self._last = ((black, black), 0)
        images, step = self._last
        frame = compose(images, self.instruction, step, outcome, note)
        for _ in range(OUTCOME_FRAMES):
            self._writer.append_data(frame)
            self.frames += 1
        self.close()
        final = self.folder / f"{self.stem}_{outcome}.mp4"
        self.path.replace(final)
        self.path = final
        return final

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def check_video_support() -> None:
    """Fail before anything runs when videos are asked for and cannot be written."""
    _imageio()
