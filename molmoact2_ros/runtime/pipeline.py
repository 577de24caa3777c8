"""The seven-session pipeline behind a small interface the policy drives.

The host writes its inputs into buffers the pipeline owns (``input_buffer``), runs vision,
scatters the image features into ``hidden_states``, then runs the LLM splits, action_context
and the whole flow loop in ``run_action``. ``LocalPipeline`` runs the sessions in this
process; the resident HTP pipeline implements the same interface over shared memory.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Protocol

import numpy as np

from ..bundle.conventions import Conventions
from ..bundle.variants import ACTION_CONTEXT, ACTION_STEP, VISION
from ..host.flow import DEFAULT_BETA, run_flow
from .session import Geometry, SessionSet

INPUT_BUFFERS = (
    "pixel_values",
    "hidden_states",
    "attention_bias",
    "encoder_attention_mask",
    "action_dim_is_pad",
)


class Pipeline(Protocol):
    """What the policy needs from a runtime."""

    geometry: Geometry
    conventions: Conventions

    def input_buffer(self, name: str) -> np.ndarray:
        """A writable array for one of ``INPUT_BUFFERS``, reused across chunks."""

    def run_vision(self) -> np.ndarray:
        """Run vision on ``pixel_values``; returns image_embeds [IMG, H]."""

    def run_action(
        self,
        x0: np.ndarray,
        num_steps: int,
        prefix: np.ndarray | None = None,
        weights: np.ndarray | None = None,
        method: str = "pull",
        beta: float = DEFAULT_BETA,
    ) -> np.ndarray:
        """LLM splits, action_context once, then the flow loop; returns x_N [1, T, A].

        ``prefix`` [1, T, A] (normalised) and per-row ``weights`` [T] inpaint by ``method``
        with the ΠGDM cap ``beta`` (``run_flow``)."""

    @property
    def last_timings_ms(self) -> dict[str, float]:
        """Per-component wall time of the last chunk."""

    def run_component(self, component: str, feeds: Mapping[str, np.ndarray]) -> dict:
        """Run one session on the given inputs (golden parity)."""

    @property
    def failed(self) -> Exception | None:
        """Why the pipeline is down, or None while it is usable."""

    def restart(self) -> None:
        """Bring a failed pipeline back (respawn workers); a no-op where nothing can die."""

    def close(self) -> None:
        """Release every session."""


class LocalPipeline:
    """In-process pipeline over a validated ``SessionSet`` (ONNX Runtime, null sessions)."""

    def __init__(self, sessions: SessionSet, conventions: Conventions) -> None:
        self.sessions = sessions
        self.conventions = conventions
        self.geometry = sessions.geometry
        g, v = self.geometry, sessions.variant
        self._buffers = {
            "pixel_values": np.zeros(
                (1, v.num_cameras, v.patches_per_image, v.patch_dim), np.float32
            ),
            "hidden_states": np.zeros((1, g.seq_len, g.hidden), np.float32),
            "attention_bias": np.zeros((1, 1, g.seq_len, g.seq_len), np.float32),
            "encoder_attention_mask": np.zeros((1, g.seq_len), np.float32),
            "action_dim_is_pad": np.zeros((1, v.max_action_dim), np.float32),
        }
        self._timings: dict[str, float] = {}

    def input_buffer(self, name: str) -> np.ndarray:
        return self._buffers[name]

    @property
    def last_timings_ms(self) -> dict[str, float]:
        return dict(self._timings)

    def _run(self, component: str, feeds: dict) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        out = self.sessions[component].run(feeds)
        self._timings[component] = self._timings.get(component, 0.0) + (
            time.perf_counter() - start
        ) * 1e3
        return out

    def run_component(self, component: str, feeds: Mapping[str, np.ndarray]) -> dict:
        return self.sessions[component].run(feeds)

    def run_vision(self) -> np.ndarray:
        self._timings = {}
        out = self._run(VISION, {"pixel_values": self._buffers["pixel_values"]})
        return out["image_embeds"]

    def run_action(
        self,
        x0: np.ndarray,
        num_steps: int,
        prefix: np.ndarray | None = None,
        weights: np.ndarray | None = None,
        method: str = "pull",
        beta: float = DEFAULT_BETA,
    ) -> np.ndarray:
        b = self._buffers
        hidden = b["hidden_states"]
        keys, values = [], []
        for split in self.sessions.variant.llm_splits:
            out = self._run(split, {"hidden_states": hidden, "attention_bias": b["attention_bias"]})
            hidden = out["hidden_out"]
            keys.append(out["keys"])
            values.append(out["values"])
        ctx = self._run(
            ACTION_CONTEXT,
            {"keys": np.concatenate(keys, axis=0), "values": np.concatenate(values, axis=0)},
        )
        feeds = {
            "k_ctx": ctx["k_ctx"],
            "v_ctx": ctx["v_ctx"],
            "encoder_attention_mask": b["encoder_attention_mask"],
            "action_dim_is_pad": b["action_dim_is_pad"],
        }
        out_name = self.sessions.step_output

        def step(x: np.ndarray, t: np.ndarray) -> np.ndarray:
            feeds["trajectory"], feeds["timestep"] = x, t
            return self._run(ACTION_STEP, feeds)[out_name]

        return run_flow(step, x0, b["action_dim_is_pad"], num_steps, self.conventions,
                        prefix, weights, method, beta)

    @property
    def failed(self) -> Exception | None:
        return None  # in-process sessions either raise per call or work

    def restart(self) -> None:
        pass

    def close(self) -> None:
        self.sessions.close()
