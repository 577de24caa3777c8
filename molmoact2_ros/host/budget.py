"""The prompt budget: how many of a context's S tokens are left for the task instruction.

The contexts fix S; everything in the prompt but the task (BOS, template, image blocks, state
block) is a fixed part, so an instruction fits when its tokens are at most S minus that part.
Here the budget is computed from the bundle's own tokenizer and template, per instruction and
per list of instructions (a LIBERO suite), with the S a re-export would need.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import MolmoActError
from .prompt import PromptBuilder


@dataclass(frozen=True)
class Budget:
    """S, the fixed part of the prompt and the tokens left for the task."""

    variant: str
    seq_len: int
    fixed: int
    num_cameras: int
    image_tokens_per_camera: int

    @property
    def left(self) -> int:
        return self.seq_len - self.fixed

    def fits(self, task_tokens: int) -> bool:
        return task_tokens <= self.left

    def seq_needed(self, task_tokens: int) -> int:
        """The S a re-export needs for a task of ``task_tokens`` tokens."""
        return self.fixed + task_tokens

    def describe(self) -> str:
        return (f"S={self.seq_len}: {self.fixed} fixed ({self.num_cameras} x "
                f"{self.image_tokens_per_camera} image tokens, template, state), "
                f"{self.left} tokens left for the task")

    def to_json(self) -> dict:
        return {"variant": self.variant, "seq_len": self.seq_len, "fixed": self.fixed,
                "left": self.left, "image_tokens_per_camera": self.image_tokens_per_camera}


@dataclass(frozen=True)
class TaskFit:
    """One instruction against a budget (``tokens`` is -1 for an instruction refused for
    something other than its length, with the reason)."""

    instruction: str
    tokens: int
    fits: bool
    reason: str = ""


@dataclass(frozen=True)
class SuiteFit:
    """How many of a suite's tasks fit, its longest task and the S that would hold them all."""

    suite: str
    tasks: tuple[TaskFit, ...]
    seq_needed: int

    @property
    def fitting(self) -> int:
        return sum(1 for t in self.tasks if t.fits)

    @property
    def longest(self) -> TaskFit:
        return max(self.tasks, key=lambda t: t.tokens)

    def to_json(self) -> dict:
        return {"suite": self.suite, "tasks": len(self.tasks), "fit": self.fitting,
                "longest_tokens": self.longest.tokens,
                "longest": self.longest.instruction, "seq_needed": self.seq_needed}


def builder_for(bundle) -> PromptBuilder:
    """The prompt builder the policy would use, from a bundle's host files and norm stats."""
    from .prompt import EmbeddingTable, PromptConfig, Tokenizer

    norm = bundle.norm_stats()
    return PromptBuilder(
        PromptConfig.from_json(bundle.host_path("prompt.json")),
        Tokenizer(bundle.host_path("tokenizer.json")),
        EmbeddingTable(bundle.host_path("embeddings.npy")), bundle.conventions(),
        bundle.variant, setup=norm.setup_type, control=norm.control_mode)


def budget_of(builder: PromptBuilder) -> Budget:
    """The budget of the variant and template ``builder`` was made for."""
    v = builder.variant
    return Budget(v.name, v.seq_len, builder.fixed_length(), v.num_cameras,
                  v.image_tokens_per_camera)


def task_fit(builder: PromptBuilder, instruction: str) -> TaskFit:
    """The task's tokens (whole prompt minus the fixed part) and whether it fits."""
    try:
        tokens = builder.prompt_length(instruction) - builder.fixed_length()
    except MolmoActError as exc:
        return TaskFit(instruction, -1, False, str(exc))
    return TaskFit(instruction, tokens, tokens <= builder.variant.seq_len
                   - builder.fixed_length())


def suite_fits(builder: PromptBuilder,
               suites: Mapping[str, Sequence[str]]) -> list[SuiteFit]:
    """Per suite (name → its task instructions): the fit of every task."""
    budget = budget_of(builder)
    out = []
    for suite, instructions in suites.items():
        tasks = tuple(task_fit(builder, text) for text in instructions)
        longest = max((t.tokens for t in tasks), default=0)
        out.append(SuiteFit(suite, tasks, budget.seq_needed(max(longest, 0))))
    return out


def table_lines(budget: Budget, fits: Sequence[SuiteFit]) -> list[str]:
    """The per-suite table (markdown) and the S every suite would fit in."""
    lines = [f"| suite | fit ({budget.variant}, {budget.left} tokens) | longest task | "
             "S needed |", "|---|---|---|---|"]
    for f in fits:
        lines.append(f"| {f.suite} | {f.fitting}/{len(f.tasks)} | {f.longest.tokens} tokens | "
                     f"{f.seq_needed} |")
    if fits:
        need = max(f.seq_needed for f in fits)
        lines.append(f"every suite fits S >= {need} with this template and "
                     f"{budget.image_tokens_per_camera} image tokens per camera")
    return lines
