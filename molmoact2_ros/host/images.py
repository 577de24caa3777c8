"""Camera frames to MolmoAct2 ``pixel_values``: decode, flip, resize, normalise, patchify."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any

import numpy as np

from ..errors import ObservationError
from ..util.threads import threads_from_env
from .image_header import (
    MAX_IMAGE_SIDE_PX,
    check_compressed_header,
    check_image_area,
    check_raw_encoding,
)
from .resample import normalise_into, patch_view, resize_levels
from .resample_jit import resize_normalise_into

#: sensor_msgs/Image encodings we decode: name -> (bytes per pixel, byte index of R, G, B).
ENCODINGS: dict[str, tuple[int, tuple[int, int, int]]] = {
    "rgb8": (3, (0, 1, 2)),
    "bgr8": (3, (2, 1, 0)),
    "rgba8": (4, (0, 1, 2)),
    "bgra8": (4, (2, 1, 0)),
    "mono8": (1, (0, 0, 0)),
}
#: Side of the square the vision tower sees, and its patch edge (host_glue.md §2.2).
IMAGE_SIZE = 378
PATCH_SIZE = 14


def _as_byte_array(data: Any, what: str) -> np.ndarray:
    """View ``data`` as flat uint8 without copying when its buffer allows it."""
    if isinstance(data, np.ndarray):
        if data.dtype != np.uint8:
            raise ObservationError(
                f"{what} is a {data.dtype} array; pass the raw uint8 bytes of the message"
            )
        return data.reshape(-1)
    try:
        view = memoryview(data)
    except TypeError:
        raise ObservationError(
            f"{what} is a {type(data).__name__}; pass bytes, bytearray, memoryview, "
            "array.array('B') or a uint8 numpy array"
        ) from None
    if view.itemsize != 1:
        raise ObservationError(
            f"{what} has {view.itemsize}-byte items (format {view.format!r}); "
            "pass the raw uint8 bytes of the message"
        )
    if not view.c_contiguous:
        view = memoryview(view.tobytes())
    if view.ndim != 1 or view.format != "B":
        view = view.cast("B")
    return np.frombuffer(view, dtype=np.uint8)


def _as_int(value: Any, what: str) -> int:
    """Accept Python or numpy integers; anything else is a malformed field or argument."""
    try:
        return operator.index(value)
    except TypeError:
        raise ObservationError(
            f"{what} is {value!r} ({type(value).__name__}); it must be an integer"
        ) from None


def decode_image(encoding: str, height: int, width: int, step: int, data: Any, *,
                 max_side_px: int = MAX_IMAGE_SIDE_PX) -> np.ndarray:
    """Raw sensor_msgs/Image fields -> C-contiguous uint8 [H, W, 3] RGB.

    Rows are read through ``step`` so row padding is skipped without a copy; the only copy is
    the final channel reorder. ``is_bigendian`` does not matter for 8-bit encodings.
    """
    spec = ENCODINGS.get(encoding)
    if spec is None:
        check_raw_encoding(str(encoding))
        raise ObservationError(
            f"Image.encoding {encoding!r} is not supported (supported: {', '.join(ENCODINGS)}); "
            "set the camera driver to rgb8 or use CompressedImage"
        )
    channels, order = spec
    height, width = _as_int(height, "Image.height"), _as_int(width, "Image.width")
    step = _as_int(step, "Image.step")
    if height <= 0 or width <= 0:
        raise ObservationError(
            f"Image size {width}x{height} (width x height) must be positive; "
            "the camera sent an empty frame"
        )
    check_image_area(width, height, max_side_px, "Image")
    row_bytes = width * channels
    if step < row_bytes:
        raise ObservationError(
            f"Image.step {step} is smaller than width*channels = {width}*{channels} = {row_bytes} "
            f"for {encoding}; fix the driver's step or the declared encoding/width"
        )
    flat = _as_byte_array(data, "Image.data")
    expected = step * height
    if flat.size < expected:
        raise ObservationError(
            f"Image.data is truncated: expected step*height = {step}*{height} = {expected} bytes, "
            f"got {flat.size}; the message was cut or step/height are wrong"
        )
    if flat.size > expected:
        raise ObservationError(
            f"Image.data has {flat.size} bytes but step*height = {step}*{height} = {expected}; "
            "step or height do not describe this buffer"
        )
    pixels = flat.reshape(height, step)[:, :row_bytes].reshape(height, width, channels)
    if encoding == "mono8":
        return np.ascontiguousarray(np.broadcast_to(pixels, (height, width, 3)))
    if order == (0, 1, 2):
        rgb = pixels[:, :, :3]
    else:
        rgb = pixels[:, :, order[0] :: -1]
    return np.array(rgb, dtype=np.uint8, order="C", copy=True)


def decode_compressed(fmt: str, data: Any, *, max_side_px: int = MAX_IMAGE_SIDE_PX) -> np.ndarray:
    """sensor_msgs/CompressedImage (jpeg/png) -> uint8 [H, W, 3] RGB via OpenCV, else Pillow.

    The header is checked first (PNG/JPEG, 8-bit, at most ``max_side_px`` a side), so a
    decompression bomb or a 16-bit frame is refused without being decoded."""
    fmt_l = fmt.lower()
    if "compresseddepth" in fmt_l or (
        fmt_l.strip() and not any(k in fmt_l for k in ("jpeg", "jpg", "png"))
    ):
        raise ObservationError(
            f"CompressedImage.format {fmt!r} is not a jpeg/png colour image; "
            "publish the camera through image_transport's 'compressed' plugin (jpeg or png)"
        )
    buf = _as_byte_array(data, "CompressedImage.data")
    if buf.size == 0:
        raise ObservationError("CompressedImage.data is empty; the camera sent no frame")
    _reject_deep(fmt)
    check_compressed_header(fmt, buf, max_side_px)
    try:
        import cv2
    except ImportError:
        cv2 = None
    if cv2 is not None:
        try:
            bgr = cv2.imdecode(buf, cv2.IMREAD_COLOR)
        except Exception:  # cv2.error on some malformed headers, None on others
            bgr = None
        if bgr is None or bgr.ndim != 3 or bgr.shape[2] != 3:
            raise ObservationError(
                f"CompressedImage.data ({buf.size} bytes, format {fmt!r}) could not be decoded; "
                "the frame is corrupt or not jpeg/png"
            )
        return np.ascontiguousarray(bgr[:, :, ::-1], dtype=np.uint8)
    try:
        from PIL import Image
    except ImportError:
        raise ObservationError(
            "decoding CompressedImage needs OpenCV or Pillow; "
            "pip install opencv-python-headless (or pillow), or publish raw rgb8 Images"
        ) from None
    import io

    try:
        with Image.open(io.BytesIO(buf.tobytes())) as pil:
            rgb = np.asarray(pil.convert("RGB"), dtype=np.uint8)
    except Exception as exc:  # Pillow raises several unrelated types for bad data
        raise ObservationError(
            f"CompressedImage.data ({buf.size} bytes, format {fmt!r}) could not be decoded "
            f"({exc}); the frame is corrupt or not jpeg/png"
        ) from None
    return np.ascontiguousarray(rgb)


def _reject_deep(fmt: str) -> None:
    """16-bit formats (mono16/rgb16, compressedDepth) would be cut to 8 bits silently by the
    decoders; the policy needs 8-bit colour, so they are refused with the reason (a 16-bit
    PNG under an 8-bit format name is caught from its header by ``check_compressed_header``)."""
    encoding = fmt.split(";")[0].strip().lower()
    if "16" in encoding:
        raise ObservationError(f"CompressedImage.format {fmt!r} is a 16-bit image; the policy "
                               "needs 8-bit colour (publish rgb8/bgr8 through jpeg or png)")


#: How a camera is mounted, undone before anything else (parameters ``flip_images.primary``
#: and ``flip_images.wrist``): upright, upside down, mirrored top-bottom or left-right.
MOUNT_ROTATIONS = ("none", "180", "vflip", "hflip")


def mount_rotate(img: np.ndarray, how: str) -> np.ndarray:
    """Undo a camera's mount: ``180`` flips both axes, ``vflip`` the rows, ``hflip`` the
    columns (a contiguous copy; ``none`` returns ``img`` itself). It runs before the
    bundle's own ``flip_images_180`` convention, which is about the training renders."""
    if how == "none":
        return img
    views = {"180": (slice(None, None, -1), slice(None, None, -1)),
             "vflip": (slice(None, None, -1), slice(None)),
             "hflip": (slice(None), slice(None, None, -1))}
    if how not in views:
        raise ObservationError(f"mount rotation {how!r}; choose one of "
                               f"{', '.join(MOUNT_ROTATIONS)}")
    return np.ascontiguousarray(img[views[how]])


def mount_images(images: Sequence[np.ndarray], mounts: Sequence[str]) -> tuple:
    """Each camera's frame with its mount undone (primary first, wrist second)."""
    return tuple(mount_rotate(img, how) for img, how in zip(images, mounts)) + tuple(
        images[len(mounts):])


def flip_180(img: np.ndarray) -> np.ndarray:
    """Rotate by 180° (flip H and W) as a view: raw LIBERO/robosuite renders are upside down."""
    return img[::-1, ::-1]


def _check_rgb_u8(img: Any, what: str) -> np.ndarray:
    """Reject anything that is not a uint8 [H, W, 3] array, naming ``what``."""
    if not isinstance(img, np.ndarray):
        raise ObservationError(f"{what} is a {type(img).__name__}; pass a uint8 [H, W, 3] array")
    if img.dtype != np.uint8:
        raise ObservationError(
            f"{what} has dtype {img.dtype}; convert to uint8 RGB (0..255) before preprocessing"
        )
    if img.ndim != 3 or img.shape[2] != 3 or img.shape[0] == 0 or img.shape[1] == 0:
        raise ObservationError(
            f"{what} has shape {img.shape}; expected [H, W, 3] RGB (decode mono/RGBA first)"
        )
    return img


def resize_bilinear(img_u8: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """uint8 [H, W, 3] -> uint8 [out_h, out_w, 3], torchvision ``Resize(antialias=False)`` math.

    Float32, half-pixel centres, no antialias, round half-to-even: what the MolmoAct2 processor
    does to a uint8 frame, so the host reproduces its pixels rather than OpenCV's fixed point.
    Bit-exact with torch's generic CPU kernel (used with >1 thread when out_h + out_w > 128);
    its single-thread / tiny-output vectorised kernel sums differently and can differ by 1.
    """
    _check_rgb_u8(img_u8, "image")
    out_h, out_w = _as_int(out_h, "out_h"), _as_int(out_w, "out_w")
    if out_h <= 0 or out_w <= 0:
        raise ObservationError(f"resize target {out_h}x{out_w} must be positive")
    return resize_levels(img_u8, out_h, out_w, False).astype(np.uint8)


def to_unit_range(u8: np.ndarray) -> np.ndarray:
    """uint8 -> float32 ``2*u/255 - 1`` in [-1, 1] (mean = std = 0.5 normalisation).

    Evaluated as the processor does, ``u/255`` then ``*2 - 1``, each step rounded to float32.
    """
    x = np.divide(u8, np.float32(255.0), dtype=np.float32)
    x *= np.float32(2.0)
    x -= np.float32(1.0)
    return x


def patchify(x: np.ndarray, patch: int = PATCH_SIZE) -> np.ndarray:
    """[S, S, C] -> [(S/p)^2, p*p*C]: patch ``row*grid + col``, element ``(dy*p + dx)*C + c``."""
    size = x.shape[0]
    if x.ndim != 3 or x.shape[1] != size or size % patch:
        raise ObservationError(
            f"patchify needs a square [S, S, C] image with S divisible by {patch}; got {x.shape}"
        )
    grid = size // patch
    return patch_view(x, patch).reshape(grid * grid, patch * patch * x.shape[2])


def _check_out(out: np.ndarray, shape: tuple[int, ...]) -> None:
    """The caller's buffer must be exactly the pixel_values layout so views can write into it."""
    if not isinstance(out, np.ndarray) or out.dtype not in (np.float32, np.float16):
        kind = getattr(out, "dtype", type(out).__name__)
        raise ObservationError(f"out buffer is {kind}; it must be a float32 or float16 array")
    if out.shape != shape:
        raise ObservationError(f"out buffer has shape {out.shape}; pixel_values needs {shape}")
    if not out.flags.c_contiguous or not out.flags.writeable:
        raise ObservationError("out buffer must be C-contiguous and writeable")


@lru_cache(maxsize=1)
def _camera_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=2, thread_name_prefix="molmoact2-preprocess")


def preprocess(
    images: Sequence[np.ndarray],
    *,
    size: int = IMAGE_SIZE,
    patch: int = PATCH_SIZE,
    flip: bool = False,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """RGB uint8 frames (agentview first, wrist second) -> ``pixel_values`` [1, n, grid², p²·3].

    ``flip`` applies :func:`flip_180` first (only for raw LIBERO renders). With ``out`` the
    result is written into the caller's float32/float16 buffer, e.g. a shared input tensor.
    """
    if size <= 0 or patch <= 0 or size % patch:
        raise ObservationError(f"size {size} must be a positive multiple of patch {patch}")
    if len(images) == 0:
        raise ObservationError("preprocess got no camera images; pass agentview then wrist")
    checked = [_check_rgb_u8(img, f"camera {i} image") for i, img in enumerate(images)]
    grid = size // patch
    shape = (1, len(checked), grid * grid, patch * patch * 3)
    if out is None:
        out = np.empty(shape, dtype=np.float32)
    else:
        _check_out(out, shape)
    def one_camera(cam: int) -> None:
        img = checked[cam]
        if resize_normalise_into(img, size, patch, flip, out[0, cam]):
            return  # the compiled one-pass kernel (numba installed and self-checked)
        if img.shape[:2] == (size, size):  # torch's identity resize: lambda 0, exact copy
            levels: np.ndarray = flip_180(img) if flip else img
        else:
            levels = resize_levels(img, size, size, flip)
        normalise_into(levels, patch, out[0, cam])

    # numpy releases the GIL in these loops: the cameras run side by side (scratch buffers
    # are per thread), each writing its own slice of ``out``. The calling thread takes the
    # first camera itself: one hand-off less, which matters when the cores are busy.
    # with MOLMOACT2_THREADS=1 (a Ray actor of one CPU) every camera runs on this thread
    rest = range(1, len(checked))
    side_by_side = threads_from_env() != 1
    others = [_camera_pool().submit(one_camera, cam) for cam in rest] if side_by_side else []
    try:
        for cam in [0] if side_by_side else [0, *rest]:
            one_camera(cam)
    finally:
        for future in others:
            future.result()
    return out
