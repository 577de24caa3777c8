"""Which LIBERO tasks a bundle's prompt can hold, checked before any env is built.

A task whose instruction does not fit the context's budget is not a failure of the policy:
``molmoact2 libero`` runs the tasks that fit and lists the rest as not promptable, apart from
the success rate, and refuses a selection where none fits.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import dataclass

from ..errors import MolmoActError


@dataclass(frozen=True)
class NotPromptable:
    """A task left out of a run: its instruction does not fit the prompt."""

    suite: str
    task_id: int
    instruction: str
    tokens: int
    reason: str

    def to_json(self) -> dict:
        return {"suite": self.suite, "task_id": self.task_id, "instruction": self.instruction,
                "tokens": self.tokens, "reason": self.reason}


def libero_instructions(suites=None) -> dict[str, list[str]] | None:
    """Every standard suite's task instructions (no env built), or None without LIBERO."""
    from .libero_env import STANDARD_SUITES, import_libero

    try:
        benchmark, _, _ = import_libero()
    except MolmoActError:
        return None
    found = benchmark.get_benchmark_dict()
    out = {}
    for suite in suites or STANDARD_SUITES:
        if suite not in found:
            continue
        with contextlib.redirect_stdout(sys.stderr):
            bench = found[suite]()
        out[suite] = [bench.get_task(i).language for i in range(bench.n_tasks)]
    return out


def split_promptable(settings, suite: str, infos, tasks: list[int]
                     ) -> tuple[list[int], list[NotPromptable]]:
    """The selected tasks whose instructions fit the prompt of the variant ``settings`` select,
    and the rest. None fitting is an error naming the suite, the budget and the S needed."""
    from ..bundle.bundle import Bundle
    from ..host.budget import budget_of, builder_for, task_fit

    builder = builder_for(Bundle.open(settings.bundle_path(), settings["variant"]))
    budget = budget_of(builder)
    keep, skipped = [], []
    for t in tasks:
        fit = task_fit(builder, infos[t].language)
        if fit.fits:
            keep.append(t)
        else:
            reason = fit.reason or (f"{fit.tokens} tokens, the budget is {budget.left}")
            skipped.append(NotPromptable(suite, t, infos[t].language, fit.tokens, reason))
    if not keep:
        longest = max(s.tokens for s in skipped)
        if longest < 0:  # refused for what it holds, not its length
            raise MolmoActError(f"{suite} task {skipped[0].task_id}: {skipped[0].reason}")
        raise MolmoActError(
            f"no selected task of {suite} fits the prompt of {settings['variant']}: "
            f"{budget.describe()}; its tasks need up to {longest} tokens, so the contexts "
            f"need S >= {budget.seq_needed(longest)} (docs/libero.md, 'Prompt budget'); "
            "choose a suite or tasks that fit (molmoact2 doctor lists them)")
    return keep, skipped
