"""Meta-World v3 tasks (MT10, MT50) for pytest-hud bridges: seeds that mean something, optional pixels.

Needs the ``metaworld`` extra (``pip install "pytest-hud[metaworld]"``: metaworld 3.1.1, mujoco 3.3).
The file is called ``meta_world.py`` so that ``import metaworld`` inside it finds the package, not
this file.

**Observation** ``{"state": float32 [39]}`` (Meta-World's observation: hand, gripper, objects, the
previous frame's copy of those, and the goal), plus ``"pixels": uint8 [size, size, 3]`` with
``pixels=True`` (a 128-px camera by default, rotated right side up: Meta-World's corner cameras
are mounted upside down). **Action** ``float32 [4]`` in ``[-1, 1]`` (hand xyz delta, gripper).
**Success** is Meta-World's ``info["success"]``; with ``stop_on_success=True`` (the default) the
first successful step ends the episode, otherwise it runs to the 500-step cap.

**Score** (``info["score"]``, in [0, 1], what a gate with ``metric="score"`` compares): the episode's
mean *progress* over its step budget (``max_episode_steps``), the last step's progress held to the end
of the budget. A step's progress is ``1 - d / d1``, clipped to [0, 1], where ``d`` is Meta-World's
``info["obj_to_target"]`` (the object's distance to its goal; the hand's for reach tasks) and ``d1``
that distance after the first step; a successful step's progress is 1. So a success scores near 1 (the
sooner, the higher), and a failure scores by how close, and how soon, the object came to its goal.

**Seeds.** Meta-World ignores ``reset(seed=...)``; what varies between its episodes is a *task
variation* (object and goal positions, ``rand_vec``), 50 of them per task per benchmark seed. Here an
episode seed ``s`` always means the same variation::

    variation(task, s) = metaworld.MT1(task, seed=s // 50).train_tasks[s % 50]

so seeds 0-49 are the 50 variations of ``MT1(task, seed=0)`` (what ``gym.make("Meta-World/MT1",
env_name=task, seed=0)`` samples from), seeds 50-99 those of ``MT1(task, seed=1)``, and so on.
``MT1`` seeds numpy's legacy generator, which takes seeds below 2**32, so the largest episode seed is
``MAX_SEED = 50 * 2**32 - 1``; the envs declare it (``hud_claims``), and a bridge refuses a larger
seed at claim time. A claim without a seed gets one drawn by the bridge and recorded in the results
(``reset(seed=None)`` on the env itself repeats the last variation: never a new episode). The
env is reset after ``set_task(variation)`` with Meta-World's random task sampling off, so an episode
depends only on (task, seed): not on the slot, the worker, the width or the episodes run before in
the same env. Anyone can rebuild an episode from Meta-World alone with the formula above.

Building ``MT1(task, seed=b)`` costs 1-2 s (an env and 50 resets), once per task and block in a
process; ``meta_world_variations.npz`` next to this file holds block 0 (seeds 0-49) of every task as
``MT1`` makes it with the Meta-World version it records (``python evals/sims/meta_world.py`` rewrites
it; a test checks it against ``MT1``). With another Meta-World version it is ignored.

**Rendering** (``pixels=True``): offscreen through MuJoCo's GL backend (``MUJOCO_GL=egl`` headless;
set here when unset). To reproduce a frame bit for bit outside this module, with the same MuJoCo
(3.3.0 with metaworld 3.1.1) and GL backend:

1. build Meta-World's env with ``render_mode="rgb_array"``, ``camera_name=camera`` (``corner2`` by
   default), ``width=height=size`` (128 by default);
2. set ``env.model.vis.quality.offsamples = 0`` (no multisampling) *before* the offscreen context
   exists, then create it: ``viewer = env.mujoco_renderer._get_viewer("rgb_array")``;
3. turn two scene flags off: ``viewer.scn.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0`` and
   ``viewer.scn.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0`` (every other flag and
   ``model.vis`` setting as Meta-World leaves them);
4. render by camera id (``mujoco.mj_name2id(model, mjOBJ_CAMERA, camera)``) with
   ``viewer.render("rgb_array", camera_id=...)``, after ``viewer.make_context_current()``;
5. rotate the frame by 180 degrees: ``frame[::-1, ::-1]`` (rows and columns reversed; the corner
   cameras are mounted upside down), as a C-contiguous ``uint8 [size, size, 3]`` array.

The observation's frame is rendered after the step (or reset) whose state it shows. These settings
cut a frame from 85-95 ms to 8-13 ms on a CPU; making the env's own context current every time
keeps several envs rendering in one process (a bridge's slots) from returning each other's frames.
A step whose frame its policy will not read (the middle of an action chunk: ``hud_skip_render``,
see ``pytest_hud.sim.renders``) renders nothing and keeps the last frame; the frames that are read
are the same as rendering every step (``tests/e2e/meta_world``).

Factories (bridge targets):

- ``meta_world.py:meta_world`` — a **multi-task** sim (:class:`pytest_hud.sim.MultiTaskSim`): one
  bridge serves every task; each claim names its task (``shared_sim.episode(seed=s, task="push-v3")``)
  and gets it as its prompt. Declares all 50 v3 tasks by default (MT10 first; envs are built only
  when a slot first runs a task, then cached per slot), or ``build={"tasks": [...]}``.
- ``meta_world.py:single_task`` (``build={"task": "push-v3", ...}``): one task, a plain gymnasium
  env the bridge vectorizes (one bridge per task).

Build arguments shared by both: ``pixels`` (False), ``size`` (128), ``camera`` ("corner2"),
``stop_on_success`` (True), ``max_episode_steps`` (500), and the **perturbations** of a robustness
suite (``evals/test_meta_world_robustness.py``), all off by default:

- ``obs_noise`` (0.0): Gaussian noise of this standard deviation (metres, for positions) added to the
  state observation (a noisy sensor; the policy sees it, the physics does not);
- ``action_noise`` (0.0): Gaussian noise added to each action before it is clipped (noisy actuation);
- ``action_delay`` (0): each action reaches the robot this many steps late; until then the robot
  holds still (zero action) (latency between policy and robot).

The noise of an episode is drawn from its seed (``numpy.random.default_rng([seed, 1])``), so an
episode stays a function of (task, seed, build): the variation a seed means is unchanged, and the
same seed meets the same noise at every run, slot and width.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from pytest_hud.sim import ClaimRules

os.environ.setdefault("MUJOCO_GL", "egl")  # headless rendering; must be set before mujoco is imported

__all__ = [
    "MT10",
    "MAX_EPISODE_STEPS",
    "VARIATIONS_PER_SEED_BLOCK",
    "MetaWorldTask",
    "all_tasks",
    "meta_world",
    "single_task",
    "variation",
]

#: The ten MT10 tasks, in Meta-World's order.
MT10 = (
    "reach-v3",
    "push-v3",
    "pick-place-v3",
    "door-open-v3",
    "drawer-open-v3",
    "drawer-close-v3",
    "button-press-topdown-v3",
    "peg-insert-side-v3",
    "window-open-v3",
    "window-close-v3",
)
#: Meta-World's own cap on an episode (its envs refuse to step past it).
MAX_EPISODE_STEPS = 500
#: Task variations per ``MT1`` benchmark seed: episode seed ``s`` is variation ``s % 50`` of ``MT1(task, seed=s // 50)``.
VARIATIONS_PER_SEED_BLOCK = 50
#: The largest episode seed: its block (``seed // 50``) seeds numpy's legacy generator in ``MT1``,
#: which takes seeds below 2**32.
MAX_SEED = VARIATIONS_PER_SEED_BLOCK * 2**32 - 1
#: The seed every env is constructed with (Meta-World draws nothing from it once a variation is set).
CONSTRUCTION_SEED = 0

_VARIATIONS: OrderedDict[tuple[str, int], list[Any]] = OrderedDict()  # (task, block) -> MT1 train tasks
VARIATION_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "meta_world_variations.npz")
_TABLE: dict[str, np.ndarray] | None = None


def _metaworld():
    try:
        import metaworld
    except ImportError as exc:
        raise ImportError(
            f"the Meta-World sims need the metaworld package ({exc}); "
            'install it with: pip install "pytest-hud[metaworld]" -c constraints/metaworld.txt'
        ) from None
    return metaworld


def all_tasks() -> tuple[str, ...]:
    """Every Meta-World v3 task name (the 50 of MT50): the MT10 tasks first, then the others in Meta-World's order."""
    _metaworld()
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS

    return MT10 + tuple(t for t in ALL_V3_ENVIRONMENTS if t not in MT10)


def check_task(task: str) -> str:
    names = all_tasks()
    if task not in names:
        raise ValueError(f"{task!r} is not a Meta-World v3 task; choose one of {', '.join(names)}")
    return task


def variation(task: str, seed: int) -> Any:
    """The Meta-World ``Task`` (variation) that episode ``seed`` of ``task`` runs (see the module docstring)."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"a Meta-World episode seed is an integer from 0 to {MAX_SEED}, got {seed!r}")
    block, index = divmod(int(seed), VARIATIONS_PER_SEED_BLOCK)
    key = (task, block)
    tasks = _VARIATIONS.get(key)
    if tasks is None:
        tasks = _tabled(task) if block == 0 else None
        if tasks is None:
            tasks = _metaworld().MT1(check_task(task), seed=block).train_tasks
        _VARIATIONS[key] = tasks
        while len(_VARIATIONS) > 64:  # each list holds 50 small pickles; keep the recent ones
            _VARIATIONS.popitem(last=False)
    else:
        _VARIATIONS.move_to_end(key)
    return tasks[index]


def _metaworld_version() -> str:
    from importlib.metadata import version

    return version("metaworld")


def _tabled(task: str) -> list[Any] | None:
    """Block 0 of ``task`` from the shipped table, as ``MT1(task, seed=0).train_tasks`` (None if not there)."""
    global _TABLE
    if _TABLE is None:
        _TABLE = {}
        if os.path.exists(VARIATION_TABLE):
            with np.load(VARIATION_TABLE) as data:
                if str(data["metaworld_version"]) == _metaworld_version():
                    _TABLE = {k: data[k] for k in data.files if k != "metaworld_version"}
    rand_vecs = _TABLE.get(task)
    if rand_vecs is None:
        return None
    import pickle

    from metaworld.env_dict import ALL_V3_ENVIRONMENTS
    from metaworld.types import Task

    cls = ALL_V3_ENVIRONMENTS[task]
    # what MT1 pickles for each variation (its multi-task override: the goal is observed)
    return [Task(env_name=task, data=pickle.dumps({"rand_vec": vec.copy(), "env_cls": cls,
                                                   "partially_observable": False}))
            for vec in rand_vecs]


def write_variation_table(path: str = VARIATION_TABLE, tasks: tuple[str, ...] | None = None) -> None:
    """Write block 0 (seeds 0-49) of ``tasks`` (default: all 50) as ``MT1(task, seed=0)`` makes them."""
    import pickle

    metaworld = _metaworld()
    table: dict[str, np.ndarray] = {}
    for task in tasks or all_tasks():
        vecs = [pickle.loads(t.data)["rand_vec"] for t in metaworld.MT1(task, seed=0).train_tasks]
        table[task] = np.array(vecs, dtype=np.float64)
    np.savez_compressed(path, metaworld_version=np.array(_metaworld_version()), **table)


_RENDERING: Any = None  # weak set of rendering envs, closed at exit before EGL shuts down


def _close_at_exit(env: MetaWorldTask) -> None:
    """Close rendering envs still open at interpreter exit while EGL still works (quiet exits).

    Registered after MuJoCo's EGL module registered its own ``eglTerminate``, so it runs first.
    """
    global _RENDERING
    if _RENDERING is None:
        import atexit
        import weakref

        _RENDERING = weakref.WeakSet()
        atexit.register(lambda: [e.close() for e in list(_RENDERING)])
    _RENDERING.add(env)


class MetaWorldTask(gym.Env):
    """One Meta-World v3 task as a gymnasium env whose reset seed picks a fixed variation.

        env = MetaWorldTask("push-v3", pixels=True)
        obs, info = env.reset(seed=7)          # variation 7 of MT1("push-v3", seed=0)
        obs, reward, terminated, truncated, info = env.step(np.zeros(4, np.float32))

    ``reset(seed=None)`` repeats the last variation (variation 0 before any seeded reset).
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": 80}
    #: What a bridge's claims may carry: seeds up to MAX_SEED, no reset options (none are read).
    hud_claims = ClaimRules(max_seed=MAX_SEED, options=())

    def __init__(self, task: str = "reach-v3", pixels: bool = False, size: int = 128,
                 camera: str = "corner2", stop_on_success: bool = True,
                 max_episode_steps: int = MAX_EPISODE_STEPS, obs_noise: float = 0.0,
                 action_noise: float = 0.0, action_delay: int = 0) -> None:
        from metaworld.env_dict import ALL_V3_ENVIRONMENTS

        check_task(task)
        if not (float(obs_noise) >= 0 and float(action_noise) >= 0 and int(action_delay) >= 0):
            raise ValueError(f"obs_noise, action_noise and action_delay must be >= 0, got "
                             f"{obs_noise}, {action_noise}, {action_delay}")
        self.obs_noise, self.action_noise, self.action_delay = float(obs_noise), float(action_noise), int(action_delay)
        self._noise = np.random.default_rng([0, 1])
        self._seed = 0
        self._pending: list[np.ndarray] = []
        if not 1 <= int(max_episode_steps) <= MAX_EPISODE_STEPS:
            raise ValueError(f"max_episode_steps must be in [1, {MAX_EPISODE_STEPS}], got {max_episode_steps}")
        if pixels and int(size) < 8:
            raise ValueError(f"image size must be at least 8 pixels, got {size}")
        self.task = task
        self.pixels = bool(pixels)
        self.size = int(size)
        self.stop_on_success = bool(stop_on_success)
        self.max_episode_steps = int(max_episode_steps)
        self.render_mode = "rgb_array" if self.pixels else None
        cls = ALL_V3_ENVIRONMENTS[task]
        self.env = cls(render_mode=self.render_mode, camera_name=camera if self.pixels else None,
                       width=self.size, height=self.size)
        self.env.seed(CONSTRUCTION_SEED)
        self._viewer = None
        self._camera_id = None
        if self.pixels:
            self._viewer, self._camera_id = self._fast_viewer(camera)
        features: dict[str, spaces.Space] = {
            "state": spaces.Box(-np.inf, np.inf, shape=(39,), dtype=np.float32),
        }
        if self.pixels:
            features["pixels"] = spaces.Box(0, 255, shape=(self.size, self.size, 3), dtype=np.uint8)
        self.observation_space = spaces.Dict(features)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
        self._variation = variation(task, 0)
        self._steps = 0
        self._first_distance: float | None = None  # obj_to_target after the episode's first step
        self._progress_sum = 0.0  # the episode's progress so far, summed over its steps
        self._skip_next = False  # the next step's frame goes unread (hud_skip_render)
        self._frame: np.ndarray | None = None  # the last rendered frame

    def hud_skip_render(self, skip: bool) -> None:
        """The next step's frame will not be read: keep the last one (pytest_hud.sim.renders)."""
        self._skip_next = bool(skip)

    def _fast_viewer(self, camera: str):
        import mujoco

        env = self.env
        # No multisampling: must be set before the viewer's MjrContext is created just below.
        env.model.vis.quality.offsamples = 0
        renderer = env.mujoco_renderer
        viewer = renderer._get_viewer("rgb_array")
        viewer.scn.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
        viewer.scn.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        _close_at_exit(self)
        camera_id = mujoco.mj_name2id(env.model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
        if camera_id < 0:
            raise ValueError(f"Meta-World has no camera {camera!r}; try corner, corner2, corner3, topview")
        return viewer, camera_id

    def render(self) -> np.ndarray:
        """The camera frame, ``(size, size, 3)`` uint8, right side up."""
        if self._viewer is None:
            raise RuntimeError("this env was built with pixels=False; build it with pixels=True to render")
        # Another env's context may be current (several envs render in one bridge process): make
        # ours current every time, or this frame could come from the other env's framebuffer.
        self._viewer.make_context_current()
        frame = self._viewer.render("rgb_array", camera_id=self._camera_id)
        return np.ascontiguousarray(frame[::-1, ::-1])  # the corner cameras are mounted upside down

    def _observation(self, state: np.ndarray, render: bool = True) -> dict[str, np.ndarray]:
        state = np.asarray(state, dtype=np.float64)
        if self.obs_noise > 0:
            state = state + self._noise.normal(0.0, self.obs_noise, state.shape)
        obs = {"state": state.astype(np.float32)}
        if self.pixels:
            if render or self._frame is None:
                self._frame = self.render()
            obs["pixels"] = self._frame
        return obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._variation = variation(self.task, seed)
            self._seed = int(seed)
        self._noise = np.random.default_rng([self._seed, 1])  # the episode's noise, from its seed
        self._pending, self._skip_next = [], False
        self.env.set_task(self._variation)  # freezes the variation: no random task sampling on reset
        state, info = self.env.reset()
        self._steps = 0
        self._first_distance, self._progress_sum = None, 0.0
        info = {"success": False, "is_success": False, "task": self.task, "score": 0.0}
        return self._observation(state), info

    def step(self, action: np.ndarray):
        action = np.asarray(action, dtype=np.float32).reshape(4)
        if self.action_noise > 0:
            action = action + self._noise.normal(0.0, self.action_noise, 4).astype(np.float32)
        if self.action_delay > 0:
            self._pending.append(action)
            action = self._pending.pop(0) if len(self._pending) > self.action_delay else np.zeros(4, np.float32)
        action = np.clip(action, -1.0, 1.0)
        state, reward, _, truncated, info = self.env.step(action)
        self._steps += 1
        success = bool(info.get("success", 0.0))
        info = dict(info, success=success, is_success=success, task=self.task,
                    score=self._score(info, success))
        terminated = self.stop_on_success and success
        truncated = bool(truncated) or self._steps >= self.max_episode_steps
        render, self._skip_next = not self._skip_next, False
        return self._observation(state, render), float(reward), terminated, truncated, info

    def _score(self, info: dict[str, Any], success: bool) -> float:
        """The episode's score after this step (see the module's docstring)."""
        distance = float(info.get("obj_to_target", 0.0))
        if self._first_distance is None:
            self._first_distance = distance
        progress = 1.0 if success else (
            min(1.0, max(0.0, 1.0 - distance / self._first_distance)) if self._first_distance > 0 else 0.0)
        self._progress_sum += progress
        remaining = max(0, self.max_episode_steps - self._steps)
        return (self._progress_sum + remaining * progress) / max(self.max_episode_steps, self._steps)

    def close(self) -> None:
        viewer, self._viewer = self._viewer, None
        if viewer is not None:
            try:
                viewer.make_context_current()
                viewer.con.free()  # its GL resources, while its own context is current
                viewer.free()  # then that context only (gymnasium's close also terminates glfw)
            except Exception:  # noqa: BLE001 - a context already gone at exit
                pass
            self.env.mujoco_renderer._viewers.clear()
            self.env.mujoco_renderer.viewer = None
        self.env.close()


def single_task(task: str = "reach-v3", pixels: bool = False, size: int = 128, camera: str = "corner2",
                stop_on_success: bool = True, max_episode_steps: int = MAX_EPISODE_STEPS,
                **perturbations: Any) -> gym.Env:
    """Bridge target for one task (``build={"task": ...}``): the bridge vectorizes ``width`` copies."""
    return MetaWorldTask(task, pixels=pixels, size=size, camera=camera, stop_on_success=stop_on_success,
                         max_episode_steps=max_episode_steps, **perturbations)


def meta_world(num_envs: int, tasks: str | list[str] = "MT50", pixels: bool = False, size: int = 128,
               camera: str = "corner2", stop_on_success: bool = True,
               max_episode_steps: int = MAX_EPISODE_STEPS, cache_size: int | None = None,
               obs_noise: float = 0.0, action_noise: float = 0.0, action_delay: int = 0):
    """Bridge target: one multi-task bridge of ``num_envs`` slots for ``tasks`` (``"MT10"``, ``"MT50"`` or names).

    Each slot caches up to ``cache_size`` envs, one per task it ran recently (default 4 from state,
    ~35 MB each; 2 with pixels, ~150-190 MB each). The first task is the default for a claim that
    names none.
    """
    if cache_size is None:
        cache_size = 2 if pixels else 4
    from pytest_hud.sim import MultiTaskSim

    if isinstance(tasks, str):
        named = {"MT10": MT10, "MT50": all_tasks()}
        if tasks not in named:
            raise ValueError(f"tasks must be 'MT10', 'MT50' or a list of v3 task names, got {tasks!r}")
        names = named[tasks]
    else:
        names = tuple(check_task(t) for t in tasks)

    def make_env(task: str) -> MetaWorldTask:
        return MetaWorldTask(task, pixels=pixels, size=size, camera=camera,
                             stop_on_success=stop_on_success, max_episode_steps=max_episode_steps,
                             obs_noise=obs_noise, action_noise=action_noise, action_delay=action_delay)

    return MultiTaskSim(num_envs, names, make_env, cache_size=cache_size)


if __name__ == "__main__":
    write_variation_table()
    print(f"wrote {VARIATION_TABLE}")
