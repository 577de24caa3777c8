"""Independent numpy re-implementation of the host glue (host_glue.md §2–§5, §8–§9) for goldens.

Deliberately shares no code with ``molmoact2_ros.host``: it is what that code is tested against.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np


class PromptTooLong(ValueError):
    """The prompt needs more positions than the variant's sequence length."""


# -- images (§2.2) -------------------------------------------------------------------------------
def _fma(w0: np.ndarray, a: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 ``w0·a + c`` with one rounding (w0, a float32: the product is exact in float64)."""
    exact = w0.astype(np.float64) * a.astype(np.float64) + c.astype(np.float64)
    return exact.astype(np.float32)


def _linear_taps(in_size: int, out_size: int) -> tuple[np.ndarray, ...]:
    """Source taps and weights of torch's bilinear kernel (align_corners=False).

    ``src = scale·(dst+0.5) − 0.5`` is one float32 fused multiply-add in torch's CPU kernel.
    """
    scale = np.float32(in_size) / np.float32(out_size)
    half = np.arange(out_size, dtype=np.float32) + np.float32(0.5)
    src = _fma(np.full(out_size, scale, dtype=np.float32), half, np.full(out_size, -0.5))
    src = np.maximum(src, np.float32(0.0))
    i0 = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
    lam1 = np.clip(src - i0.astype(np.float32), 0.0, 1.0).astype(np.float32)
    lam0 = (np.float32(1.0) - lam1).astype(np.float32)
    i1 = np.minimum(i0 + 1, in_size - 1)
    return i0, i1, lam0, lam1


def resize_bilinear_uint8(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """torchvision ``resize(uint8 tensor, bilinear, antialias=False)``: float32, round half-even.

    The processor resizes ``permute(from_numpy(hwc), [2, 0, 1])``, a channels-last view, so
    torch runs its channels-last CPU kernel: per output value the four tap weights are the
    float32 products ``h·w`` of the row and column lambdas, summed as the compiled chain
    ``fma(t11, w11, fma(t10, w10, fma(t00, w00, t01·w01)))`` (not the separable width-then-
    height passes of its channels-first kernel).
    """
    src = np.asarray(image, dtype=np.uint8).astype(np.float32)
    if src.shape[:2] == (height, width):
        return np.asarray(image, dtype=np.uint8).copy()
    x0, x1, wx0, wx1 = _linear_taps(src.shape[1], width)
    y0, y1, wy0, wy1 = _linear_taps(src.shape[0], height)
    h0, h1 = wy0[:, None, None], wy1[:, None, None]
    v0, v1 = wx0[None, :, None], wx1[None, :, None]
    w00, w01 = (h0 * v0).astype(np.float32), (h0 * v1).astype(np.float32)
    w10, w11 = (h1 * v0).astype(np.float32), (h1 * v1).astype(np.float32)
    top, bottom = src[y0], src[y1]
    out = _fma(w00, top[:, x0], (w01 * top[:, x1]).astype(np.float32))
    out = _fma(w10, bottom[:, x0], out)
    out = _fma(w11, bottom[:, x1], out)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def preprocess_image(image: np.ndarray, image_size: int = 378, patch: int = 14) -> np.ndarray:
    """uint8 HWC RGB → [patches, patch·patch·3] float32 in [−1, 1], (dy, dx, c) inside a patch."""
    u = resize_bilinear_uint8(image, image_size, image_size)
    x = u.astype(np.float32) / np.float32(255.0) * np.float32(2.0) - np.float32(1.0)
    g = image_size // patch
    x = x.reshape(g, patch, g, patch, 3).transpose(0, 2, 1, 3, 4)
    return np.ascontiguousarray(x.reshape(g * g, patch * patch * 3), dtype=np.float32)


def pixel_values(primary: np.ndarray, wrist: np.ndarray) -> np.ndarray:
    """[1, 2, 729, 588]: camera 0 = primary (agentview), camera 1 = wrist."""
    return np.stack([preprocess_image(primary), preprocess_image(wrist)])[None].astype(np.float32)


# -- text and state (§3) -------------------------------------------------------------------------
_PREFIX = re.compile(
    r"^(?:language instruction|instruction|task|goal)\s*:\s*|^(?:your|the) task is to\s+", re.I
)
_WRAPPERS = {'"': '"', "'": "'", "`": "`", "(": ")", "[": "]", "{": "}"}
_TRAILING = ".!?;:,)]}\"'` "


def normalize_task(text: str) -> str:
    """Collapse spaces, peel wrappers/prefixes/trailing punctuation, join sentences, lowercase."""
    t = " ".join(text.split())
    while True:
        before = t
        if len(t) >= 2 and _WRAPPERS.get(t[0]) == t[-1]:
            t = t[1:-1].strip()
        t = _PREFIX.sub("", t).strip()
        t = t.rstrip(_TRAILING)
        if t == before:
            break
    parts = [p.strip() for p in re.split(r"[.!?]+\s+", t) if p.strip()]
    return "; ".join(parts).lower()


def state_bins(state: Sequence[float], stats: Mapping, num_bins: int = 256) -> np.ndarray:
    """q01/q99-normalise (masked dims), nan_to_num, clip, ``rint((s+1)/2·(bins−1))``."""
    x = np.asarray(state, dtype=np.float32)
    q01 = np.asarray(stats["q01"], dtype=np.float32)
    q99 = np.asarray(stats["q99"], dtype=np.float32)
    mask = np.asarray(stats["mask"], dtype=bool)
    span = np.maximum(q99 - q01, np.float32(1e-6))
    s = np.where(mask, np.float32(2.0) * (x - q01) / span - np.float32(1.0), x).astype(np.float32)
    s = np.clip(np.nan_to_num(s, nan=0.0, posinf=1.0, neginf=-1.0), -1.0, 1.0)
    b = np.rint((s + np.float32(1.0)) / np.float32(2.0) * np.float32(num_bins - 1))
    return np.clip(b, 0, num_bins - 1).astype(np.int64)


def prompt_text(cfg: Mapping, task: str, bins: Sequence[int], image_tokens_per_camera: int) -> str:
    """Template filled with task/setup/control/state; each image placeholder expanded to a block."""
    state = (cfg["state_start_token"]
             + "".join(cfg["state_token_format"].format(int(b)) for b in bins)
             + cfg["state_end_token"])
    text = cfg["template"].format(task=task, setup=cfg["setup"], control=cfg["control"],
                                  state=state)
    block = (cfg["image_start_token"] + cfg["image_patch_token"] * image_tokens_per_camera
             + cfg["image_end_token"])
    return text.replace(cfg["image_placeholder"], block)


class WordLevelTokenizer:
    """Specials matched first (longest first), then ``\\w+|[^\\w\\s]+`` words; unknown → [UNK]."""

    def __init__(self, vocab: Sequence[str], specials: Sequence[str], unk: str = "[UNK]") -> None:
        self.ids = {tok: i for i, tok in enumerate(vocab)}
        self.unk_id = self.ids[unk]
        ordered = sorted(specials, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(re.escape(s) for s in ordered) + ")")
        self._specials = set(specials)

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        for chunk in self._split.split(text):
            if chunk in self._specials:
                out.append(self.ids[chunk])
                continue
            out.extend(self.ids.get(w, self.unk_id) for w in re.findall(r"\w+|[^\w\s]+", chunk))
        return out

    def token_id(self, token: str) -> int:
        return self.ids[token]


def frame_ids(
    text_ids: Sequence[int], *, bos_id: int, pad_id: int, seq_len: int, padding_side: str
) -> tuple[np.ndarray, np.ndarray]:
    """BOS + ids padded to ``seq_len`` on ``padding_side`` → (input_ids int64, valid bool)."""
    ids = [bos_id, *text_ids]
    if len(ids) > seq_len:
        raise PromptTooLong(f"prompt has {len(ids)} tokens but the sequence holds {seq_len}")
    pad = seq_len - len(ids)
    valid = np.zeros(seq_len, dtype=bool)
    if padding_side == "right":
        full, valid[: len(ids)] = ids + [pad_id] * pad, True
    elif padding_side == "left":
        full, valid[pad:] = [pad_id] * pad + ids, True
    else:
        raise ValueError(f"padding side {padding_side!r}")
    return np.asarray(full, dtype=np.int64), valid


# -- embeddings, bias, masks (§4, §5, §8.3) ------------------------------------------------------
def embed(
    table_f16: np.ndarray, ids: np.ndarray, patch_id: int, image_features: np.ndarray
) -> np.ndarray:
    """[1, S, H]: ``wte[ids]``; the j-th <im_patch> row becomes ``wte(<im_patch>) + feature[j]``."""
    rows = table_f16[ids].astype(np.float32)
    positions = np.flatnonzero(ids == patch_id)
    if positions.shape[0] != image_features.shape[0]:
        raise ValueError(
            f"{positions.shape[0]} <im_patch> tokens for {image_features.shape[0]} features"
        )
    rows[positions] = table_f16[patch_id].astype(np.float32)[None, :] + image_features
    return rows[None].astype(np.float32)


def attention_bias(
    valid: np.ndarray, is_image: np.ndarray, *, bidirectional: bool, mask_value: float
) -> np.ndarray:
    """[1,1,S,S]: 0 iff ``valid[k] and (k <= q or (bidirectional and img[q] and img[k]))``."""
    s = valid.shape[0]
    q = np.arange(s)[:, None]
    k = np.arange(s)[None, :]
    allowed = k <= q
    if bidirectional:
        allowed = allowed | (is_image[:, None] & is_image[None, :])
    allowed = allowed & valid[None, :]
    bias = np.full((s, s), mask_value, dtype=np.float32)
    bias[allowed] = 0.0
    return bias[None, None]


def encoder_mask(ids: np.ndarray, valid: np.ndarray, eos_id: int, policy: str) -> np.ndarray:
    """[1, S] float32: 1 where the action expert may attend."""
    keep = valid.copy()
    if policy == "exclude_eos":
        keep &= ids != eos_id
    elif policy != "padding_only":
        raise ValueError(f"encoder mask policy {policy!r}")
    return keep.astype(np.float32)[None]


def action_dim_is_pad(action_dim: int, max_action_dim: int) -> np.ndarray:
    """[1, max_action_dim] float32, 1 for padded dims."""
    return (np.arange(max_action_dim) >= action_dim).astype(np.float32)[None]


# -- flow and de-normalisation (§8.1, §9) --------------------------------------------------------
def initial_noise(seed: int | Sequence[int], horizon: int, pad: np.ndarray) -> np.ndarray:
    """``default_rng(seed).standard_normal((1, T, A))`` in float32, padded dims zeroed; an
    observation's noise uses ``seed = [seed, stamp_ns]``."""
    x0 = np.random.default_rng(seed).standard_normal((1, horizon, pad.shape[-1])).astype(np.float32)
    return (x0 * (np.float32(1.0) - pad[:, None, :])).astype(np.float32)


def denormalize(actions: np.ndarray, stats: Mapping) -> np.ndarray:
    """Clip to [−1, 1]; masked dims ``(a+1)(q99−q01)/2 + q01``; unmasked (gripper) stay clipped."""
    a = np.clip(np.asarray(actions, dtype=np.float32), -1.0, 1.0)
    q01 = np.asarray(stats["q01"], dtype=np.float32)
    q99 = np.asarray(stats["q99"], dtype=np.float32)
    mask = np.asarray(stats["mask"], dtype=bool)
    y = (a + np.float32(1.0)) * (q99 - q01) / np.float32(2.0) + q01
    return np.where(mask, y, a).astype(np.float32)
