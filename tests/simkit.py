"""Small sims for the bridge tests (targets such as ``tests/simkit.py:counter``)."""

from __future__ import annotations

import numpy as np
import gymnasium as gym
from gymnasium import spaces

from pytest_hud.core.contract import Contract, Feature
from pytest_hud.sim import StepBatch, VectorSim


class CounterSim(VectorSim):
    """Per-slot state ``[seed, step]``; an episode lasts ``length`` steps and earns ``seed`` in total.

    So two concurrent episodes with seeds 3 and 6 must see their own seed in every observation and
    be graded 3 and 6. ``explode_at`` makes ``step`` raise at that global tick (sim-exception drill).
    """

    def __init__(self, num_envs: int, length: int = 3, explode_at: int = -1, slot_reset: bool = True):
        super().__init__(num_envs)
        self.length = length
        self.explode_at = explode_at
        self.supports_slot_reset = slot_reset
        self.seed = np.zeros(num_envs)
        self.t = np.zeros(num_envs)
        self.ticks = 0
        self.resets: list[list[int]] = []
        self._contract = Contract(
            features={
                "state": Feature("state", "observation", "state", "float32", (2,), ["seed", "step"]),
                "action": Feature("action", "action", "box", "float32", (1,), ["a"], [-1.0], [1.0]),
            },
            control_rate=10.0,
        )

    def contract(self) -> Contract:
        return self._contract

    def reset_slots(self, indices, seeds, options):
        self.resets.append(list(indices))
        for i, s in zip(indices, seeds):
            self.seed[i] = 0 if s is None else s
            self.t[i] = 0
        return np.zeros(len(indices), bool)

    def step(self, actions):
        self.ticks += 1
        if self.ticks == self.explode_at:
            raise RuntimeError("the sim exploded on purpose")
        self.t += 1
        rewards = self.seed / self.length
        done = self.t >= self.length
        return StepBatch(rewards, done, np.zeros(self.width, bool), success=done & (self.seed > 4))

    def observe(self):
        return {"state": np.stack([self.seed, self.t], axis=1).astype(np.float32)}


def counter(num_envs: int, length: int = 3, explode_at: int = -1):
    return CounterSim(num_envs, length=length, explode_at=explode_at)


def counter_waves(num_envs: int, length: int = 3):
    return CounterSim(num_envs, length=length, slot_reset=False)


class AllAtOnceSim(CounterSim):
    """A sim that resets every slot whenever it resets (a vector env without ``reset_mask``).

    An episode lasts ``seed`` steps of reward 1, so a run that is never disturbed by a reset meant
    for another slot ends with ``steps == total_reward == seed`` and sees its seed in every frame.
    """

    def __init__(self, num_envs: int):
        super().__init__(num_envs, slot_reset=False)

    def reset_slots(self, indices, seeds, options):
        self.resets.append(list(indices))
        self.seed[:] = 0
        self.t[:] = 0
        for i, s in zip(indices, seeds):
            self.seed[i] = 0 if s is None else s
        return np.zeros(len(indices), bool)

    def step(self, actions):
        self.t += 1
        done = self.t >= np.maximum(self.seed, 1)
        return StepBatch(np.ones(self.width), done, np.zeros(self.width, bool))


def all_at_once(num_envs: int):
    return AllAtOnceSim(num_envs)


class _ImageStateEnv(gym.Env):
    """A Dict observation with a camera and a state vector (for contract derivation)."""

    metadata = {"render_fps": 15}

    def __init__(self):
        self.observation_space = spaces.Dict({
            "pixels": spaces.Dict({"top": spaces.Box(0, 255, (8, 6, 3), np.uint8)}),
            "agent_pos": spaces.Box(-1.0, 1.0, (2,), np.float32),
        })
        self.action_space = spaces.Box(-2.0, 2.0, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return {"pixels": {"top": np.zeros((8, 6, 3), np.uint8)},
                "agent_pos": self.np_random.uniform(-1, 1, 2).astype(np.float32)}, {}

    def step(self, action):
        obs, _ = self.reset()
        return obs, 0.0, False, False, {"is_success": True}


def image_state():
    return _ImageStateEnv()


class _SkippingCamera(gym.Env):
    """An env whose camera image can be skipped (``hud_skip_render``): the image holds the step it
    was drawn at, ``drawn`` counts the images drawn, ``t`` the steps; the seed offsets ``t``."""

    def __init__(self):
        self.observation_space = spaces.Dict({
            "image": spaces.Box(0, 255, (4, 4, 3), np.uint8),
            "t": spaces.Box(0, 1e6, (1,), np.float64),
            "drawn": spaces.Box(0, 1e6, (1,), np.float64),
        })
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        self._t, self._drawn, self._skip, self._image = 0, 0, False, np.zeros((4, 4, 3), np.uint8)

    def hud_skip_render(self, skip: bool) -> None:
        self._skip = bool(skip)

    def _obs(self):
        if not self._skip:
            self._image = np.full((4, 4, 3), self._t % 251, np.uint8)
            self._drawn += 1
        self._skip = False
        return {"image": self._image.copy(), "t": np.array([float(self._t)]), "drawn": np.array([float(self._drawn)])}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t, self._drawn, self._skip = 1000 * (seed or 0), 0, False
        return self._obs(), {}

    def step(self, action):
        self._t += 1
        return self._obs(), float(action[0]), False, False, {}


def skipping_camera():
    return _SkippingCamera()


class _TaskEnv(gym.Env):
    """One task of the ``multitask`` sim: state ``[task index, a seeded draw, step]``; lasts 3 + index steps."""

    TASKS = ("left", "right", "up")
    observation_space = spaces.Box(-1e6, 1e6, (3,), np.float32)
    action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, task: str, delay: float = 0.0):
        self.index = self.TASKS.index(task)
        self.draw = self.t = 0.0
        self.delay = delay

    def _obs(self):
        return np.array([self.index, self.draw, self.t], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.draw, self.t = float(self.np_random.uniform()), 0.0
        return self._obs(), {}

    def step(self, action):
        if self.delay:
            import time

            time.sleep(self.delay)
        self.t += 1
        done = self.t >= 3 + self.index
        return self._obs(), float(action[0]), done, False, {"is_success": done and self.index > 0}


def multitask(num_envs: int, cache_size: int = 4, delay: float = 0.0):
    """A multi-task sim (``pytest_hud.sim.MultiTaskSim``) over the tasks left, right and up; each
    step takes ``delay`` seconds more."""
    from functools import partial

    from pytest_hud.sim import MultiTaskSim

    return MultiTaskSim(num_envs, _TaskEnv.TASKS, partial(_TaskEnv, delay=delay), cache_size=cache_size)


class _ThreadWitness(gym.Wrapper):
    """Pendulum that notes in ``calls`` which thread built, reset, stepped and closed it."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.calls: list[tuple[str, int]] = []
        self._note("make")

    def _note(self, what: str) -> None:
        import threading

        self.calls.append((what, threading.get_ident()))

    def reset(self, **kwargs):
        self._note("reset")
        return self.env.reset(**kwargs)

    def step(self, action):
        self._note("step")
        return self.env.step(action)

    def close(self):
        self._note("close")
        return self.env.close()


def thread_witness():
    """Pendulum-v1 whose every call is noted with its thread (``--vectorization threads`` tests)."""
    return _ThreadWitness(gym.make("Pendulum-v1"))


class _StepRaises(gym.Wrapper):
    def step(self, action):
        if float(action[0]) > 1.5:
            raise RuntimeError(f"step refused action {float(action[0])}")
        return self.env.step(action)


def step_raises():
    """Pendulum-v1 whose step raises on an action above 1.5."""
    return _StepRaises(gym.make("Pendulum-v1"))


class _ThreadDependent(gym.Wrapper):
    """Pendulum whose observation says whether it runs on the main thread: not the same on threads."""

    def _mark(self, obs):
        import threading

        obs = np.array(obs, np.float32)
        obs[2] = 1.0 if threading.current_thread() is threading.main_thread() else 0.0
        return obs

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return self._mark(obs), info

    def step(self, action):
        obs, *rest = self.env.step(action)
        return (self._mark(obs), *rest)


def thread_dependent():
    """An env that is not the same on several threads (``--check-threads`` must say so)."""
    return _ThreadDependent(gym.make("Pendulum-v1"))


def one_vector_env():
    """A factory without ``num_envs`` that returns a vector env itself (two CartPoles)."""
    return gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2,
                                    autoreset_mode=gym.vector.AutoresetMode.DISABLED)


class _Slow(gym.Wrapper):
    def __init__(self, env, delay):
        super().__init__(env)
        self.delay = delay

    def step(self, action):
        import time

        time.sleep(self.delay)
        return self.env.step(action)


def slow_pendulum(delay: float = 0.003):
    """Pendulum-v1 whose step takes ``delay`` seconds more (``--vectorization auto`` tests)."""
    return _Slow(gym.make("Pendulum-v1"), delay)


class _ZeroOnly(gym.Wrapper):
    built = 0  # envs built in this process

    def __init__(self, env):
        super().__init__(env)
        type(self).built += 1

    def step(self, action):
        if np.any(np.asarray(action) != 0):
            raise ValueError("this env takes zero actions only")
        return self.env.step(action)


def zero_only():
    """Pendulum-v1 that refuses any action but zero (what ``auto``'s timing steps must survive)."""
    return _ZeroOnly(gym.make("Pendulum-v1"))


class _DictAction(gym.Env):
    """A slow env with an action space the contract does not support."""

    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Dict({"arm": spaces.Box(-1.0, 1.0, (3,), np.float32), "grip": spaces.Discrete(2)})

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        import time

        time.sleep(0.003)
        return np.zeros(2, np.float32), 0.0, False, False, {}


def slow_dict_action():
    return _DictAction()


class FaultyEnv(gym.Env):
    """A single env whose episodes depend only on their seed, with faults injected on purpose.

    Observation ``[seed, step, x]`` (x a seeded random walk pushed by the action), 30 steps, reward
    ``-|x|``; success when ``|x| < 1`` at the end. ``reset`` raises for a seed in ``reset_faults``
    and ``step`` raises at step ``fault_step`` of a seed in ``step_faults``. ``delay`` seconds per
    step keep concurrent episodes overlapping.
    """

    observation_space = spaces.Box(-np.inf, np.inf, shape=(3,), dtype=np.float32)
    action_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)

    def __init__(self, reset_faults=(), step_faults=(), fault_step: int = 10, delay: float = 0.002,
                 max_seed: int | None = None):
        from pytest_hud.sim import ClaimRules

        self.reset_faults, self.step_faults = set(reset_faults), set(step_faults)
        self.fault_step, self.delay = fault_step, delay
        if max_seed is not None:
            self.hud_claims = ClaimRules(max_seed=max_seed, options=("push",))
        self._seed, self.t, self.x, self.push = None, 0, 0.0, 0.0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed in self.reset_faults:
            raise ValueError(f"reset refused seed {seed} on purpose")
        self._seed, self.t = seed, 0
        self.push = float((options or {}).get("push", 0.0))
        self.x = float(self.np_random.normal())
        return self._obs(), {}

    def _obs(self):
        return np.array([-1 if self._seed is None else self._seed, self.t, self.x], np.float32)

    def step(self, action):
        import time

        if self._seed in self.step_faults and self.t == self.fault_step:
            raise RuntimeError(f"step {self.t} of seed {self._seed} exploded on purpose")
        time.sleep(self.delay)
        self.t += 1
        self.x = 0.8 * self.x + 0.3 * float(self.np_random.normal()) + 0.1 * float(np.asarray(action).reshape(-1)[0])
        self.x += self.push
        done = self.t >= 30
        return self._obs(), -abs(self.x), done, False, {"is_success": done and abs(self.x) < 1.0}


def faulty(reset_faults=(), step_faults=(), fault_step: int = 10, delay: float = 0.002, max_seed=None):
    """Target for a bridge of independent envs (one FaultyEnv per slot)."""
    return FaultyEnv(reset_faults, step_faults, fault_step, delay, max_seed)


class FaultyCounterSim(CounterSim):
    """A natively batched sim (one object steps every slot) whose reset raises for seed 13."""

    def reset_slots(self, indices, seeds, options):
        if 13 in seeds:
            raise ValueError("reset refused seed 13 on purpose")
        return super().reset_slots(indices, seeds, options)


def faulty_counter(num_envs: int, length: int = 400):
    return FaultyCounterSim(num_envs, length=length)


class _BigFrames(gym.Env):
    """A camera of ``size``x``size``x3 bytes whose every pixel is the step count (mod 256), and a
    step of microseconds: frames come faster than a slow reader takes them."""

    def __init__(self, size: int = 256):
        self.observation_space = spaces.Box(0, 255, (size, size, 3), np.uint8)
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.t = 0
        self.frame = np.zeros((size, size, 3), np.uint8)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.frame[...] = 0
        return self.frame.copy(), {}

    def step(self, action):
        self.t += 1
        self.frame[...] = self.t % 256
        return self.frame.copy(), 0.0, False, self.t >= 5000, {}


def big_frames(size: int = 256):
    return _BigFrames(size)
