"""The prompt budget with MolmoAct2's real vocabulary (the reference bundle, S = 488): the
package's token counts are the LeRobot processor's, it refuses exactly the prompts that do not
fit, and docs/libero.md's per-suite table is what it computes."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from molmoact2_ros.bundle.bundle import Bundle
from molmoact2_ros.errors import PromptError
from molmoact2_ros.host.budget import budget_of, builder_for, suite_fits, task_fit

pytest.importorskip("safetensors")
DOCS = Path(__file__).resolve().parents[1] / "docs" / "libero.md"


@pytest.fixture(scope="module")
def fused(reference_bundle, tmp_path_factory):
    """The reference fused bundle with host/ exported from its checkpoint."""
    from molmoact2_ros.cli.export_host import export_host

    folder = tmp_path_factory.mktemp("reference-budget") / "fused"
    shutil.copytree(reference_bundle / "fused", folder)
    export_host(reference_bundle / "checkpoint", folder)
    return Bundle.open(folder)


def _cases(reference_bundle) -> dict[str, tuple[int, bool]]:
    """Instruction → (the LeRobot processor's prompt length, whether it fits S)."""
    out = {}
    for path in sorted((reference_bundle / "reference").glob("e2e_*.npz")):
        with np.load(path, allow_pickle=False) as data:
            out[str(data["instruction"])] = (int(data["input_ids"].shape[0]), bool(data["fits"]))
    return out


def test_the_package_counts_the_processors_tokens(fused, reference_bundle):
    builder = builder_for(fused)
    budget = budget_of(builder)
    cases = _cases(reference_bundle)
    assert len(cases) == 4 and {f for _, f in cases.values()} == {True, False}
    for instruction, (length, fits) in cases.items():
        assert builder.prompt_length(instruction) == length, instruction
        assert task_fit(builder, instruction).fits == fits, instruction
    short = min(length for length, _ in cases.values())
    assert budget.seq_len == 488 and budget.fixed == 478 and budget.left == 10
    assert short - budget.fixed == 4  # "turn on the stove"


def test_a_prompt_that_does_not_fit_is_refused_naming_both_counts(fused, reference_bundle):
    builder = builder_for(fused)
    for instruction, (length, fits) in _cases(reference_bundle).items():
        if fits:
            assert builder.plan(instruction).num_valid == length
            continue
        with pytest.raises(PromptError) as err:
            builder.plan(instruction)
        assert f"is {length - 478} tokens" in str(err.value)
        assert "leaves 10 for the task" in str(err.value)
        assert f"at least {length - 488} tokens" in str(err.value)


def test_the_documented_per_suite_table_is_what_the_package_computes(fused):
    pytest.importorskip("libero")
    from molmoact2_ros.sim.prompt_fit import libero_instructions

    fits = {f.suite: f.fitting for f in suite_fits(builder_for(fused), libero_instructions())}
    text = DOCS.read_text(encoding="utf-8")
    section = text[text.index("## Prompt budget"):]
    rows = dict(re.findall(r"^\| (libero_\w+) \| \d+ \| \d+ \| (\d+) \|", section, re.MULTILINE))
    assert rows and {s: int(n) for s, n in rows.items()} == fits
