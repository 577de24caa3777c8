"""Camera frames to MolmoAct2 ``pixel_values``: decode, flip, resize, normalise, patchify."""

from __future__ import annotations

import operator
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any, NamedTuple

import numpy as np

from ..errors import ObservationError
from .image_header import (
    MAX_IMAGE_SIDE_PX,
    check_compressed_header,
    check_image_side,
    check_raw_encoding,
)

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
    check_image_side(width, height, max_side_px, "Image")
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


def flip_180(img: np.ndarray) -> np.ndarray:
    """Rotate by 180° (flip H and W) as a view: raw LIBERO/robosuite renders are upside down."""
    return img[::-1, ::-1]


def _source_positions(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Torch's align_corners=False taps and lambda along one axis, bit for bit.

    Torch evaluates ``scale * (dst + 0.5) - 0.5`` in float32 as one fused multiply-add; the
    float64 evaluation below is exact before its single rounding to float32, i.e. an FMA.
    """
    scale = np.float32(in_size) / np.float32(out_size)
    half_dst = np.arange(out_size, dtype=np.float32) + np.float32(0.5)
    src = (np.float64(scale) * half_dst.astype(np.float64) - 0.5).astype(np.float32)
    src = np.maximum(src, np.float32(0.0))
    i0 = np.minimum(np.floor(src).astype(np.intp), in_size - 1)
    i1 = np.minimum(i0 + 1, in_size - 1)
    lam1 = np.clip(src - i0.astype(np.float32), np.float32(0.0), np.float32(1.0))
    return i0, i1, lam1


class _Plan(NamedTuple):
    """Precomputed gathers and weights for one (input, output, flip) geometry."""

    rows: np.ndarray  # input rows actually read
    r0: np.ndarray  # per output row: index into ``rows`` of the upper tap
    r1: np.ndarray
    wy0: np.ndarray  # [out_h, 1] float64 holding float32 values (for the emulated FMA)
    wy1: np.ndarray  # [out_h, 1] float32
    c0: np.ndarray  # per output (x, channel): flat column index of the left tap
    c1: np.ndarray
    wx0: np.ndarray  # [out_w*3] float64 holding float32 values, repeated per channel
    wx1: np.ndarray  # [out_w*3] float32


@lru_cache(maxsize=32)
def _plan(in_h: int, in_w: int, out_h: int, out_w: int, flip: bool) -> _Plan:
    """Build (and cache) the separable resize tables; ``flip`` mirrors the taps, not the pixels."""
    y0, y1, ly = _source_positions(in_h, out_h)
    x0, x1, lx = _source_positions(in_w, out_w)
    if flip:  # sampling the flipped image at i == sampling the original at n-1-i
        y0, y1 = in_h - 1 - y0, in_h - 1 - y1
        x0, x1 = in_w - 1 - x0, in_w - 1 - x1
    rows, inverse = np.unique(np.concatenate([y0, y1]), return_inverse=True)
    inverse = inverse.reshape(-1)
    chan = np.arange(3)
    wy1 = ly.reshape(-1, 1)
    wx1 = np.repeat(lx, 3)
    plan = _Plan(
        rows=rows,
        r0=inverse[:out_h],
        r1=inverse[out_h:],
        wy0=(np.float32(1.0) - wy1).astype(np.float64),
        wy1=wy1,
        c0=(x0[:, None] * 3 + chan).reshape(-1),
        c1=(x1[:, None] * 3 + chan).reshape(-1),
        wx0=(np.float32(1.0) - wx1).astype(np.float64),
        wx1=wx1,
    )
    for arr in plan:
        arr.setflags(write=False)
    return plan


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


#: Rows per block of the float64 FMA emulation: keeps temporaries cache-sized.
_BLOCK_ROWS = 64
_workspaces = threading.local()


def _scratch(name: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    """A per-thread reusable buffer: fresh multi-MB temporaries cost more in page faults
    than the arithmetic itself, and ROS executors may call in from several threads."""
    bufs = getattr(_workspaces, "bufs", None)
    if bufs is None:
        bufs = _workspaces.bufs = {}
    key = (name, shape, np.dtype(dtype).str)
    buf = bufs.get(key)
    if buf is None:
        if len(bufs) > 64:  # many geometries seen: start over rather than grow without bound
            bufs.clear()
        buf = bufs[key] = np.empty(shape, dtype=dtype)
    return buf


def _lerp_fma_rows(
    dst: np.ndarray, w0_f64: np.ndarray, a: np.ndarray, w1: np.ndarray, b: np.ndarray
) -> None:
    """dst = float32 ``fma(w0, a, w1*b)`` row block by row block: torch's compiled lerp.

    ``w0*a`` is exact in float64 (<= 48 significant bits), so adding the float32 ``w1*b`` and
    rounding once to float32 reproduces the fused multiply-add.
    """
    cols = dst.shape[1]
    for start in range(0, dst.shape[0], _BLOCK_ROWS):
        stop = min(start + _BLOCK_ROWS, dst.shape[0])
        n = stop - start
        acc = _scratch("acc", (_BLOCK_ROWS, cols), np.float64)[:n]
        tmp = _scratch("tmp", (_BLOCK_ROWS, cols), np.float32)[:n]
        per_row = w1.ndim == 2  # [rows, 1] height weights vs [cols] width weights
        w0 = w0_f64[start:stop] if per_row else w0_f64
        wb = w1[start:stop] if per_row else w1
        np.multiply(a[start:stop], w0, out=acc, dtype=np.float64)
        np.multiply(b[start:stop], wb, out=tmp, dtype=np.float32)
        np.add(acc, tmp, out=acc)
        np.copyto(dst[start:stop], acc, casting="same_kind")


def _resize_f32(img: np.ndarray, out_h: int, out_w: int, flip: bool) -> np.ndarray:
    """Bilinear resize to integer-valued float32 [out_h, out_w, 3] (rounded, clamped).

    Width pass, then height pass, each ``fma(l0, a, l1*b)`` in float32: the operation order of
    torch's generic CPU kernel, which is what the processor runs on a multi-core host. The
    result is a per-thread scratch buffer, valid until this thread's next call.
    """
    in_h, in_w = img.shape[:2]
    plan = _plan(in_h, in_w, out_h, out_w, flip)
    flat = np.ascontiguousarray(img).reshape(in_h, in_w * 3)
    if plan.rows.size < in_h:
        flat = flat[plan.rows]
    n_rows, cols = flat.shape[0], out_w * 3
    # mode="clip" only so that take() writes straight into ``out`` (indices are in range).
    left, right = (_scratch(k, (n_rows, cols), np.uint8) for k in ("left", "right"))
    np.take(flat, plan.c0, axis=1, out=left, mode="clip")
    np.take(flat, plan.c1, axis=1, out=right, mode="clip")
    rows = _scratch("rows", (n_rows, cols), np.float32)
    _lerp_fma_rows(rows, plan.wx0, left, plan.wx1, right)
    top, bottom, out = (_scratch(k, (out_h, cols), np.float32) for k in ("top", "bottom", "out"))
    np.take(rows, plan.r0, axis=0, out=top, mode="clip")
    np.take(rows, plan.r1, axis=0, out=bottom, mode="clip")
    _lerp_fma_rows(out, plan.wy0, top, plan.wy1, bottom)
    np.rint(out, out=out)
    np.clip(out, np.float32(0.0), np.float32(255.0), out=out)
    return out.reshape(out_h, out_w, 3)


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
    return _resize_f32(img_u8, out_h, out_w, False).astype(np.uint8)


def to_unit_range(u8: np.ndarray) -> np.ndarray:
    """uint8 -> float32 ``2*u/255 - 1`` in [-1, 1] (mean = std = 0.5 normalisation).

    Evaluated as the processor does, ``u/255`` then ``*2 - 1``, each step rounded to float32.
    """
    x = np.divide(u8, np.float32(255.0), dtype=np.float32)
    x *= np.float32(2.0)
    x -= np.float32(1.0)
    return x


def _patch_view(x: np.ndarray, patch: int) -> np.ndarray:
    """[S, S, C] -> [S/p, S/p, p, p, C] view in patch order (row, col, dy, dx, c)."""
    grid = x.shape[0] // patch
    return x.reshape(grid, patch, grid, patch, x.shape[2]).transpose(0, 2, 1, 3, 4)


def patchify(x: np.ndarray, patch: int = PATCH_SIZE) -> np.ndarray:
    """[S, S, C] -> [(S/p)^2, p*p*C]: patch ``row*grid + col``, element ``(dy*p + dx)*C + c``."""
    size = x.shape[0]
    if x.ndim != 3 or x.shape[1] != size or size % patch:
        raise ObservationError(
            f"patchify needs a square [S, S, C] image with S divisible by {patch}; got {x.shape}"
        )
    grid = size // patch
    return _patch_view(x, patch).reshape(grid * grid, patch * patch * x.shape[2])


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
        if img.shape[:2] == (size, size):  # torch's identity resize: lambda 0, exact copy
            pixels: np.ndarray = flip_180(img) if flip else img
        else:
            pixels = _resize_f32(img, size, size, flip)
        src = _patch_view(pixels, patch)
        dst = out[0, cam].reshape(grid, grid, patch, patch, 3)
        # Normalise straight into the caller's buffer; float16 goes through float32 scratch so
        # it equals the float32 result cast once.
        unit = dst if out.dtype == np.float32 else _scratch("unit", dst.shape, np.float32)
        np.divide(src, np.float32(255.0), out=unit, dtype=np.float32)
        unit *= np.float32(2.0)
        unit -= np.float32(1.0)
        if unit is not dst:
            np.copyto(dst, unit, casting="same_kind")

    # numpy releases the GIL in these loops: the cameras run side by side (scratch buffers
    # are per thread), each writing its own slice of ``out``.
    if len(checked) == 1:
        one_camera(0)
    else:
        list(_camera_pool().map(one_camera, range(len(checked))))
    return out
