"""A gymnasium pendulum seen through its own ``rgb_array`` rendering, that skips renders it is told
no one reads (``hud_skip_render``) and logs every render it makes to ``log`` (one line each).

Its episodes end after ``steps`` steps; an episode succeeds when the pendulum's tip ends above the
pivot (``cos(theta) > 0``), so some seeds succeed and some fail under one policy.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces

SIZE = 48


class PixelPendulum(gym.Wrapper):
    def __init__(self, log: str, steps: int) -> None:
        super().__init__(gym.make("Pendulum-v1", render_mode="rgb_array"))
        self.log, self.steps = log, steps
        self.observation_space = spaces.Dict({
            "state": spaces.Box(-np.inf, np.inf, (3,), np.float32),
            "pixels": spaces.Box(0, 255, (SIZE, SIZE, 3), np.uint8)})
        self._skip, self._pixels, self._t = False, None, 0

    def hud_skip_render(self, skip: bool) -> None:
        self._skip = skip

    def _render(self) -> np.ndarray:
        with open(self.log, "a") as f:
            f.write("r\n")
        frame = self.env.render()
        rows = np.linspace(0, frame.shape[0] - 1, SIZE).astype(int)
        cols = np.linspace(0, frame.shape[1] - 1, SIZE).astype(int)
        return np.ascontiguousarray(frame[rows][:, cols])

    def reset(self, *, seed=None, options=None):
        state, info = self.env.reset(seed=seed, options=options)
        self._skip, self._t = False, 0
        self._pixels = self._render()
        return {"state": state.astype(np.float32), "pixels": self._pixels}, info

    def step(self, action):
        state, reward, terminated, truncated, info = self.env.step(action)
        if not self._skip:
            self._pixels = self._render()
        self._skip = False
        self._t += 1
        done = self._t >= self.steps
        info = dict(info, is_success=bool(done and state[0] > 0))
        return {"state": state.astype(np.float32), "pixels": self._pixels}, reward, done, False, info


def make(log: str, steps: int = 30) -> gym.Env:
    return PixelPendulum(log, steps)
