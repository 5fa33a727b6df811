"""A sim whose tick is dominated by waiting (a stand-in for a render or a physics step elsewhere).

``sleepy.py:make`` with build args ``length`` (steps per episode) and ``sleep_ms`` (per tick, for
all slots at once). State ``[seed, t]``; the reward of a step is the action; an episode succeeds when
its return is at least ``length / 2`` -- so a policy that copies ``seed % 2`` into its action passes
odd seeds and fails even ones, the same way wherever it runs.
"""

from __future__ import annotations

import time

import numpy as np

from pytest_hud.core.contract import Contract, Feature
from pytest_hud.sim import StepBatch, VectorSim


class SleepySim(VectorSim):
    def __init__(self, num_envs: int, length: int = 20, sleep_ms: float = 20.0) -> None:
        super().__init__(num_envs)
        self.length, self.sleep_s = int(length), float(sleep_ms) / 1000.0
        self.seed = np.zeros(num_envs)
        self.t = np.zeros(num_envs)
        self.ret = np.zeros(num_envs)
        self._contract = Contract(
            features={
                "state": Feature("state", "observation", "state", "float32", (2,), ["seed", "step"]),
                "action": Feature("action", "action", "box", "float32", (1,), ["a"], [0.0], [1.0]),
            },
            control_rate=50.0,
        )

    def contract(self) -> Contract:
        return self._contract

    def reset_slots(self, indices, seeds, options):
        for i, s in zip(indices, seeds):
            self.seed[i], self.t[i], self.ret[i] = (0 if s is None else s), 0, 0
        return np.zeros(len(indices), bool)

    def step(self, actions):
        time.sleep(self.sleep_s)
        a = np.asarray(actions, np.float64).reshape(self.width, -1)[:, 0]
        self.t += 1
        self.ret += a
        done = self.t >= self.length
        return StepBatch(a.copy(), done, np.zeros(self.width, bool), success=done & (self.ret >= self.length / 2))

    def observe(self):
        return {"state": np.stack([self.seed, self.t], axis=1).astype(np.float32)}


def make(num_envs: int, length: int = 20, sleep_ms: float = 20.0) -> SleepySim:
    return SleepySim(num_envs, length=length, sleep_ms=sleep_ms)


class ParityPolicy:
    """Acts ``seed % 2`` every step (state[0] is the seed)."""

    def predict(self, observation, prompt=None):
        return np.array([float(int(observation["state"][0]) % 2)], np.float32)


def parity() -> ParityPolicy:
    return ParityPolicy()
