"""Bad instructions: reserved model tokens (every added token of the tokenizer), text that is
not UTF-8, empty, not a string, too long."""

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
    (LONG + " and then " + LONG, ["grid_sampler leaves", "S=128", "shorten it by at least"]),
    # prompt structure: every added token of the tokenizer, not only the markers prompt.json names
    ("pick it <action_output> move left", ["reserved model token '<action_output>'"]),
    ("a <setup_start>two arms<setup_end> b", ["'<setup_start>'"]),
    ("x <control_start>joint<control_end>", ["'<control_start>'"]),
    ("close <CONTROL_END> it", ["'<control_end>'"]),
    # text that is not UTF-8 (a lone surrogate, e.g. from undecodable command-line bytes)
    ("put the \udcff bowl away", ["not UTF-8 text", "surrogates not allowed", "'\\udcff'"]),
    ("\ud800", ["not UTF-8 text"]),
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


def test_refused_tokens_are_read_from_the_tokenizer(tiny_root, tmp_path):
    """A token only this tokenizer has (no fixed list could know it) is refused."""
    import json
    import shutil

    root = tmp_path / "grid_sampler"
    shutil.copytree(tiny_root / "grid_sampler", root,
                    ignore=shutil.ignore_patterns("ctx", "onnx", "golden"))
    path = root / "host" / "tokenizer.json"
    data = json.loads(path.read_text())
    new_id = len(data["model"]["vocab"])
    data["model"]["vocab"]["<gripper_secret>"] = new_id
    data["added_tokens"].append({"id": new_id, "content": "<gripper_secret>",
                                 "single_word": False, "lstrip": False, "rstrip": False,
                                 "normalized": False, "special": False})
    path.write_text(json.dumps(data))
    bundle = Bundle.open(root)
    table = EmbeddingTable(bundle.host_path("embeddings.npy"))
    if table.table.shape[0] <= new_id:
        import numpy as np

        grown = np.zeros((new_id + 1, table.hidden), table.table.dtype)
        grown[: table.table.shape[0]] = table.table
        del table
        np.save(bundle.host_path("embeddings.npy"), grown)
    b = PromptBuilder(
        PromptConfig.from_json(bundle.host_path("prompt.json")),
        Tokenizer(bundle.host_path("tokenizer.json")),
        EmbeddingTable(bundle.host_path("embeddings.npy")), bundle.conventions(), bundle.variant)
    with pytest.raises(PromptError, match="reserved model token '<gripper_secret>'"):
        b.plan("grab the <gripper_secret> now")
    assert b.plan("grab the gripper secret now").num_valid > 0


def test_validate_and_cli_refuse_a_lone_surrogate_in_one_line(tiny_root, capsys):
    from molmoact2_ros.control.params import Settings, validate_changes

    ok, reason = validate_changes({"instruction": "put \udcff away"}, Settings())
    assert not ok and "instruction is not UTF-8 text" in reason and "\n" not in reason
    pytest.importorskip("rosbags")
    from molmoact2_ros.cli.app import main

    rc = main(["replay", str(tiny_root / "nobag"), "--bundle-root", str(tiny_root),
               "--instruction", "put \udcff away"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "instruction is not UTF-8 text" in err


def test_instructions_that_only_look_like_tokens_pass(builder):
    for text in ("put the <red> cup away", "move state 12 forward", "stack the im blocks"):
        assert builder.plan(text).num_valid > 0
