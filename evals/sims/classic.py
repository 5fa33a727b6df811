"""Gymnasium classic-control tasks with a success signal (the bridge latches ``info["is_success"]``)."""

from __future__ import annotations

import gymnasium as gym


class _SuccessWhen(gym.Wrapper):
    def __init__(self, env: gym.Env, on: str) -> None:
        super().__init__(env)
        self.on = on

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if self.on == "survived":  # still balancing when the time limit ends the episode
            info["is_success"] = bool(truncated and not terminated)
        else:  # reached the goal, which is what terminates the episode
            info["is_success"] = bool(terminated)
        return obs, reward, terminated, truncated, info


def cartpole(max_episode_steps: int = 500) -> gym.Env:
    """CartPole-v1 (Discrete actions); success = the pole is still up after ``max_episode_steps``."""
    return _SuccessWhen(gym.make("CartPole-v1", max_episode_steps=max_episode_steps), "survived")


def mountain_car(max_episode_steps: int = 400) -> gym.Env:
    """MountainCarContinuous-v0 (Box actions); success = the car reaches the flag."""
    return _SuccessWhen(gym.make("MountainCarContinuous-v0", max_episode_steps=max_episode_steps), "goal")
