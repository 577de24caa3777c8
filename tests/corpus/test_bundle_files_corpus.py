"""Bundle files with wrong types or values: refused at load with one line naming the file,
the field and what is allowed (never a raw traceback, never silently wrong actions)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from molmoact2_ros.bundle.bundle import Bundle
from molmoact2_ros.errors import BundleError
from molmoact2_ros.host.prompt import EmbeddingTable, PromptBuilder, PromptConfig, Tokenizer

pytestmark = pytest.mark.usefixtures("no_leaks")


def _load_host(root: Path) -> None:
    """Everything the policy reads from the bundle besides the sessions, then one prompt."""
    bundle = Bundle.open(root)
    conventions = bundle.conventions()
    bundle.norm_stats()
    config = PromptConfig.from_json(bundle.host_path("prompt.json"))
    builder = PromptBuilder(config, Tokenizer(bundle.host_path("tokenizer.json")),
                            EmbeddingTable(bundle.host_path("embeddings.npy")), conventions,
                            bundle.variant)
    builder.plan("pick up the bowl")


def _json_edit(relpath: str, fn):
    def edit(root: Path) -> None:
        path = root / relpath
        data = json.loads(path.read_text())
        result = fn(data)
        path.write_text(json.dumps(data if result is None else result))
    return edit


def _set(*keys_and_value):
    *keys, value = keys_and_value

    def fn(data):
        target = data
        for k in keys[:-1]:
            target = target[k]
        target[keys[-1]] = value
    return fn


def _delete(*keys):
    def fn(data):
        target = data
        for k in keys[:-1]:
            target = target[k]
        del target[keys[-1]]
    return fn


LIBERO = ("metadata_by_tag", "libero")


def _swap_quantiles(data):
    stats = data["metadata_by_tag"]["libero"]["action_stats"]
    stats["q01"], stats["q99"] = stats["q99"], stats["q01"]


def _int_table(root: Path) -> None:
    path = root / "host" / "embeddings.npy"
    table = np.load(path, allow_pickle=False)
    np.save(path, table.view(np.int16))


CASES = [
    # (id, file, edit, words in the one-line refusal)
    ("manifest-variant-int", "bundle.json", _set("variant", 5),
     ["bundle.json", "variant is 5", "a string"]),
    ("manifest-variant-unknown", "bundle.json", _set("variant", "huge"),
     ["bundle.json", "variant is 'huge'", "allowed: 'grid_sampler'"]),
    ("manifest-synthetic-string", "bundle.json", _set("synthetic", "false"),
     ["bundle.json", "synthetic is 'false'", "without quotes"]),
    ("manifest-list", "bundle.json", lambda d: [d], ["bundle.json", "top level is a list"]),
    ("conv-bool-string", "host/conventions.json", _set("bidirectional_image_attention", "false"),
     ["conventions.json", "bidirectional_image_attention is 'false'", "true or false"]),
    ("conv-euler-string", "host/conventions.json", _set("euler_in_graph", "true"),
     ["conventions.json", "euler_in_graph"]),
    ("conv-mask-string", "host/conventions.json", _set("mask_value", "-30000"),
     ["conventions.json", "mask_value is '-30000'", "a number"]),
    ("conv-mask-positive", "host/conventions.json", _set("mask_value", 5.0),
     ["conventions.json", "mask_value 5.0", "negative"]),
    ("conv-padding", "host/conventions.json", _set("padding_side", "middle"),
     ["conventions.json", "padding_side is 'middle'", "allowed: 'right', 'left'"]),
    ("conv-encoder-mask", "host/conventions.json", _set("encoder_mask", 1),
     ["conventions.json", "encoder_mask is 1", "a string"]),
    ("conv-steps-float", "host/conventions.json", _set("euler_baked_steps", 10.5),
     ["conventions.json", "euler_baked_steps is 10.5", "an integer"]),
    ("conv-steps-zero", "host/conventions.json", _set("euler_baked_steps", 0),
     ["conventions.json", "euler_baked_steps 0 must be >= 1"]),
    ("conv-unknown-key", "host/conventions.json", _set("mask_valu", -1.0),
     ["conventions.json", "unknown keys ['mask_valu']"]),
    ("conv-not-json", "host/conventions.json", lambda d: "x",
     ["conventions.json", "top level is a string"]),
    ("prompt-bins-string", "host/prompt.json", _set("num_state_bins", "256"),
     ["prompt.json", "num_state_bins is '256'", "an integer"]),
    ("prompt-bins-one", "host/prompt.json", _set("num_state_bins", 1),
     ["prompt.json", "num_state_bins is 1", ">= 2"]),
    ("prompt-normalize-string", "host/prompt.json", _set("normalize_language", "false"),
     ["prompt.json", "normalize_language is 'false'", "true or false"]),
    ("prompt-template-int", "host/prompt.json", _set("template", 5),
     ["prompt.json", "template is 5", "a string"]),
    ("prompt-template-field", "host/prompt.json", _set("template", "{task} {state} {robot}"),
     ["prompt.json", "template fields", "robot"]),
    ("prompt-template-no-state", "host/prompt.json", _set("template", "do {task}"),
     ["prompt.json", "{state} are required"]),
    ("prompt-template-brace", "host/prompt.json", _set("template", "{task} {state} {"),
     ["prompt.json", "not a format string"]),
    ("prompt-missing-template", "host/prompt.json", _delete("template"),
     ["prompt.json", "template is missing"]),
    ("prompt-unknown-key", "host/prompt.json", _set("image_token", "<im>"),
     ["prompt.json", "unknown keys ['image_token']"]),
    ("prompt-state-format", "host/prompt.json", _set("state_token_format", "<state>"),
     ["prompt.json", "state_token_format"]),
    ("prompt-token-not-in-tokenizer", "host/prompt.json", _set("image_patch_token", "<im_pach>"),
     ["prompt.json", "image_patch_token names token '<im_pach>'", "tokenizer.json"]),
    ("norm-quantiles-swapped", "norm_stats.json", _swap_quantiles,
     ["norm_stats.json", "action_stats.q01 > q99 at index", "mirror"]),
    ("norm-q01-strings", "norm_stats.json",
     _set(*LIBERO, "action_stats", "q01", ["0.1"] * 7),
     ["norm_stats.json", "q01[0] is '0.1'", "a number"]),
    ("norm-q99-bool", "norm_stats.json",
     _set(*LIBERO, "state_stats", "q99", [True] * 8),
     ["norm_stats.json", "state_stats.q99[0] is True", "a number"]),
    ("norm-mask-strings", "norm_stats.json",
     _set(*LIBERO, "action_stats", "mask", ["true"] * 6 + ["false"]),
     ["norm_stats.json", "mask[0] is 'true'", "without quotes"]),
    ("norm-horizon", "norm_stats.json", _set(*LIBERO, "action_horizon", 16),
     ["norm_stats.json", "action_horizon is 16", "horizon is 10"]),
    ("norm-horizon-string", "norm_stats.json", _set(*LIBERO, "action_horizon", "10"),
     ["norm_stats.json", "action_horizon is '10'", "an integer"]),
    ("norm-tags-list", "norm_stats.json", _set("metadata_by_tag", []),
     ["norm_stats.json", "metadata_by_tag is []", "an object"]),
    ("norm-stats-missing", "norm_stats.json", _delete(*LIBERO, "action_stats"),
     ["norm_stats.json", "action_stats is missing"]),
    ("norm-format", "norm_stats.json", _set("format", "v2"),
     ["norm_stats.json", "format is 'v2'", "molmoact2_norm_stats.v1"]),
    ("norm-mode", "norm_stats.json", _set("norm_mode", "mean_std"),
     ["norm_stats.json", "norm_mode is 'mean_std'", "q01_q99"]),
    ("norm-setup-int", "norm_stats.json", _set(*LIBERO, "setup_type", 3),
     ["norm_stats.json", "setup_type is 3", "a string"]),
    ("norm-width", "norm_stats.json", _set(*LIBERO, "action_stats", "q01", [0.0] * 6),
     ["norm_stats.json", "q01 has 6 values", "needs 7"]),
    # what nothing downstream can see: no mode, no mask (nor names), NaN, 5 dimensions for 7
    ("norm-no-mode", "norm_stats.json", _delete("norm_mode"),
     ["norm_stats.json", "norm_mode is missing", "min_max", "q01_q99"]),
    ("norm-no-mask", "norm_stats.json",
     lambda d: [_delete(*LIBERO, "action_stats", k)(d) for k in ("mask", "names")] and None,
     ["norm_stats.json", "action_stats.mask is missing", "gripper"]),
    ("norm-nan", "norm_stats.json", _set(*LIBERO, "state_stats", "q99", [float("nan")] * 8),
     ["norm_stats.json", "state_stats.q99[0] is nan", "a number"]),
    ("norm-five-for-seven", "norm_stats.json",
     lambda d: [_set(*LIBERO, "action_stats", k, d["metadata_by_tag"]["libero"]["action_stats"][k]
                     [:5])(d) for k in ("q01", "q99", "min", "max", "mask", "names")] and None,
     ["norm_stats.json", "action_stats.q01 has 5 values", "needs 7"]),
    ("embeddings-int", "host/embeddings.npy", _int_table,
     ["embeddings.npy", "int16", "float16"]),
]


def _tokenizer_without_state_tokens(root: Path) -> None:
    """<state_*> stay in the vocabulary but are no longer added tokens (split as text)."""
    path = root / "host" / "tokenizer.json"
    data = json.loads(path.read_text())
    data["added_tokens"] = [t for t in data["added_tokens"]
                            if not t["content"].startswith("<state_")]
    path.write_text(json.dumps(data))


#: Bundle faults that used to be blamed on the instruction: refused when the prompt builder
#: is made (at load), naming the file and the field.
LOAD_CASES = [
    ("prompt-empty-image-placeholder", "host/prompt.json", _set("image_placeholder", ""),
     ["prompt.json", "image_placeholder is empty"]),
    ("prompt-empty-state-start", "host/prompt.json", _set("state_start_token", " "),
     ["prompt.json", "state_start_token is empty"]),
    ("prompt-one-image-placeholder", "host/prompt.json",
     _set("template", "Image 1<|image|> {task} {state}"),
     ["prompt.json", "image_placeholder '<|image|>' 1 times", "needs 2"]),
    ("tokenizer-without-state-tokens", "host/tokenizer.json", _tokenizer_without_state_tokens,
     ["tokenizer.json", "'<state_start>'", "field state_start_token",
      "not as an added token"]),
]


@pytest.fixture(scope="module")
def pristine(tiny_root, tmp_path_factory) -> Path:
    """The grid_sampler bundle without its graphs and contexts (only what the host reads)."""
    out = tmp_path_factory.mktemp("pristine") / "grid_sampler"
    shutil.copytree(tiny_root / "grid_sampler", out,
                    ignore=shutil.ignore_patterns("ctx", "onnx", "golden"))
    _load_host(out)  # the unmodified copy loads
    return out


@pytest.mark.parametrize("name,file,edit,words", CASES, ids=[c[0] for c in CASES])
def test_bad_bundle_file_is_refused_in_one_line(name, file, edit, words, pristine, tmp_path):
    root = tmp_path / "grid_sampler"
    shutil.copytree(pristine, root)
    if file.endswith(".json"):
        _json_edit(file, edit)(root)
    else:
        edit(root)
    with pytest.raises(BundleError) as err:
        _load_host(root)
    message = str(err.value)
    assert "\n" not in message, message
    for word in words:
        assert word in message, (word, message)


@pytest.mark.parametrize("name,file,edit,words", LOAD_CASES, ids=[c[0] for c in LOAD_CASES])
def test_bundle_fault_is_blamed_on_the_bundle_at_load(name, file, edit, words, pristine,
                                                      tmp_path):
    root = tmp_path / "grid_sampler"
    shutil.copytree(pristine, root)
    if file.endswith("prompt.json"):
        _json_edit(file, edit)(root)
    else:
        edit(root)
    bundle = Bundle.open(root)
    with pytest.raises(BundleError) as err:  # before any instruction is planned
        PromptBuilder(PromptConfig.from_json(bundle.host_path("prompt.json")),
                      Tokenizer(bundle.host_path("tokenizer.json")),
                      EmbeddingTable(bundle.host_path("embeddings.npy")), bundle.conventions(),
                      bundle.variant)
    message = str(err.value)
    assert "\n" not in message and "instruction" not in message, message
    for word in words:
        assert word in message, (word, message)
