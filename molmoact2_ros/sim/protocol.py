"""The evaluation the published MolmoAct2-LIBERO rates come from, and how a run differs from it.

The published rates are LeRobot's ``lerobot-eval`` (huggingface/lerobot at ``LEROBOT_COMMIT``):
``TASK_SUITE_MAX_STEPS`` and the LIBERO env config's 360 px cameras (``src/lerobot/envs/``),
``num_steps_wait=50`` and ``n_action_steps = chunk_size = 10`` (every row of a chunk runs before
the next observation) from the MolmoAct2 docs (``docs/source/molmoact2.mdx``), and
``policy.per_episode_seed=true`` (each rollout draws its own flow noise). ``--protocol
published`` runs that; ``--protocol node`` runs the node's execution settings; every setting
that differs from the published evaluation is listed beside the rates as a deviation.
"""

from __future__ import annotations

import hashlib
from typing import Any

LEROBOT_COMMIT = "7427f31801f944f5ec9ce53cda02862ce7d1638b"
PROTOCOLS = ("published", "node")
#: LeRobot's ``TASK_SUITE_MAX_STEPS`` (``src/lerobot/envs/libero.py``): policy steps per episode
MAX_STEPS = {"libero_spatial": 280, "libero_object": 280, "libero_goal": 300,
             "libero_10": 520, "libero_90": 400}
#: LeRobot's ``LiberoEnv`` config ``observation_height``/``observation_width`` (``envs/configs.py``)
RENDER_PX = 360
#: ``num_steps_wait=50``: the MolmoAct2 docs' evaluation (LeRobot's env default is 10)
SETTLE_STEPS = 50
IMAGE_ROTATION = "180"
#: ``--seed=1000`` / ``policy.eval_seed=1000`` of the MolmoAct2 docs' eval command
RUN_SEED = 1000
#: the controller settings of each protocol (the rest is the node's default). ``published``:
#: infer once a chunk's last row has run (``n_action_steps`` = the horizon); ``node``: the
#: node's ``execution.overlap_s`` (0.1 s: the next observation two rows before a chunk ends)
EXECUTION = {
    "published": {"trigger": "chunk_consumed", "execution.action_type": "delta",
                  "execution.overlap_s": 0.0, "execution.blend": "none"},
    "node": {"trigger": "chunk_consumed", "execution.action_type": "delta"},
}
#: what the controller settings mean, for the deviation lines
_MEANING = {"execution.overlap_s": "rows of a chunk still ahead when the next observation is "
            "taken (published: 0, every row runs)"}

#: published success rates (%) per suite: which model each variant's lineage is, and where
#: the numbers are printed (``docs/source/molmoact2.mdx``, "LIBERO Benchmark Results")
RATES = {
    "lerobot_finetune": {
        "model": "allenai/MolmoAct2-LIBERO-LeRobot (LeRobot fine-tune)",
        "rates": {"libero_spatial": 98.4, "libero_object": 100.0, "libero_goal": 98.0,
                  "libero_10": 96.6},
        "average": 98.25,
    },
    "original": {
        "model": "allenai/MolmoAct2-LIBERO (original release)",
        "rates": {"libero_spatial": 97.8, "libero_object": 100.0, "libero_goal": 97.8,
                  "libero_10": 93.2},
        "average": 97.2,
    },
}
#: the published model each variant is exported from
VARIANT_RATES = {"grid_sampler": "lerobot_finetune", "lp_vtp_sd": "lerobot_finetune",
                 "fused": "original"}
RATES_SOURCE = (f"huggingface/lerobot {LEROBOT_COMMIT[:8]} docs/source/molmoact2.mdx, "
                "LIBERO Benchmark Results")


def max_steps_of(suite: str) -> int:
    """The suite's step budget; derived suites (LIBERO-PRO) take their base suite's, unknown
    ones LeRobot's default of 500."""
    for base in sorted(MAX_STEPS, key=len, reverse=True):
        if suite == base or suite.startswith(base + "_"):
            return MAX_STEPS[base]
    return 500


def published_rates(variant: str) -> dict[str, Any]:
    """The published rates to read a variant's run against, with the model and the source."""
    entry = RATES[VARIANT_RATES.get(variant, "lerobot_finetune")]
    return {**entry, "source": RATES_SOURCE}


def _seed(*parts: Any) -> int:
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def episode_seeds(suite: str, task_id: int, init_index: int, run_seed: int) -> dict[str, int]:
    """The env seed and the flow-noise seed of one episode, from (suite, task, init, run seed):
    a rerun draws the same, no two episodes share them (LeRobot's per-episode seeds; its
    torch generator's bits are not reproducible with numpy, its independence is)."""
    key = (suite, int(task_id), int(init_index), int(run_seed))
    return {"env_seed": _seed("env", *key), "noise_seed": _seed("noise", *key)}


def deviations(run: dict[str, Any], suite_steps: int, changes: dict[str, Any]) -> list[str]:
    """Every setting of ``run`` that differs from the published evaluation, one phrase each.

    ``changes`` are the controller settings that differ from the published ones (``--set``, or
    the node protocol's)."""
    out = []
    if run["protocol"] != "published":
        out.append(f"protocol {run['protocol']}: the node's execution settings")
    if run["max_steps"] != suite_steps:
        out.append(f"max_steps {run['max_steps']} (published {suite_steps})")
    if run["render_px"] != RENDER_PX:
        out.append(f"render {run['render_px']} px (published {RENDER_PX} px)")
    if run["settle_steps"] != SETTLE_STEPS:
        out.append(f"settle_steps {run['settle_steps']} (published {SETTLE_STEPS})")
    if run["image_rotation"] != IMAGE_ROTATION:
        out.append(f"image_rotation {run['image_rotation']} (published {IMAGE_ROTATION})")
    if run["time_mode"] != "lockstep":
        late = (f"{run['latency_ms']} ms" if run.get("latency_ms") else "measured")
        out.append(f"time_mode {run['time_mode']}: chunks arrive {late} late in sim time "
                   "(published: lockstep)")
    for name, value in sorted(changes.items()):
        meaning = _MEANING.get(name)
        out.append(f"{name}={value}" + (f" ({meaning})" if meaning else ""))
    return out


def execution_changes(settings: Any) -> dict[str, Any]:
    """The controller settings of a run (``Settings``) that differ from the published
    protocol's (what the node protocol or a ``--set`` changed), by name."""
    from ..control.params import PARAMS_BY_NAME

    published = EXECUTION["published"]
    out = {}
    for name in sorted(PARAMS_BY_NAME):
        if name in ("variant", "backend", "instruction", "seed") or name.startswith(
                ("bundle.", "context_suffix.", "runtime.", "topics.")):
            continue
        want = published.get(name, PARAMS_BY_NAME[name].default)
        have = settings[name]
        if have != want and not (isinstance(want, (list, tuple))
                                 and list(have) == list(want)):
            out[name] = have
    return out
