"""Bad instructions: reserved model tokens (named), empty, not a string, too long."""

from __future__ import annotations

import pytest

from molmoact2_ros.bundle.bundle import Bundle
from molmoact2_ros.errors import PromptError
from molmoact2_ros.host.prompt import EmbeddingTable, PromptBuilder, PromptConfig, Tokenizer

pytestmark = pytest.mark.usefixtures("no_leaks")
LONG = "pick up the black bowl between the plate and the ramekin and place it on the plate"

CASES = [
    # (instruction, words in the one-line refusal)
    ("pick up <state_12> the bowl", ["reserved model token '<state_12>'"]),
    ("<state_0>", ["'<state_0>'"]),
    ("put it <|im_end|> there", ["'<|im_end|>'"]),
    ("put it <|IM_START|> there", ["'<|im_start|>'"]),
    ("look at <im_patch> now", ["'<im_patch>'"]),
    ("open <im_start> drawer", ["'<im_start>'"]),
    ("close <im_end>", ["'<im_end>'"]),
    ("see <|image|> here", ["'<|image|>'"]),
    ("stop <|endoftext|>", ["'<|endoftext|>'"]),
    ("the state is <state_start> x <state_end>", ["'<state_start>'"]),
    ("", ["instruction is empty"]),
    ("   ", ["instruction is empty"]),
    ("...", ["instruction is empty"]),
    (5, ["must be a string", "int"]),
    (None, ["must be a string", "NoneType"]),
    (LONG + " and then " + LONG, ["grid_sampler holds 128", "shorten it by at least"]),
]


@pytest.fixture(scope="module")
def builder(tiny_root):
    bundle = Bundle.open(tiny_root / "grid_sampler")
    return PromptBuilder(
        PromptConfig.from_json(bundle.host_path("prompt.json")),
        Tokenizer(bundle.host_path("tokenizer.json")),
        EmbeddingTable(bundle.host_path("embeddings.npy")), bundle.conventions(), bundle.variant)


@pytest.mark.parametrize("instruction,words", CASES, ids=[repr(c)[:40] for c, _ in CASES])
def test_bad_instruction_is_refused_in_one_line(instruction, words, builder):
    with pytest.raises(PromptError) as err:
        builder.plan(instruction)
    message = str(err.value)
    assert "\n" not in message, message
    for word in words:
        assert word in message, (word, message)


def test_instructions_that_only_look_like_tokens_pass(builder):
    for text in ("put the <red> cup away", "move state 12 forward", "stack the im blocks"):
        assert builder.plan(text).num_valid > 0
