"""InstructedReach: two goals, and only the instruction says which one to reach.

A point agent starts between a left goal ``(0.2, 0.5)`` and a right goal ``(0.8, 0.5)``. The
observation ``{"state": [agent_x, agent_y, 0.5, 0.5]}`` (PointReach's layout, the goal half holding
the centre between the goals) does not show which goal counts: the instruction does ("reach the
left goal"). Reaching the instructed goal succeeds; touching the other one ends
the episode as a failure. A policy that ignores its instruction succeeds at most half the time,
so these envs prove that an instruction reaches the policy.

Three ways to serve it, one per way a sim declares instructions
(:mod:`pytest_hud.sim.instructions`):

- ``instructed_reach.py:make_instructed_reach`` — a plain gymnasium env that declares its
  instruction as LeRobot envs do (``task_description``); the goal is a build argument
  (``@pytest.mark.hud(build={"goal": "right"})``).
- ``instructed_reach.py:instructed_reach`` — a multi-task sim (tasks ``left`` and ``right``) with an
  ``instructions`` mapping: a claim chooses the task, the bridge prompts with its instruction.
- either, with ``shared_sim.episode(seed, prompt="reach the right goal")``: an explicit prompt wins.

numpy and gymnasium only.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.wrappers import TimeLimit

__all__ = ["GOALS", "INSTRUCTIONS", "InstructedReach", "instructed_reach", "make_instructed_reach"]

GOALS = {"left": np.array([0.2, 0.5]), "right": np.array([0.8, 0.5])}
INSTRUCTIONS = {"left": "reach the left goal", "right": "reach the right goal"}
GOAL_RADIUS = 0.05
STEP_SIZE = 0.1
MAX_EPISODE_STEPS = 40
CENTRE = np.array([0.5, 0.5])


class InstructedReach(gym.Env):
    """Reach the goal named ``goal`` (``left`` or ``right``); its instruction is ``task_description``."""

    metadata = {"render_modes": []}

    def __init__(self, goal: str = "left") -> None:
        if goal not in GOALS:
            raise ValueError(f"goal must be one of {sorted(GOALS)}, got {goal!r}")
        self.goal = goal
        self.task = goal  # LeRobot envs name the task, and describe it in task_description
        self.task_description = INSTRUCTIONS[goal]
        self.observation_space = spaces.Dict({"state": spaces.Box(0.0, 1.0, shape=(4,), dtype=np.float32)})
        self.action_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self._agent = np.full(2, 0.5)

    def _obs(self) -> dict[str, np.ndarray]:
        return {"state": np.concatenate([self._agent, CENTRE]).astype(np.float32)}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._agent = np.array([self.np_random.uniform(0.45, 0.55), self.np_random.uniform(0.2, 0.8)])
        return self._obs(), {"is_success": False}

    def step(self, action):
        move = np.clip(np.asarray(action, dtype=np.float64).reshape(2), -1.0, 1.0) * STEP_SIZE
        self._agent = np.clip(self._agent + move, 0.0, 1.0)
        distances = {name: float(np.linalg.norm(self._agent - where)) for name, where in GOALS.items()}
        success = distances[self.goal] < GOAL_RADIUS
        wrong = any(d < GOAL_RADIUS for name, d in distances.items() if name != self.goal)
        return self._obs(), -distances[self.goal], success or wrong, False, {"is_success": success}


def make_instructed_reach(goal: str = "left") -> gym.Env:
    """One InstructedReach env for ``goal``, with a 40-step time limit."""
    return TimeLimit(InstructedReach(goal), MAX_EPISODE_STEPS)


def instructed_reach(num_envs: int):
    """A multi-task sim over both goals, each task with its instruction."""
    from pytest_hud.sim import MultiTaskSim

    return MultiTaskSim(num_envs, list(GOALS), make_instructed_reach, cache_size=2, instructions=INSTRUCTIONS)
