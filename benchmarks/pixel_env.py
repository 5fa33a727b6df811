"""A classic-control env whose observation is its own rendering, downsampled to 96x96 RGB (a pixel env).

Pendulum-v1 by default: its episodes run the full 200 steps under zero actions, so a throughput
benchmark measures stepping, not episode turnover (CartPole falls after ~10 zero-action steps, and
then every slot pays a new claim, a new WebSocket and a reset render every few ticks).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces


class PixelObservation(gym.ObservationWrapper):
    def __init__(self, env: gym.Env, size: int = 96) -> None:
        super().__init__(env)
        self.size = size
        self.observation_space = spaces.Dict({"pixels": spaces.Box(0, 255, (size, size, 3), np.uint8)})

    def observation(self, observation):
        frame = self.env.render()
        rows = np.linspace(0, frame.shape[0] - 1, self.size).astype(int)
        cols = np.linspace(0, frame.shape[1] - 1, self.size).astype(int)
        return {"pixels": np.ascontiguousarray(frame[rows][:, cols])}


def make(env_id: str = "Pendulum-v1", size: int = 96) -> gym.Env:
    return PixelObservation(gym.make(env_id, render_mode="rgb_array"), size)


class TwoCameras(gym.ObservationWrapper):
    """Two cameras of ``size`` x ``size`` (the input size of most VLA policies): the rendering and its mirror."""

    def __init__(self, env: gym.Env, size: int = 224) -> None:
        super().__init__(PixelObservation(env, size))
        box = spaces.Box(0, 255, (size, size, 3), np.uint8)
        self.observation_space = spaces.Dict({"top": box, "side": box})

    def observation(self, observation):
        top = observation["pixels"]
        return {"top": top, "side": np.ascontiguousarray(top[:, ::-1])}


def make_two_cameras(env_id: str = "Pendulum-v1", size: int = 224) -> gym.Env:
    return TwoCameras(gym.make(env_id, render_mode="rgb_array"), size)
