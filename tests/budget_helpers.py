"""A tiny bundle whose prompt budget is cut to about the published one: ten filler words in the
template make its fixed part 119 tokens with 16 image tokens per camera and 479 with 196, so
grid_sampler and fused leave 9 tokens for the task and lp_vtp_sd 11 (MolmoAct2's own tokenizer
leaves one more: docs/libero.md, "Prompt budget").
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

#: Words added to the template, each one token of the tiny word-level vocabulary.
FILLER = "please read the task and the setup and then act"
FILLER_WORDS = len(FILLER.split())


def fixed_tokens(host: Path, setup: str, control: str, image_tokens: int) -> int:
    """The fixed part counted straight from tokenizer.json and prompt.json (not through the
    package): BOS + the template with an empty task, both image blocks and the state block."""
    from tokenizers import Tokenizer

    config = json.loads((host / "prompt.json").read_text())
    tok = Tokenizer.from_file(str(host / "tokenizer.json"))
    block = (config["image_start_token"] + config["image_patch_token"] * image_tokens
             + config["image_end_token"])
    state = (config["state_start_token"] + config["state_token_format"].format(0) * 8
             + config["state_end_token"])
    text = config["template"].format(task="", setup=setup, control=control, state=state)
    text = text.replace(config["image_placeholder"], block)
    return 1 + len(tok.encode(text, add_special_tokens=False).ids)


def cut_budget_bundle(tiny_root: Path, out: Path) -> Path:
    """A root of the three tiny variants whose templates carry ``FILLER`` (contexts, graphs
    and goldens linked, host/ and norm_stats copied)."""
    for variant in ("grid_sampler", "lp_vtp_sd", "fused"):
        src, dst = Path(tiny_root) / variant, out / variant
        dst.mkdir(parents=True, exist_ok=True)
        for entry in src.iterdir():
            if entry.name in ("host", "norm_stats.json", "bundle.json"):
                if entry.is_dir():
                    shutil.copytree(entry, dst / entry.name, dirs_exist_ok=True)
                else:
                    shutil.copy2(entry, dst / entry.name)
            elif not (dst / entry.name).exists():
                (dst / entry.name).symlink_to(entry.resolve())
        prompt = dst / "host" / "prompt.json"
        config = json.loads(prompt.read_text())
        config["template"] = config["template"].replace(
            "The task is to {task}.", f"The task is to {{task}}. {FILLER}")
        assert "{task}. " + FILLER in config["template"]
        prompt.write_text(json.dumps(config, indent=2))
    return out
