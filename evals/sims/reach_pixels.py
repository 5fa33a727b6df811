"""PointReach seen through its camera only: the observation is ``{"pixels": HxWx3 uint8}``."""

from __future__ import annotations

import gymnasium as gym
from gymnasium import spaces

from reach import make_reach


class PixelsOnly(gym.ObservationWrapper):
    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.observation_space = spaces.Dict({"pixels": env.observation_space["pixels"]})

    def observation(self, observation):
        return {"pixels": observation["pixels"]}


def reach_pixels(size: int = 64) -> gym.Env:
    return PixelsOnly(make_reach(image=True, size=size))
