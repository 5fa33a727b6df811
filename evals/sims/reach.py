"""PointReach: a point agent in the unit square must reach a goal. The project's tiny CPU sim.

Observation ``{"state": [agent_x, agent_y, goal_x, goal_y]}`` (float32), plus
``"pixels"`` (HWC uint8, white background, green goal disc, red agent disc) with ``image=True``.
Action: a velocity in ``[-1, 1]^2``; the agent moves ``0.1 * clip(action)`` per step and stays in
the unit square. Success (distance < 0.05) terminates the episode with ``info["is_success"]``;
reward is ``-distance``. :func:`make_reach` adds a 40-step time limit.

Everything random comes from ``self.np_random``, so an episode depends only on its reset seed.
No torch, no pygame: numpy and gymnasium only.

    env = make_reach()
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(expert_action(obs["state"]))
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.wrappers import TimeLimit

__all__ = [
    "GOAL_RADIUS",
    "MAX_EPISODE_STEPS",
    "MIN_START_DISTANCE",
    "STEP_SIZE",
    "PointReach",
    "expert_action",
    "make_reach",
]

STEP_SIZE = 0.1
GOAL_RADIUS = 0.05
MIN_START_DISTANCE = 0.3
MAX_EPISODE_STEPS = 40

_WHITE = np.array([255, 255, 255], dtype=np.uint8)
_RED = np.array([220, 30, 30], dtype=np.uint8)
_GREEN = np.array([30, 170, 60], dtype=np.uint8)


class PointReach(gym.Env):
    """A point agent in the unit square that must come within ``GOAL_RADIUS`` of a goal."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": 10}

    def __init__(self, image: bool = False, size: int = 64, render_mode: str | None = None):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode {render_mode!r} is not supported; use 'rgb_array' or None")
        if size < 8:
            raise ValueError(f"image size must be at least 8 pixels, got {size}")
        self.image = image
        self.size = size
        self.render_mode = render_mode
        features: dict[str, spaces.Space] = {
            "state": spaces.Box(-1.0, 2.0, shape=(4,), dtype=np.float32),
        }
        if image:
            features["pixels"] = spaces.Box(0, 255, shape=(size, size, 3), dtype=np.uint8)
        self.observation_space = spaces.Dict(features)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self._agent = np.zeros(2, dtype=np.float64)
        self._goal = np.zeros(2, dtype=np.float64)
        # Pixel-centre coordinates in world units, computed once; y grows upwards on screen.
        centres = (np.arange(size) + 0.5) / size
        self._grid_x = centres[None, :]
        self._grid_y = centres[::-1, None]
        self._disc_radius = max(1.5 / size, 0.05)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        super().reset(seed=seed)
        self._agent = self.np_random.uniform(0.0, 1.0, size=2)
        self._goal = self.np_random.uniform(0.0, 1.0, size=2)
        while np.linalg.norm(self._goal - self._agent) < MIN_START_DISTANCE:
            self._goal = self.np_random.uniform(0.0, 1.0, size=2)
        return self._observation(), {"is_success": False, "distance": self._distance()}

    def step(self, action: np.ndarray) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        velocity = np.clip(np.asarray(action, dtype=np.float64).reshape(2), -1.0, 1.0)
        self._agent = np.clip(self._agent + STEP_SIZE * velocity, 0.0, 1.0)
        distance = self._distance()
        success = distance < GOAL_RADIUS
        info = {"is_success": bool(success), "distance": distance}
        return self._observation(), -distance, bool(success), False, info

    def render(self) -> np.ndarray:
        """The current frame, ``(size, size, 3)`` uint8."""
        return self._draw()

    def _distance(self) -> float:
        return float(np.linalg.norm(self._goal - self._agent))

    def _observation(self) -> dict[str, np.ndarray]:
        obs = {"state": np.concatenate([self._agent, self._goal]).astype(np.float32)}
        if self.image:
            obs["pixels"] = self._draw()
        return obs

    def _draw(self) -> np.ndarray:
        frame = np.empty((self.size, self.size, 3), dtype=np.uint8)
        frame[:] = _WHITE
        for centre, colour in ((self._goal, _GREEN), (self._agent, _RED)):
            inside = (self._grid_x - centre[0]) ** 2 + (self._grid_y - centre[1]) ** 2
            frame[inside <= self._disc_radius**2] = colour
        return frame


def make_reach(image: bool = False, size: int = 64, render_mode: str | None = None) -> gym.Env:
    """A :class:`PointReach` env with a ``MAX_EPISODE_STEPS`` (40) time limit."""
    return TimeLimit(
        PointReach(image=image, size=size, render_mode=render_mode),
        max_episode_steps=MAX_EPISODE_STEPS,
    )


def expert_action(
    state: np.ndarray,
    noise: float = 0.0,
    rng: np.random.Generator | None = None,
    gain: float = 8.0,
) -> np.ndarray:
    """A scripted expert: head for the goal, at full speed when far, slowing down when close.

    ``gain`` scales the goal offset into a velocity, whose norm is then capped at 1 (saturation).
    ``noise`` adds Gaussian noise of that standard deviation (from ``rng``) for data diversity.
    """
    state = np.asarray(state, dtype=np.float64)
    velocity = gain * (state[2:4] - state[0:2])
    norm = float(np.linalg.norm(velocity))
    if norm > 1.0:
        velocity /= norm
    if noise > 0.0:
        if rng is None:
            raise ValueError(
                "expert_action(noise > 0) needs an rng (np.random.Generator) to stay reproducible"
            )
        velocity = velocity + rng.normal(0.0, noise, size=2)
    return np.clip(velocity, -1.0, 1.0).astype(np.float32)
