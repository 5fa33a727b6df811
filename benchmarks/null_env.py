"""A near-free env: Pendulum-v1's spaces and 200-step episodes, with a step that costs nothing.

Served by a bridge, what the bridge's process spends per slot-step on it is the bridge's own
machinery (messaging, scheduling, codec), not the sim's. ``benchmarks/bridge_cpu.py --env null``
serves it on every bridge: pytest-hud's as ``benchmarks/null_env.py:make``, the HUD SDK's as the
gymnasium id ``null_env:NullPendulum-v0`` (gymnasium imports the module, which registers the id).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

ENV_ID = "NullPendulum-v0"


class NullPendulum(gym.Env):
    """Pendulum-v1's observation and action spaces; every step returns the same observation."""

    metadata = {"render_modes": []}

    def __init__(self) -> None:
        high = np.array([1.0, 1.0, 8.0], dtype=np.float32)
        self.observation_space = spaces.Box(-high, high, dtype=np.float32)
        self.action_space = spaces.Box(-2.0, 2.0, (1,), np.float32)
        self._obs = np.array([1.0, 0.0, 0.0], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        return self._obs.copy(), {}

    def step(self, action):
        return self._obs.copy(), 0.0, False, False, {}


def make() -> gym.Env:
    return gym.make(ENV_ID)


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=NullPendulum, max_episode_steps=200)
