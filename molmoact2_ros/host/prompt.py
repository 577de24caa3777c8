"""Prompt → token ids, embeddings, attention bias and masks (host_glue §3–§5).

The fixed part of the prompt (everything but the 8 state tokens and the image features) is
tokenised and embedded once per instruction (``PromptPlan``); per observation only the state
rows and the image rows change (``PromptPlan.embed``).
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from ..bundle.conventions import Conventions
from ..bundle.schema import Field, check_fields, read_json_object
from ..bundle.variants import VariantSpec
from ..errors import BundleError, PromptError
from . import fp16

#: The model's ``_normalize_question_text`` (LeRobot's vendored MolmoAct2), character for
#: character: its prefixes, delimiters and sentence split.
_PREFIXES = (
    re.compile(r"^(?:task|instruction|language[_ ]instruction|goal)\s*[:\-]\s*", re.IGNORECASE),
    re.compile(r"^(?:the\s+task\s+is\s+to|your\s+task\s+is\s+to)\s+", re.IGNORECASE),
)
_SURROUNDING = "\"'`“”‘’[](){}"
_TRAILING = ".,!?;:,…"
_CLOSERS = "\"'”’)]}"


def normalize_instruction(text: str) -> str:
    """Task-text normalisation of the model's ``predict_action`` (host_glue §3.1): collapse
    whitespace, strip delimiters, prefixes and trailing punctuation until nothing changes,
    split sentences at every run of ``.!?`` (also inside a word) joined by ``; ``, lower-case."""
    text = re.sub(r"\s+", " ", str(text)).strip()
    if not text:
        return ""
    previous = None
    while text and text != previous:
        previous = text
        text = text.strip().strip(_SURROUNDING).strip()
        for pattern in _PREFIXES:
            text = pattern.sub("", text, count=1).strip()
        text = text.rstrip(_TRAILING).rstrip()
        text = text.rstrip(_CLOSERS).rstrip()
        text = text.rstrip(_TRAILING).rstrip()
    chunks = [chunk.strip() for chunk in re.split(r"[.!?]+", text) if chunk.strip()]
    if len(chunks) > 1:
        text = "; ".join(chunks)
    return text.lower()


@dataclass(frozen=True)
class PromptConfig:
    """Template and special-token names from ``host/prompt.json``."""

    template: str
    setup: str
    control: str
    image_placeholder: str = "<|image|>"
    image_start_token: str = "<im_start>"
    image_patch_token: str = "<im_patch>"
    image_end_token: str = "<im_end>"
    state_start_token: str = "<state_start>"
    state_end_token: str = "<state_end>"
    state_token_format: str = "<state_{}>"
    num_state_bins: int = 256
    bos_token: str = "<|im_end|>"
    eos_token: str = "<|im_end|>"
    pad_token: str = "<|endoftext|>"
    normalize_language: bool = True
    #: Where this config was read from (named in errors); not a prompt.json key.
    source: str = field(default="prompt.json", compare=False)

    @classmethod
    def from_json(cls, path: Path) -> PromptConfig:
        data = read_json_object(path, "host/prompt.json (molmoact2 export-host writes it)")
        kinds = {"str": str, "int": int, "bool": bool}
        schema = tuple(
            Field(f.name, kinds[f.type], required=f.name in ("template", "setup", "control"),
                  minimum=2 if f.name == "num_state_bins" else None)
            for f in fields(cls) if f.name != "source"
        )
        values = check_fields(path, data, schema, allow_unknown=False)
        config = cls(**values, source=str(path))
        config.check_template()
        return config

    def check_template(self) -> None:
        """The template names only {task}, {setup}, {control}, {state}, and names task/state."""
        try:
            names = {name for _, name, _, _ in string.Formatter().parse(self.template)
                     if name is not None}
        except ValueError as exc:
            raise BundleError(f"{self.source}: template is not a format string ({exc}); "
                              "escape literal braces as {{ }}") from None
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "str" and f.name not in ("template", "setup", "control", "source") \
                    and not value.strip():
                raise BundleError(f"{self.source}: {f.name} is empty; it must name a token, "
                                  f"e.g. {getattr(PromptConfig, f.name)!r}")
        allowed = {"task", "setup", "control", "state"}
        if names - allowed or not {"task", "state"} <= names:
            raise BundleError(
                f"{self.source}: template fields {sorted(names)}; allowed "
                f"{sorted(allowed)}, and {{task}} and {{state}} are required")
        if not self.state_token_format.count("{}") == 1:
            raise BundleError(f"{self.source}: state_token_format {self.state_token_format!r} "
                              "must contain one '{}', e.g. '<state_{}>'")

    def reserved_tokens(self) -> tuple[str, ...]:
        """Marker tokens an instruction must not contain (they would corrupt the prompt)."""
        return (self.image_placeholder, self.image_start_token, self.image_patch_token,
                self.image_end_token, self.state_start_token, self.state_end_token,
                self.bos_token, self.eos_token, self.pad_token, "<|im_start|>", "<|im_end|>",
                "<|endoftext|>")


class Tokenizer:
    """A ``tokenizers`` tokenizer plus the special-token ids the prompt needs."""

    def __init__(self, path: Path) -> None:
        try:
            from tokenizers import Tokenizer as HFTokenizer
        except ImportError:
            raise BundleError("prompt building needs the 'tokenizers' package, a core dependency: "
                              "pip install 'tokenizers>=0.15,<1'") from None
        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on bad files
            raise BundleError(f"{path} cannot be loaded as tokenizer.json ({exc})") from None
        self.path = Path(path)

    def token_id(self, token: str) -> int:
        tid = self._tok.token_to_id(token)
        if tid is None:
            raise BundleError(
                f"{self.path} has no token {token!r}; it is not this model's tokenizer"
            )
        return int(tid)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def added_tokens(self) -> list[str]:
        """Every added or special token of this tokenizer (what an instruction must not
        contain: each would be tokenised as that token, not as text)."""
        try:
            tokens = self._tok.get_added_tokens_decoder().values()
        except AttributeError:  # tokenizers < 0.14
            return []
        return sorted({t.content for t in tokens if t.content.strip()}, key=len, reverse=True)


class EmbeddingTable:
    """The token embedding table, memory-mapped (float16 ``.npy``, [vocab, hidden])."""

    def __init__(self, path: Path) -> None:
        try:
            table = np.load(path, mmap_mode="r", allow_pickle=False)
        except FileNotFoundError:
            raise BundleError(
                f"{path} is missing; the bundle's host/ needs embeddings.npy"
            ) from None
        except ValueError as exc:
            raise BundleError(f"{path} is truncated or not a .npy array ({exc})") from None
        if table.ndim != 2:
            raise BundleError(f"{path} has shape {table.shape}; expected [vocab, hidden]")
        if table.dtype not in (np.float16, np.float32):
            raise BundleError(
                f"{path} holds {table.dtype} values; the embedding table must be float16 (or "
                "float32): re-export it with molmoact2 export-host")
        self.path = Path(path)
        self.table = table

    @property
    def hidden(self) -> int:
        return int(self.table.shape[1])

    def rows(self, ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(ids)
        if ids.size and (ids.min() < 0 or ids.max() >= self.table.shape[0]):
            raise BundleError(
                f"token id {int(ids.max())} is outside {self.path} ({self.table.shape[0]} rows); "
                "the tokenizer and embedding table do not belong together"
            )
        return np.asarray(self.table[ids], dtype=np.float32)


@dataclass
class PromptPlan:
    """Everything about a prompt that does not change between observations."""

    instruction: str
    input_ids: np.ndarray  # [S] int64, with placeholder state ids
    valid: np.ndarray  # [S] bool
    is_image: np.ndarray  # [S] bool
    state_positions: np.ndarray  # [8] int64
    patch_positions: np.ndarray  # [image tokens] int64
    base_embeddings: np.ndarray  # [S, H] float32
    attention_bias: np.ndarray  # [1, 1, S, S] float32
    encoder_mask: np.ndarray  # [1, S] float32
    state_base_id: int
    num_valid: int
    add_image_to_patch_embedding: bool
    state_rows: np.ndarray  # [bins, H] float32, rows of <state_0..bins-1>
    _base_by_dtype: dict = field(default_factory=dict, repr=False)
    _run_cache: tuple | None = field(default=None, repr=False)

    def ids_for(self, bins: np.ndarray) -> np.ndarray:
        ids = self.input_ids.copy()
        ids[self.state_positions] = self.state_base_id + bins
        return ids

    def embed(
        self, state_bins: np.ndarray, image_embeds: np.ndarray, out: np.ndarray | None = None
    ) -> np.ndarray:
        """hidden_states [1, S, H]: base rows + state rows + image features at <im_patch>.

        Into a float16 buffer every row is the float32 result rounded once (tables are cast
        once per plan; the image rows are one float32 add and one rounding per value).
        """
        seq, hidden = self.base_embeddings.shape
        if out is None:
            out = np.empty((1, seq, hidden), dtype=np.float32)
        view = out.reshape(seq, hidden)
        feats = np.asarray(image_embeds).reshape(-1, hidden)
        if feats.shape[0] != self.patch_positions.shape[0]:
            raise PromptError(
                f"vision emitted {feats.shape[0]} image features but the prompt has "
                f"{self.patch_positions.shape[0]} <im_patch> positions"
            )
        base, state = self._tables(view.dtype)
        patch_runs, other_runs = self._runs()
        for start, stop in other_runs:
            view[start:stop] = base[start:stop]
        view[self.state_positions] = state[np.asarray(state_bins)]
        first = 0
        for start, stop in patch_runs:
            dst, rows = view[start:stop], feats[first : first + stop - start]
            first += stop - start
            if not self.add_image_to_patch_embedding:
                dst[...] = rows
            elif dst.dtype == np.float16 and rows.dtype == np.float16:
                fp16.add_into(base[start:stop], rows, dst)
            elif dst.dtype == np.float16:
                fp16.add_reference(self.base_embeddings[start:stop], rows, dst)
            else:
                np.add(base[start:stop], rows, out=dst, dtype=dst.dtype)
        return out

    def _tables(self, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
        """Base and state rows in the buffer's dtype, cast once per plan (a plain copy after)."""
        cached = self._base_by_dtype.get(dtype)
        if cached is None:
            cached = (self.base_embeddings.astype(dtype), self.state_rows.astype(dtype))
            self._base_by_dtype[dtype] = cached
        return cached

    def _runs(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """Contiguous [start, stop) runs of the <im_patch> rows and of all other rows."""
        cached = self._run_cache  # keyed by the positions: a caller may replace them
        if cached is None or not np.array_equal(cached[0], self.patch_positions):
            is_patch = np.zeros(self.base_embeddings.shape[0], dtype=bool)
            is_patch[self.patch_positions] = True  # ascending: runs take features in order
            edges = np.flatnonzero(np.diff(is_patch.astype(np.int8))) + 1
            bounds = [0, *edges.tolist(), is_patch.size]
            runs = list(zip(bounds[:-1], bounds[1:]))
            cached = (self.patch_positions.copy(), [r for r in runs if is_patch[r[0]]],
                      [r for r in runs if not is_patch[r[0]]])
            self._run_cache = cached
        return cached[1], cached[2]


class PromptBuilder:
    """Builds ``PromptPlan``s for one variant from the bundle's host assets."""

    def __init__(
        self,
        config: PromptConfig,
        tokenizer: Tokenizer,
        table: EmbeddingTable,
        conventions: Conventions,
        variant: VariantSpec,
        *,
        setup: str | None = None,
        control: str | None = None,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer
        self.table = table
        self.conventions = conventions
        self.variant = variant
        self.setup = setup if setup is not None else config.setup
        self.control = control if control is not None else config.control
        def tid(token: str) -> int:
            try:
                return tokenizer.token_id(token)
            except BundleError:
                name = next((f.name for f in fields(config)
                             if getattr(config, f.name) == token), "state_token_format")
                raise BundleError(
                    f"{config.source}: {name} names token {token!r}, which {tokenizer.path} "
                    "does not have; fix prompt.json, or use the tokenizer.json of the model "
                    "the bundle was exported from") from None

        self.bos_id = tid(config.bos_token)
        self.eos_id = tid(config.eos_token)
        self.pad_id = tid(config.pad_token)
        self.patch_id = tid(config.image_patch_token)
        self.image_ids = {
            tid(config.image_start_token), self.patch_id, tid(config.image_end_token)
        }
        self.state_start_id = tid(config.state_start_token)
        self.state_end_id = tid(config.state_end_token)
        self.state_base_id = tid(config.state_token_format.format(0))
        last = tid(config.state_token_format.format(config.num_state_bins - 1))
        if last - self.state_base_id != config.num_state_bins - 1:
            raise BundleError(
                f"{tokenizer.path}: state tokens are not contiguous ids; prompt building "
                "assumes <state_0>..<state_N-1> are consecutive"
            )
        self._state_token = re.compile(
            re.escape(config.state_token_format).replace(r"\{\}", "{}").format(r"\d+"))
        self._state_rows = table.rows(np.arange(self.state_base_id, last + 1))
        self._check_markers(tid)
        self._added = tokenizer.added_tokens()
        block = (
            config.image_start_token
            + config.image_patch_token * variant.image_tokens_per_camera
            + config.image_end_token
        )
        self._image_block = block
        self._fixed: int | None = None

    def _check_markers(self, tid) -> None:
        """At load, blame the bundle, not a later instruction: every marker token must
        tokenise as itself (an added token), and the template must hold one image
        placeholder per camera."""
        config = self.config
        markers = {"image_start_token": config.image_start_token,
                   "image_patch_token": config.image_patch_token,
                   "image_end_token": config.image_end_token,
                   "state_start_token": config.state_start_token,
                   "state_end_token": config.state_end_token,
                   "state_token_format": config.state_token_format.format(0)}
        for name, token in markers.items():
            if self.tokenizer.encode(token) != [tid(token)]:
                raise BundleError(
                    f"{self.tokenizer.path}: {token!r} ({config.source} field {name}) does not "
                    "tokenise as one token: the tokenizer has it in its vocabulary but not as "
                    "an added token; use the tokenizer.json the bundle was exported with")
        fixed = config.template.format(task="", setup=self.setup, control=self.control,
                                       state="")
        found = fixed.count(config.image_placeholder)
        if found != self.variant.num_cameras:
            raise BundleError(
                f"{config.source}: template holds image_placeholder "
                f"{config.image_placeholder!r} {found} times; variant {self.variant.name} "
                f"needs {self.variant.num_cameras} (one per camera)")

    def text(self, instruction: str, bins: np.ndarray | None = None) -> str:
        """The prompt string (before BOS and padding)."""
        fmt = self.config.state_token_format
        bins = np.zeros(self.variant.state_dim, dtype=np.int64) if bins is None else bins
        state = (
            self.config.state_start_token
            + "".join(fmt.format(int(b)) for b in bins)
            + self.config.state_end_token
        )
        text = self.config.template.format(
            task=instruction, setup=self.setup, control=self.control, state=state
        )
        return text.replace(self.config.image_placeholder, self._image_block)

    def fixed_length(self) -> int:
        """Tokens of the prompt without the task: BOS, template, image blocks, state block."""
        if self._fixed is None:
            self._fixed = 1 + len(self.tokenizer.encode(self.text("")))
        return self._fixed

    def prompt_length(self, instruction: str) -> int:
        """Tokens of the whole prompt for ``instruction`` (checked and normalised as ``plan``
        does); the task's share is this minus ``fixed_length()``."""
        return 1 + len(self.tokenizer.encode(self.text(self._task(instruction))))

    def too_long(self, instruction: str, length: int) -> str:
        """Why a ``length``-token prompt does not fit: both counts and the tokens to cut."""
        seq, fixed = self.variant.seq_len, self.fixed_length()
        return (f"instruction {instruction!r} is {length - fixed} tokens but variant "
                f"{self.variant.name} leaves {seq - fixed} for the task (S={seq}, {fixed} "
                f"fixed): shorten it by at least {length - seq} tokens, or re-export the "
                f"contexts with S >= {length}")

    def plan(self, instruction: str) -> PromptPlan:
        task = self._task(instruction)
        ids = [self.bos_id, *self.tokenizer.encode(self.text(task))]
        seq = self.variant.seq_len
        if len(ids) > seq:
            raise PromptError(self.too_long(instruction, len(ids)))
        n = len(ids)
        pad = [self.pad_id] * (seq - n)
        right = self.conventions.padding_side == "right"
        input_ids = np.asarray(ids + pad if right else pad + ids, dtype=np.int64)
        valid = np.zeros(seq, dtype=bool)
        if right:
            valid[:n] = True
        else:
            valid[seq - n :] = True
        is_image = np.isin(input_ids, list(self.image_ids)) & valid
        state_positions = self._state_positions(input_ids, valid)
        patch_positions = np.flatnonzero((input_ids == self.patch_id) & valid)
        if patch_positions.size != self.variant.image_tokens:
            raise BundleError(
                f"the template yields {patch_positions.size} <im_patch> tokens, expected "
                f"{self.variant.image_tokens}; prompt.json does not have 2 image placeholders"
            )
        base = self.table.rows(input_ids)
        add = not self.conventions.image_embeds_include_patch_embedding
        return PromptPlan(
            instruction=task,
            input_ids=input_ids,
            valid=valid,
            is_image=is_image,
            state_positions=state_positions,
            patch_positions=patch_positions,
            base_embeddings=base,
            attention_bias=attention_bias(valid, is_image, self.conventions),
            encoder_mask=encoder_mask(input_ids, valid, self.eos_id, self.conventions),
            state_base_id=self.state_base_id,
            num_valid=n,
            add_image_to_patch_embedding=add,
            state_rows=self._state_rows,
        )

    def _task(self, instruction: str) -> str:
        if not isinstance(instruction, str):
            raise PromptError(f"instruction must be a string, got {type(instruction).__name__}")
        try:
            instruction.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise PromptError(
                f"instruction is not UTF-8 text ({exc.reason} at character {exc.start}: "
                f"{instruction[exc.start]!r}); send plain text") from None
        task = normalize_instruction(instruction) if self.config.normalize_language else instruction
        if not task.strip():
            raise PromptError(
                "instruction is empty; set the 'instruction' parameter to the task, e.g. "
                "'put the bowl on the plate'"
            )
        self._check_reserved(instruction)
        self._check_reserved(task)
        return task

    def _check_reserved(self, text: str) -> None:
        """Model marker tokens in the instruction are refused, naming the token."""
        found = self._state_token.search(text)
        reserved = [*self.config.reserved_tokens(), *self._added]
        token = found.group(0) if found else next(
            (t for t in reserved if t and t in text), None)
        if token is None:
            lowered = text.lower()
            token = next((t for t in reserved if t and t.lower() in lowered), None)
        if token is not None:
            raise PromptError(
                f"instruction contains the reserved model token {token!r}; remove it "
                "(the tokenizer's added and special tokens cannot be part of a task "
                "instruction)")

    def _state_positions(self, ids: np.ndarray, valid: np.ndarray) -> np.ndarray:
        starts = np.flatnonzero((ids == self.state_start_id) & valid)
        width = self.variant.state_dim
        if starts.size != 1:
            raise PromptError(
                "the instruction must not contain state tokens; found "
                f"{starts.size} <state_start> tokens in the prompt"
            )
        first = int(starts[0]) + 1
        positions = np.arange(first, first + width, dtype=np.int64)
        if positions[-1] + 1 >= ids.shape[0] or ids[positions[-1] + 1] != self.state_end_id:
            raise BundleError("the state block did not tokenise to one token per state bin")
        return positions


def attention_bias(valid: np.ndarray, is_image: np.ndarray, conv: Conventions) -> np.ndarray:
    """[1,1,S,S]: 0 where ``valid[k] and (k <= q or both image tokens)``, mask value elsewhere."""
    seq = valid.shape[0]
    allowed = np.tril(np.ones((seq, seq), dtype=bool))
    if conv.bidirectional_image_attention:
        allowed |= is_image[:, None] & is_image[None, :]
    allowed &= valid[None, :]
    bias = np.where(allowed, np.float32(0.0), np.float32(conv.mask_value))
    return bias.reshape(1, 1, seq, seq).astype(np.float32)


def encoder_mask(
    ids: np.ndarray, valid: np.ndarray, eos_id: int, conv: Conventions
) -> np.ndarray:
    """[1,S]: 1 where the action expert may attend (host_glue §8.3)."""
    mask = valid.copy()
    if conv.encoder_mask == "exclude_eos":
        mask &= ids != eos_id
    return mask.astype(np.float32).reshape(1, -1)


def action_dim_is_pad(action_dim: int, max_action_dim: int) -> np.ndarray:
    """[1, max_action_dim]: 1.0 for padded action dims (7..31 for LIBERO)."""
    pad = np.ones((1, max_action_dim), dtype=np.float32)
    pad[0, :action_dim] = 0.0
    return pad
