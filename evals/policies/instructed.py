"""Policies for ``evals/sims/instructed_reach.py`` that act on the instruction (the episode's prompt).

- ``instructed.py:follow_instruction`` — numpy: moves towards the goal its instruction names
  ("reach the left goal"); an instruction that names no goal is an error, so a policy that is
  never told raises instead of guessing.
- :func:`instructed_act_checkpoint` — a LeRobot checkpoint whose *preprocessor* reads LeRobot's
  ``task`` (the complementary data ``task``, which ``lerobot-eval`` fills from the env's
  ``task_description`` and pytest-hud fills from the prompt) and writes the named goal into the
  goal half of ``observation.state``; the ACT policy behind it is the shipped PointReach
  checkpoint (``evals/checkpoints/reach_act/final``), which reaches whatever goal its state holds.
  InstructedReach's state holds the centre between the two goals there, so without the
  instruction the ACT policy heads for neither goal.

The processor step (:class:`InstructionGoalProcessorStep`) subclasses a LeRobot class, so it is
defined on first use; LeRobot finds it by its import path,
``evals.policies.instructed.InstructionGoalProcessorStep`` (the repository root must be on the
import path of the process that loads the checkpoint).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["goal_of", "follow_instruction", "instructed_act_checkpoint"]

GOALS = {"left": (0.2, 0.5), "right": (0.8, 0.5)}
STEP_SIZE = 0.1
REACH_ACT = Path(__file__).resolve().parents[1] / "checkpoints" / "reach_act" / "final"


def goal_of(instruction: str | None) -> tuple[float, float]:
    """The goal an instruction names.

    >>> goal_of("reach the right goal")
    (0.8, 0.5)
    """
    named = [name for name in GOALS if name in (instruction or "").lower()]
    if len(named) != 1:
        raise ValueError(f"the instruction {instruction!r} names neither the left nor the right goal; "
                         "the sim must prompt each episode with its instruction")
    return GOALS[named[0]]


class FollowInstruction:
    """Heads straight for the goal the prompt names."""

    def predict(self, observation: dict[str, np.ndarray], prompt: str | None = None) -> np.ndarray:
        agent = np.asarray(observation["state"], np.float64)[:2]
        return np.clip((np.asarray(goal_of(prompt)) - agent) / STEP_SIZE, -1.0, 1.0).astype(np.float32)


def follow_instruction() -> FollowInstruction:
    return FollowInstruction()


def __getattr__(name: str) -> Any:
    if name == "InstructionGoalProcessorStep":
        cls = _define_step()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _define_step() -> type:
    from dataclasses import dataclass

    from lerobot.processor import ProcessorStep, TransitionKey

    @dataclass
    class InstructionGoalProcessorStep(ProcessorStep):
        """Writes the goal each row's ``task`` names into ``observation.state[:, 2:4]``."""

        def __call__(self, transition: Any) -> Any:
            import torch

            tasks = (transition.get(TransitionKey.COMPLEMENTARY_DATA) or {}).get("task")
            observation = dict(transition[TransitionKey.OBSERVATION])
            state = observation["observation.state"]
            rows = [tasks] if isinstance(tasks, str) or tasks is None else list(tasks)
            if state.ndim == 1:
                state = state.unsqueeze(0)
            if len(rows) != state.shape[0]:
                raise ValueError(f"{len(rows)} tasks for a batch of {state.shape[0]} states")
            goals = torch.tensor([goal_of(task) for task in rows], dtype=state.dtype, device=state.device)
            state = state.clone()
            state[:, 2:4] = goals
            observation["observation.state"] = state
            out = dict(transition)
            out[TransitionKey.OBSERVATION] = observation
            return out

        def transform_features(self, features: dict) -> dict:
            return features

    InstructionGoalProcessorStep.__module__ = __name__
    InstructionGoalProcessorStep.__qualname__ = "InstructionGoalProcessorStep"
    return InstructionGoalProcessorStep


def instructed_act_checkpoint(dest: str | Path, source: str | Path = REACH_ACT) -> Path:
    """Copy the PointReach ACT checkpoint to ``dest`` with :class:`InstructionGoalProcessorStep`
    as its preprocessor's second step (after the rename); returns ``dest``."""
    dest = Path(dest)
    shutil.copytree(source, dest)
    config_file = dest / "policy_preprocessor.json"
    config = json.loads(config_file.read_text())
    step = {"class": "evals.policies.instructed.InstructionGoalProcessorStep", "config": {}}
    config["steps"].insert(1, step)
    config_file.write_text(json.dumps(config, indent=2))
    return dest
