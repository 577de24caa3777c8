"""The prompt budget on a tiny bundle cut to 9 tokens left for the task with grid_sampler and
fused, 11 with lp_vtp_sd: the counts, the refusal naming both counts when an instruction is
set, and the per-suite fit read from LIBERO's own task list."""

from __future__ import annotations

import re

import pytest
from budget_helpers import FILLER_WORDS, cut_budget_bundle, fixed_tokens

from molmoact2_ros.bundle.bundle import Bundle
from molmoact2_ros.control.controller import Controller
from molmoact2_ros.control.params import Settings
from molmoact2_ros.errors import PromptError
from molmoact2_ros.host.budget import budget_of, builder_for, suite_fits, table_lines, task_fit

#: 16 words, 16 tokens of the tiny word-level vocabulary
SIXTEEN = "pick up the black bowl next to the ramekin and place it on the wooden plate"
#: The published S and what they leave with the cut bundle's fixed parts (119, 479).
PUBLISHED_LEFT = {"grid_sampler": 9, "lp_vtp_sd": 11, "fused": 9}


@pytest.fixture(scope="module")
def cut_root(tiny_root, tmp_path_factory):
    return cut_budget_bundle(tiny_root, tmp_path_factory.mktemp("cut-budget"))


def _words(text: str) -> int:
    """Tokens of the tiny vocabulary's Whitespace pre-tokeniser: word runs and punctuation."""
    return len(re.findall(r"\w+|[^\w\s]+", text))


@pytest.mark.parametrize("variant", sorted(PUBLISHED_LEFT))
def test_budget_is_s_minus_the_fixed_part(cut_root, tiny_root, variant):
    bundle = Bundle.open(cut_root, variant)
    norm = bundle.norm_stats()
    v = bundle.variant
    fixed = fixed_tokens(bundle.root / "host", norm.setup_type, norm.control_mode,
                         v.image_tokens_per_camera)
    budget = budget_of(builder_for(bundle))
    assert (budget.seq_len, budget.fixed, budget.left) == (v.seq_len, fixed, v.seq_len - fixed)
    assert budget.left == PUBLISHED_LEFT[variant]
    plain = budget_of(builder_for(Bundle.open(tiny_root, variant)))
    assert plain.fixed + FILLER_WORDS == budget.fixed


def test_a_task_fits_up_to_the_budget_and_no_further(cut_root):
    builder = builder_for(Bundle.open(cut_root, "grid_sampler"))
    nine = "put the black bowl on the top of plate"
    assert _words(nine) == 9
    fit = task_fit(builder, nine)
    assert (fit.tokens, fit.fits) == (9, True)
    builder.plan(nine)
    ten = nine + " now"
    assert task_fit(builder, ten).fits is False
    with pytest.raises(PromptError) as err:
        builder.plan(SIXTEEN)
    text = str(err.value)
    assert "is 16 tokens" in text and "leaves 9 for the task" in text, text
    assert "shorten it by at least 7 tokens" in text and "S >= 135" in text, text


def _controller(root, **values):
    settings = Settings().with_changes({
        "backend": "onnx", **{f"bundle.{v}": str(root / v) for v in PUBLISHED_LEFT},
        "instruction": "put the bowl on the plate", **values})
    return Controller(settings, publish=lambda out: None)


def test_setting_a_long_instruction_is_refused_when_set_with_both_counts(cut_root, caplog):
    """Configured (the loaded policy's prompt) and not yet configured (the bundle's)."""
    idle = _controller(cut_root)
    ok, reason, _ = idle.request({"instruction": SIXTEEN})
    assert not ok and "is 16 tokens" in reason and "leaves 9" in reason, reason
    assert idle.settings["instruction"] == "put the bowl on the plate"
    ctl = _controller(cut_root)
    with caplog.at_level("INFO", logger="molmoact2_ros"):
        ctl.configure()
    # the startup log says where the norm stats came from, their mode and raw dimensions
    assert any("norm stats" in r.getMessage() and "mode q01_q99" in r.getMessage()
               and "raw: gripper" in r.getMessage() for r in caplog.records), caplog.text
    try:
        ok, reason, _ = ctl.request({"instruction": SIXTEEN})
        assert not ok and "is 16 tokens" in reason and "leaves 9" in reason, reason
        assert ctl.policy.instruction == "put the bowl on the plate"
        ok, reason, _ = ctl.request({"variant": "lp_vtp_sd", "instruction": SIXTEEN})
        assert not ok and "leaves 11" in reason, reason
        assert ctl.request({"instruction": "put the bowl on the stove"})[0]
    finally:
        ctl.shutdown()


def test_per_suite_fit_counts_libero_tasks(cut_root):
    pytest.importorskip("libero")
    from molmoact2_ros.sim.prompt_fit import libero_instructions

    suites = libero_instructions()
    assert suites is not None and len(suites["libero_90"]) == 90
    builder = builder_for(Bundle.open(cut_root, "grid_sampler"))
    fits = {f.suite: f for f in suite_fits(builder, suites)}
    for suite, texts in suites.items():
        words = [_words(t.lower()) for t in texts]
        assert fits[suite].fitting == sum(w <= 9 for w in words), suite
        assert fits[suite].longest.tokens == max(words)
        assert fits[suite].seq_needed == 119 + max(words)
    assert fits["libero_spatial"].fitting == 0 and fits["libero_goal"].fitting > 0
    lines = table_lines(budget_of(builder), list(fits.values()))
    assert any(line.startswith("| libero_spatial | 0/10 |") for line in lines), lines
