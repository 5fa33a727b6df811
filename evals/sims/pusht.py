"""LeRobot's PushT (``gym_pusht/PushT-v0``, gym-pusht 0.1.8) seen through its 96x96 camera.

The observation is ``{"pixels": 96x96x3 uint8, "agent_pos": float64 [2]}`` (``obs_type=
"pixels_agent_pos"``, what ``lerobot-eval --env.type=pusht`` runs), the action a target position
for the pusher in [0, 512]^2. The env reports ``is_success`` itself (coverage of the goal > 95 %,
which also terminates the episode); the reward is that coverage / 0.95, clipped to [0, 1].

:func:`make_pusht` adds ``info["score"]``: the best reward so far in the episode (LeRobot's
``max_reward``), so a failed episode still tells how close the T came to the goal.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

ENV_ID = "gym_pusht/PushT-v0"
GOAL_XY = np.array([256.0, 256.0])  # the goal pose is fixed: (256, 256, pi/4)


class MaxRewardScore(gym.Wrapper):
    """``info["score"]``: the episode's best reward so far, in [0, 1]; and renders no one reads skipped.

    Drawing the 96x96 camera image is about four fifths of a PushT step. Told that the next step's
    image goes unread (``hud_skip_render``, see :mod:`pytest_hud.sim.renders`: the middle of an ACT
    chunk), the step keeps the last drawn image instead of drawing; drawing has no effect on the
    physics, so every other feature, the reward and the images that are read stay bit-identical.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._best = 0.0
        self._skip_next = False  # the next step's image goes unread
        self._pixels: np.ndarray | None = None  # the last drawn image

    def hud_skip_render(self, skip: bool) -> None:
        self._skip_next = bool(skip)

    def reset(self, **kwargs: Any):
        observation, info = self.env.reset(**kwargs)
        self._best, self._skip_next = 0.0, False
        self._pixels = observation.get("pixels") if isinstance(observation, dict) else None
        info["score"] = 0.0
        return observation, info

    def step(self, action):
        inner = self.env.unwrapped
        keep = self._skip_next and self._pixels is not None
        self._skip_next = False
        if keep:  # the env draws its observation through _render(): hand it the last image instead
            last = self._pixels
            inner._render = lambda visualize=False: last.copy()
        try:
            observation, reward, terminated, truncated, info = self.env.step(action)
        finally:
            if keep:
                del inner._render  # the class's own method again
        if isinstance(observation, dict) and "pixels" in observation:
            self._pixels = observation["pixels"]
        self._best = max(self._best, float(reward))
        info["score"] = self._best
        return observation, reward, terminated, truncated, info


def make_pusht(obs_type: str = "pixels_agent_pos", max_episode_steps: int = 300) -> gym.Env:
    """PushT as LeRobot's ``PushtEnv`` config builds it (96x96 observations, 300-step limit)."""
    import gym_pusht  # noqa: F401 - registers gym_pusht/PushT-v0

    env = gym.make(
        ENV_ID,
        obs_type=obs_type,
        render_mode="rgb_array",
        # only env.render() uses these (the observation stays 96x96); nothing here renders
        visualization_width=96,
        visualization_height=96,
        max_episode_steps=max_episode_steps,
        disable_env_checker=True,
    )
    return MaxRewardScore(env)


def expert_action(env: gym.Env, rng: np.random.Generator | None = None, noise: float = 0.0) -> np.ndarray:
    """A crude scripted pusher: get behind the T (on the goal's far side), then push it towards
    the goal position. It ignores the T's orientation, so it rarely reaches 95 % coverage; it is
    only meant to give demonstrations that look like pushing."""
    inner = env.unwrapped
    agent = np.array(inner.agent.position, dtype=np.float64)
    block = np.array(inner.block.position, dtype=np.float64)
    to_goal = GOAL_XY - block
    distance = float(np.linalg.norm(to_goal))
    if distance < 5.0:
        target = agent
    else:
        direction = to_goal / distance
        behind = block - 70.0 * direction
        if np.linalg.norm(agent - behind) > 20.0 and np.dot(agent - block, direction) > -50.0:
            # not behind the T yet: go around it on the side the agent is already on
            side = np.array([-direction[1], direction[0]])
            if np.dot(agent - block, side) < 0:
                side = -side
            waypoint = block + 80.0 * side - 40.0 * direction
            target = behind if np.linalg.norm(agent - waypoint) < 25.0 else waypoint
        else:
            target = block + 30.0 * direction
    step = target - agent
    length = float(np.linalg.norm(step))
    if length > 40.0:  # keep the motion smooth
        step *= 40.0 / length
    action = agent + step
    if noise and rng is not None:
        action = action + rng.normal(0.0, noise, size=2)
    return np.clip(action, 0.0, 512.0).astype(np.float32)
