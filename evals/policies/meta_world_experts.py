"""Meta-World's scripted experts as pytest-hud policies, and degraded variants for gate demonstrations.

The expert for a task is ``metaworld.policies.ENV_POLICY_MAP[task]()``; it reads the 39-float state.
The episode's prompt names the task (a Meta-World bridge gives each claim its task name as the prompt
unless the test passes one), so one policy object serves every task of a multi-task suite.

- ``expert``: the scripted expert (MT10 x 10 seeds: about 98 % success).
- ``expert_delayed``: the same expert whose actions reach the robot 10 steps late (zeros until then):
  a clean, deterministic regression on tasks that need timing (push, pick-place, peg-insert-side).
- ``expert_noisy``: the expert plus Gaussian action noise (sigma 0.5), seeded per episode from the
  episode's first observation, so an episode stays reproducible under any worker, slot or width.

Factories take no arguments (``--hud-policy evals/policies/meta_world_experts.py:expert_delayed``).
"""

from __future__ import annotations

import hashlib
import warnings
from collections import deque

import numpy as np

__all__ = ["ScriptedExpert", "expert", "expert_delayed", "expert_noisy"]


class ScriptedExpert:
    """Meta-World's scripted expert for the episode's task (its prompt), optionally delayed or noisy."""

    def __init__(self, delay: int = 0, noise: float = 0.0) -> None:
        if delay < 0 or noise < 0:
            raise ValueError(f"delay and noise must be non-negative, got {delay}, {noise}")
        self.delay, self.noise = int(delay), float(noise)
        self._experts: dict[str, object] = {}
        self._queue: deque[np.ndarray] = deque()
        self._rng: np.random.Generator | None = None

    def reset(self) -> None:
        """Called at each episode start: forget the last episode's delayed actions and noise stream."""
        self._queue.clear()
        self._rng = None

    def _expert(self, task: str | None):
        if task is None:
            raise ValueError(
                "the Meta-World expert needs the task name as the episode's prompt (e.g. 'push-v3'); "
                "claim episodes on a Meta-World bridge, or pass shared_sim.episode(prompt=TASK)")
        expert = self._experts.get(task)
        if expert is None:
            from metaworld.policies import ENV_POLICY_MAP

            if task not in ENV_POLICY_MAP:
                raise ValueError(f"no scripted Meta-World expert for {task!r}; the prompt must be a v3 task name")
            expert = self._experts[task] = ENV_POLICY_MAP[task]()
        return expert

    def predict(self, observation, prompt: str | None = None) -> np.ndarray:
        state = np.asarray(observation["state"], dtype=np.float64)
        with warnings.catch_warnings():
            # the experts warn on every step that their gains exceed the action range (the env clips)
            warnings.simplefilter("ignore", UserWarning)
            action = np.asarray(self._expert(prompt).get_action(state), dtype=np.float32)
        if self.noise > 0.0:
            if self._rng is None:  # seeded by the episode's first observation: same episode, same noise
                digest = hashlib.sha256(np.ascontiguousarray(observation["state"]).tobytes()).digest()
                self._rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
            action = action + self._rng.normal(0.0, self.noise, size=action.shape).astype(np.float32)
        if self.delay > 0:
            self._queue.append(action)
            action = self._queue.popleft() if len(self._queue) > self.delay else np.zeros_like(action)
        return np.clip(action, -1.0, 1.0).astype(np.float32)


def expert() -> ScriptedExpert:
    """Meta-World's scripted expert for each episode's task."""
    return ScriptedExpert()


def expert_delayed() -> ScriptedExpert:
    """The expert with a 10-step action delay (a regression for the gate demonstration)."""
    return ScriptedExpert(delay=10)


def expert_noisy() -> ScriptedExpert:
    """The expert with Gaussian action noise, sigma 0.5, seeded per episode."""
    return ScriptedExpert(noise=0.5)
