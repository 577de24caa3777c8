"""Policy: ``Observation`` → ``ActionChunk`` over any runtime pipeline, with per-stage timing."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .bundle.bundle import Bundle, Suffixes
from .bundle.comparison import ToleranceTable, precision_of
from .bundle.golden import (
    TRACE_CHECKS,
    TRACE_INPUTS,
    ParityRow,
    bias_for_comparison,
    compare,
    e2e_limits,
    load_npz,
)
from .bundle.normstats import NormStats
from .errors import ObservationError, PromptError
from .host import images as image_ops
from .host.flow import InpaintGuidance, initial_noise, observation_rng
from .host.prompt import (
    EmbeddingTable,
    PromptBuilder,
    PromptConfig,
    PromptPlan,
    Tokenizer,
    action_dim_is_pad,
)
from .host.state import state_bins
from .runtime import open_pipeline
from .runtime.pipeline import Pipeline

MAX_FLOW_STEPS = 100


@dataclass
class Observation:
    """Two RGB uint8 frames (primary/agentview first, wrist second), robot state, task."""

    images: Sequence[np.ndarray]
    state: np.ndarray
    instruction: str | None = None
    stamp_ns: int = 0


@dataclass
class ActionChunk:
    """De-normalised actions [horizon, action_dim] plus what produced them."""

    actions: np.ndarray
    actions_normalized: np.ndarray
    variant: str
    flow_steps: int
    observation_stamp_ns: int
    instruction: str
    latency_ms: dict[str, float] = field(default_factory=dict)

    @property
    def total_ms(self) -> float:
        return self.latency_ms.get("total", 0.0)


def check_flow_steps(steps: int) -> int:
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)):
        raise PromptError(f"flow_steps must be an integer, got {steps!r}")
    if not 1 <= int(steps) <= MAX_FLOW_STEPS:
        raise PromptError(f"flow_steps {steps} is out of range; use 1..{MAX_FLOW_STEPS}")
    return int(steps)


class Policy:
    """MolmoAct2 host glue around a seven-session pipeline."""

    def __init__(
        self,
        bundle: Bundle,
        pipeline: Pipeline,
        *,
        flow_steps: int | None = None,
        seed: int | None = None,
        instruction: str | None = None,
        backend: str = "onnx",
        suffixes: Suffixes | None = None,
    ) -> None:
        self.bundle = bundle
        self.variant = bundle.variant
        self.pipeline = pipeline
        self.backend = backend
        self.suffixes = suffixes or Suffixes()
        self.conventions = pipeline.conventions
        self.norm_stats: NormStats = bundle.norm_stats()
        config = PromptConfig.from_json(bundle.host_path("prompt.json"))
        self.prompts = PromptBuilder(
            config,
            Tokenizer(bundle.host_path("tokenizer.json")),
            EmbeddingTable(bundle.host_path("embeddings.npy")),
            self.conventions,
            self.variant,
            setup=self.norm_stats.setup_type,
            control=self.norm_stats.control_mode,
        )
        if self.prompts.table.hidden != pipeline.geometry.hidden:
            raise PromptError(
                f"embeddings.npy has hidden size {self.prompts.table.hidden} but the LLM "
                f"sessions expect {pipeline.geometry.hidden}; the host assets belong to "
                "another model"
            )
        self.flow_steps = check_flow_steps(flow_steps or self.variant.default_flow_steps)
        self._pad = action_dim_is_pad(self.variant.action_dim, self.variant.max_action_dim)
        self._seed = seed
        self._rng = np.random.default_rng(seed)
        #: noise for every chunk instead of a drawn one (replay against a trace's noise)
        self.fixed_noise: np.ndarray | None = None
        self._plans: dict[str, PromptPlan] = {}
        self._written_plan: PromptPlan | None = None
        self.instruction: str | None = None
        if instruction is not None:
            self.set_instruction(instruction)

    @classmethod
    def load(
        cls,
        root: Path | str,
        variant: str | None = None,
        *,
        backend: str = "onnx",
        suffixes: Suffixes | None = None,
        **kwargs,
    ) -> Policy:
        bundle = Bundle.open(root, variant)
        pipeline_options = kwargs.pop("pipeline_options", {})
        pipeline = open_pipeline(bundle, backend, suffixes, **pipeline_options)
        try:
            return cls(bundle, pipeline, backend=backend, suffixes=suffixes, **kwargs)
        except Exception:
            pipeline.close()
            raise

    # -- settings that apply to the next chunk -------------------------------------------------
    def plan(self, instruction: str) -> PromptPlan:
        """Build (and cache) the prompt plan; raises PromptError when it cannot fit."""
        plan = self._plans.get(instruction)
        if plan is None:
            plan = self.prompts.plan(instruction)
            if len(self._plans) > 32:
                self._plans.clear()
            self._plans[instruction] = plan
        return plan

    def set_instruction(self, instruction: str) -> None:
        self.plan(instruction)
        self.instruction = instruction

    @property
    def action_type(self) -> str:
        """``delta`` when the bundle's control mode is a delta one (LIBERO: "delta
        end-effector pose"), else ``absolute`` (execution.action_type=bundle reads this)."""
        return "delta" if "delta" in self.norm_stats.control_mode.lower() else "absolute"

    def set_flow_steps(self, steps: int) -> None:
        self.flow_steps = check_flow_steps(steps)

    def reseed(self, seed: int | None) -> None:
        """With a seed, each observation's noise comes from (seed, its stamp); None = random."""
        self._seed = seed
        self._rng = np.random.default_rng(seed)

    # -- inference -------------------------------------------------------------------------------
    def predict(
        self,
        obs: Observation,
        *,
        noise: np.ndarray | None = None,
        guidance: InpaintGuidance | None = None,
    ) -> ActionChunk:
        """Run one chunk. Raises ObservationError/PromptError before any session runs.

        ``guidance`` (previous de-normalised actions + per-row weights) inpaints the chunk's
        first rows inside the flow loop (``execution.blend: inpaint``)."""
        t0 = time.perf_counter()
        instruction = obs.instruction if obs.instruction is not None else self.instruction
        if instruction is None:
            raise PromptError("no instruction: set the 'instruction' parameter first")
        plan = self.plan(instruction)
        bins = state_bins(obs.state, self.norm_stats.state)
        if len(obs.images) != self.variant.num_cameras:
            raise ObservationError(
                f"got {len(obs.images)} images, the policy needs {self.variant.num_cameras} "
                "(primary, wrist)"
            )
        shape = (1, self.variant.horizon, self.variant.max_action_dim)
        noise = self.fixed_noise if noise is None else noise
        if noise is None:
            rng = self._rng if self._seed is None else observation_rng(self._seed, obs.stamp_ns)
            x0 = initial_noise(rng, shape, self._pad)
        else:
            x0 = np.asarray(noise, dtype=np.float32).reshape(shape) * (1.0 - self._pad)
        image_ops.preprocess(
            obs.images,
            size=self.variant.image_size,
            patch=self.variant.patch_size,
            flip=self.conventions.flip_images_180,
            out=self.pipeline.input_buffer("pixel_values"),
        )
        self._write_plan(plan)
        t1 = time.perf_counter()
        image_embeds = self.pipeline.run_vision()
        t2 = time.perf_counter()
        plan.embed(bins, image_embeds, out=self.pipeline.input_buffer("hidden_states"))
        t3 = time.perf_counter()
        if guidance is None:
            x_n = self.pipeline.run_action(x0, self.flow_steps)
        else:
            prefix, weights = self.guidance_arrays(guidance)
            x_n = self.pipeline.run_action(x0, self.flow_steps, prefix, weights,
                                           guidance.method, guidance.beta)
        t4 = time.perf_counter()
        v = self.variant
        normalized = np.array(x_n[0, : v.horizon, : v.action_dim], dtype=np.float32)
        actions = self.norm_stats.action.denormalize(normalized)
        t5 = time.perf_counter()
        timings = self.pipeline.last_timings_ms
        timings.update(
            preprocess=(t1 - t0) * 1e3,
            embed=(t3 - t2) * 1e3,
            postprocess=(t5 - t4) * 1e3,
            total=(t5 - t0) * 1e3,
        )
        return ActionChunk(
            actions=actions,
            actions_normalized=normalized,
            variant=v.name,
            flow_steps=self.flow_steps,
            observation_stamp_ns=obs.stamp_ns,
            instruction=plan.instruction,
            latency_ms=timings,
        )

    def guidance_arrays(self, guidance: InpaintGuidance) -> tuple[np.ndarray, np.ndarray]:
        """Guidance in the flow loop's space: normalised prefix [1, T, A_max], weights [T]."""
        v = self.variant
        prefix = np.asarray(guidance.prefix, dtype=np.float32)
        weights = np.asarray(guidance.weights, dtype=np.float32).reshape(-1)
        if prefix.shape != (v.horizon, v.action_dim) or weights.shape != (v.horizon,):
            raise ObservationError(
                f"inpaint guidance has prefix {prefix.shape} and weights {weights.shape}; "
                f"{v.name} needs ({v.horizon}, {v.action_dim}) and ({v.horizon},)"
            )
        out = np.zeros((1, v.horizon, v.max_action_dim), np.float32)
        out[0, :, : v.action_dim] = self.norm_stats.action.normalize(prefix)
        return out, weights

    def _write_plan(self, plan: PromptPlan) -> None:
        if self._written_plan is plan:
            return
        self.pipeline.input_buffer("attention_bias")[...] = plan.attention_bias
        self.pipeline.input_buffer("encoder_attention_mask")[...] = plan.encoder_mask
        self.pipeline.input_buffer("action_dim_is_pad")[...] = self._pad
        self._written_plan = plan

    def recover(self) -> None:
        """Restart a failed runtime (dead or hung HTP workers); raises if it cannot."""
        self.pipeline.restart()

    def precision(self, component: str | None = None) -> str:
        """The precision parity judges ``component`` at (fp32, fp16 or a suffix such as
        w4a16); without one, the end to end's: the coarsest of the sessions."""
        if component is not None:
            return precision_of(self.backend, self.suffixes.for_component(component))
        quantised = [s for s in self.suffixes.__dict__.values() if s]
        return precision_of(self.backend, quantised[0] if quantised else "")

    def close(self) -> None:
        self.pipeline.close()

    def __enter__(self) -> Policy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def e2e_parity(policy, trace_path: Path, *, table: ToleranceTable | None = None,
               **overrides) -> list[ParityRow]:
    """Run the policy from the trace's raw observation and compare every recorded stage
    (limits of component ``e2e`` at the policy's precision, ``overrides`` replacing them)."""
    table = (table or ToleranceTable()).override(**overrides)
    precision = policy.precision()
    trace = load_npz(trace_path, TRACE_INPUTS + ("chunk",), what="end-to-end parity")
    stage = f"e2e:{Path(trace_path).stem}"
    steps = int(trace["flow_steps"])
    previous_steps = policy.flow_steps
    policy.set_flow_steps(steps)
    try:
        chunk = policy.predict(
            Observation(
                images=(trace["image_primary"], trace["image_wrist"]),
                state=trace["state"],
                instruction=str(trace["instruction"]),
            ),
            noise=trace["noise"],
        )
    finally:
        policy.set_flow_steps(previous_steps)
    pipe = policy.pipeline
    plan = policy.plan(str(trace["instruction"]))
    observed = {
        "pixel_values": pipe.input_buffer("pixel_values"),
        "input_ids": plan.ids_for(state_bins(trace["state"], policy.norm_stats.state)),
        "attention_bias": pipe.input_buffer("attention_bias"),
        "encoder_attention_mask": pipe.input_buffer("encoder_attention_mask"),
        "hidden_states": pipe.input_buffer("hidden_states"),
        "actions_normalized": chunk.actions_normalized,
        "chunk": chunk.actions,
    }
    observed["attention_bias"], golden_bias = bias_for_comparison(
        observed["attention_bias"], trace["attention_bias"]) if "attention_bias" in trace \
        else (observed["attention_bias"], None)
    rows = []
    for name in TRACE_CHECKS:
        if name in trace:
            golden = golden_bias if name == "attention_bias" else trace[name]
            rows.append(compare(stage, name, observed[name], golden,
                                limits=e2e_limits(table, precision, name)))
    return rows
