"""Natural-language instructions a sim declares, and the rule that makes one an episode's prompt.

A language-conditioned policy (SmolVLA, pi0, an openpi server) must be told what to do: LeRobot's
``task`` (``batch["task"]``), openpi's ``"prompt"``. pytest-hud carries it as the episode's
*prompt*, which the bridge fixes when a claim lands on a slot (:func:`claim_prompt`):

1. the claim's own prompt (``shared_sim.episode(seed, prompt="...")``) always wins;
2. else the instruction the sim declares for the claim's task (``VectorSim.instructions``,
   e.g. ``MultiTaskSim(..., instructions={"push-v3": "push the puck to the goal"})``);
3. else, for a multi-task sim, the task's name (Meta-World's experts key on it);
4. else the sim's one instruction (``VectorSim.instruction``): a plain gymnasium env declares it
   with an attribute, found through its wrappers (:func:`declared_instruction`):
   ``hud_instruction``, else LeRobot's ``task_description``, else ``language_instruction``
   (LIBERO's and robosuite's name);
5. else no prompt (LeRobot policies then see ``task == ""``, as in ``lerobot-eval``).

Instructions are read when the sim is built (one per task), not at each reset: an instruction that
changes from episode to episode belongs in the claim's prompt.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["INSTRUCTION_ATTRS", "check_instructions", "claim_prompt", "declared_instruction"]

#: Attributes a gymnasium env may declare its instruction with, in the order they are read.
INSTRUCTION_ATTRS = ("hud_instruction", "task_description", "language_instruction")


def declared_instruction(env: Any) -> str | None:
    """The instruction a gymnasium env declares (:data:`INSTRUCTION_ATTRS`, through its wrappers), or None.

    An empty string counts as none (LeRobot envs start with ``task_description = ""``); any other
    value that is not a string is an error naming the attribute.
    """
    for name in INSTRUCTION_ATTRS:
        try:
            value = env.get_wrapper_attr(name) if hasattr(env, "get_wrapper_attr") else getattr(env, name)
        except AttributeError:
            continue
        if value is None or value == "":
            continue
        if not isinstance(value, str):
            owner = type(getattr(env, "unwrapped", env)).__name__
            raise TypeError(f"{owner}.{name} must be a string (the episode's natural-language instruction), "
                            f"got a {type(value).__name__}")
        return value
    return None


def check_instructions(instructions: Mapping[str, str] | None, tasks: Sequence[str]) -> dict[str, str]:
    """``instructions`` (task name -> instruction) as a dict, checked against ``tasks``.

    >>> check_instructions({"push": "push the puck"}, ["reach", "push"])
    {'push': 'push the puck'}
    """
    if instructions is None:
        return {}
    if not isinstance(instructions, Mapping):
        raise TypeError(f"instructions must map task names to text, got a {type(instructions).__name__}")
    out: dict[str, str] = {}
    for task, text in instructions.items():
        if task not in tasks:
            raise ValueError(f"instructions name task {task!r}, which is not one of the sim's tasks "
                             f"{list(tasks)}; declare the task, or drop its instruction")
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"the instruction of task {task!r} must be a non-empty string, got {text!r}")
        out[str(task)] = text
    return out


def claim_prompt(prompt: str | None, task: str | None, instructions: Mapping[str, str],
                 instruction: str | None) -> str | None:
    """The prompt an episode runs with (the rule in this module's docstring).

    >>> claim_prompt(None, "push", {"push": "push the puck"}, None)
    'push the puck'
    >>> claim_prompt(None, "reach", {"push": "push the puck"}, None)
    'reach'
    >>> claim_prompt("go left", "push", {"push": "push the puck"}, None)
    'go left'
    >>> claim_prompt(None, None, {}, "open the drawer")
    'open the drawer'
    """
    if prompt is not None:
        return prompt
    if task is not None:
        return instructions.get(task, task)
    return instruction
