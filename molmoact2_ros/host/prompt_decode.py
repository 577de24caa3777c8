"""The golden decoder: the exporter's prompt, read back from the golden ``llm_split0``
``hidden_states`` through the embedding table, diffed against the prompt this package builds.

Every text row of the golden is one embedding row (float16 in ``host/embeddings.npy``, so
within fp16 rounding of it); an image row is ``wte(<im_patch>)`` plus a vision feature (or the
feature alone) and is near no row. The decoded ids give the instruction, the padding side and
the place of every special token without the exporter's code (docs/host_glue.md §12).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ..bundle.bundle import Bundle
from ..bundle.golden import load_npz
from .prompt import EmbeddingTable, PromptBuilder, PromptConfig, Tokenizer

#: A row within this relative distance of a table row is that token (fp16 rounding is ~5e-4).
TEXT_ROW = 0.02
#: Columns of the table compared per block (bounds the memory of the nearest-row search).
BLOCK = 16384


@dataclass
class DecodedPrompt:
    """What the golden's rows say, what the package builds, and where they first differ."""

    golden_ids: np.ndarray  # [S]; image rows carry the <im_patch> id
    is_image: np.ndarray  # [S] rows near no table row
    package_ids: np.ndarray | None
    instruction: str | None
    padding_side: str | None
    pad_count: int
    first_difference: tuple[int, str, str] | None  # position, golden token, package token
    special_places: dict[str, list[int]] = field(default_factory=dict)
    golden_text: str = ""
    package_text: str = ""
    note: str = ""


def nearest_rows(rows: np.ndarray, table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index of the nearest table row for each row, and its relative distance."""
    rows = np.asarray(rows, np.float32)
    best = np.full(rows.shape[0], np.inf, np.float64)
    arg = np.zeros(rows.shape[0], np.int64)
    r2 = np.einsum("ij,ij->i", rows, rows).astype(np.float64)
    for start in range(0, table.shape[0], BLOCK):
        block = np.asarray(table[start:start + BLOCK], np.float32)
        d2 = r2[:, None] - 2.0 * (rows @ block.T) + np.einsum("ij,ij->i", block, block)[None]
        i = np.argmin(d2, axis=1)
        d = d2[np.arange(rows.shape[0]), i]
        better = d < best
        best[better], arg[better] = d[better], start + i[better]
    # the exact distance of the winner (the expansion above cancels badly near 0)
    exact = np.linalg.norm(rows - np.asarray(table[arg], np.float32), axis=1)
    return arg, exact / np.maximum(np.linalg.norm(rows, axis=1), 1e-12)


def _display(ids: np.ndarray, raw) -> str:
    """Decoded text with runs of one repeated token collapsed (``<im_patch>×196``)."""
    out, buf, i, ids = [], [], 0, [int(x) for x in ids]
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[i]:
            j += 1
        if j - i >= 2:
            out.append(raw.decode(buf, skip_special_tokens=False))
            out.append(f"{raw.id_to_token(ids[i])}×{j - i + 1}")
            buf = []
        else:
            buf += ids[i:j + 1]
        i = j + 1
    out.append(raw.decode(buf, skip_special_tokens=False))
    return "".join(out)


def decode_golden_prompt(bundle: Bundle, conventions=None) -> DecodedPrompt:
    """Decode ``golden/llm_split0_io.npz`` and diff it with the package's own prompt."""
    golden = load_npz(bundle.root / "golden" / "llm_split0_io.npz", ["hidden_states"],
                      what="the golden decoder")
    config = PromptConfig.from_json(bundle.host_path("prompt.json"))
    tokenizer = Tokenizer(bundle.host_path("tokenizer.json"))
    table = EmbeddingTable(bundle.host_path("embeddings.npy"))
    hidden = np.asarray(golden["hidden_states"], np.float32).reshape(-1, table.hidden)
    ids, rel = nearest_rows(hidden, table.table)
    patch_id = tokenizer.token_id(config.image_patch_token)
    is_image = rel > TEXT_ROW
    ids = np.where(is_image, patch_id, ids)
    raw = tokenizer._tok  # token strings of ids, special tokens included
    tokens = [raw.id_to_token(int(i)) or f"<id {int(i)}>" for i in ids]
    pad_id = tokenizer.token_id(config.pad_token)
    pads = np.flatnonzero(ids == pad_id)
    side, count = None, 0
    if pads.size:
        n = ids.size
        tail = n - np.argmax((ids != pad_id)[::-1]) if (ids != pad_id).any() else 0
        head = int(np.argmax(ids != pad_id))
        if tail < n and np.all(ids[tail:] == pad_id):
            side, count = "right", n - tail
        elif head > 0:
            side, count = "left", head
    text = raw.decode([int(i) for i in ids], skip_special_tokens=False)
    task = _instruction(text, config)
    specials = {}
    for token in {config.bos_token, config.eos_token, config.image_start_token,
                  config.image_end_token, config.state_start_token, config.state_end_token,
                  "<|im_start|>", "<action_output>", "<setup_start>", "<setup_end>",
                  "<control_start>", "<control_end>"}:
        tid = raw.token_to_id(token)
        if tid is not None:
            specials[token] = np.flatnonzero(ids == tid).tolist()
    decoded = DecodedPrompt(ids, is_image, None, task, side, count, None, specials,
                            _display(ids, raw))
    if task is None:
        decoded.note = ("the instruction was not found between 'The task is to' and "
                        "'The setup is' in the decoded prompt")
        return decoded
    conv = conventions if conventions is not None else bundle.conventions()
    builder = PromptBuilder(config, tokenizer, table, conv, bundle.variant)
    plan = builder.plan(task)
    bins = ids[plan.state_positions] - plan.state_base_id
    if np.any((bins < 0) | (bins >= config.num_state_bins)):
        bins = np.zeros_like(bins)  # the golden has no state tokens where the package puts them
    mine = plan.ids_for(bins)
    decoded.package_ids = mine
    decoded.package_text = _display(mine, raw)
    differ = np.flatnonzero(mine != ids)
    if differ.size:
        p = int(differ[0])
        decoded.first_difference = (p, tokens[p], raw.id_to_token(int(mine[p])) or "?")
    return decoded


def _instruction(text: str, config: PromptConfig) -> str | None:
    """The task text between the template's words around ``{task}``."""
    before, _, after = config.template.partition("{task}")
    lead = before.split("\n")[-1].strip()  # "The task is to"
    trail = after.split("{")[0].split("<")[0].strip(" .")  # "The setup is"
    if not lead or not trail:
        return None
    found = re.search(re.escape(lead) + r"\s*(.*?)\s*\.?\s*" + re.escape(trail), text, re.S)
    return found.group(1).strip() if found and found.group(1).strip() else None


def format_decoded(d: DecodedPrompt) -> str:
    """The decoded prompt, the package's, and the verdict, for ``molmoact2 conventions``."""
    lines = [f"golden prompt (decoded from llm_split0 hidden_states, {int(d.is_image.sum())} "
             f"image rows): {d.golden_text}"]
    if d.package_ids is not None:
        lines.append(f"package prompt: {d.package_text}")
    lines.append(f"instruction: {d.instruction!r}; padding: "
                 + (f"{d.padding_side} ({d.pad_count} pad tokens)" if d.padding_side
                    else "none"))
    lines.append("special tokens at: " + "; ".join(
        f"{t} {p if len(p) <= 6 else p[:3] + ['...'] + p[-2:]}"
        for t, p in sorted(d.special_places.items()) if p))
    if d.note:
        lines.append(f"golden decoder: {d.note}")
    elif d.first_difference is None:
        lines.append("golden decoder: the package's prompt equals the golden's, token for token")
    else:
        pos, theirs, ours = d.first_difference
        lines.append(f"golden decoder: MISMATCH: first difference at position {pos}: golden "
                     f"{theirs!r}, package {ours!r}")
    return "\n".join(lines)
