"""Instructions: what a sim declares, and which prompt a claim gets (explicit, instruction, task name)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from pytest_hud.bridge.engine import BridgeEngine
from pytest_hud.core.contract import derive_contract
from pytest_hud.sim.base import GymSim
from pytest_hud.sim.instructions import check_instructions, claim_prompt, declared_instruction
from pytest_hud.sim.multitask import MultiTaskSim


class Still(gym.Env):
    observation_space = spaces.Box(-1, 1, (2,), np.float32)
    action_space = spaces.Box(-1, 1, (2,), np.float32)

    def __init__(self, task: str = "a") -> None:
        self.task = task

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.zeros(2, np.float32), 0.0, False, False, {}


def _with(**attrs) -> gym.Env:
    env = Still()
    for name, value in attrs.items():
        setattr(env, name, value)
    return gym.wrappers.TimeLimit(env, 10)  # found through wrappers


def test_an_env_declares_its_instruction_by_any_of_three_names_in_order():
    assert declared_instruction(_with(language_instruction="open the drawer")) == "open the drawer"
    assert declared_instruction(_with(task_description="push", language_instruction="x")) == "push"
    assert declared_instruction(_with(hud_instruction="ours", task_description="theirs")) == "ours"
    assert declared_instruction(_with()) is None
    assert declared_instruction(_with(task_description="")) is None  # LeRobot's "not yet known"


def test_an_instruction_that_is_not_text_is_an_error_naming_the_attribute():
    with pytest.raises(TypeError, match=r"Still\.hud_instruction must be a string"):
        declared_instruction(_with(hud_instruction=3))


def test_instructions_must_name_declared_tasks_and_hold_text():
    assert check_instructions(None, ["a"]) == {}
    with pytest.raises(ValueError, match="task 'c', which is not one of the sim's tasks"):
        check_instructions({"c": "do c"}, ["a", "b"])
    with pytest.raises(ValueError, match="must be a non-empty string"):
        check_instructions({"a": " "}, ["a", "b"])


def test_the_prompt_rule_explicit_then_instruction_then_task_name_then_the_sims_instruction():
    instructions = {"push": "push the puck"}
    assert claim_prompt("mine", "push", instructions, "sim") == "mine"
    assert claim_prompt(None, "push", instructions, "sim") == "push the puck"
    assert claim_prompt(None, "reach", instructions, "sim") == "reach"  # Meta-World: the name
    assert claim_prompt(None, None, instructions, "sim") == "sim"
    assert claim_prompt(None, None, {}, None) is None


def _engine(**kwargs) -> BridgeEngine:
    env = Still()
    contract = derive_contract(env.observation_space, env.action_space, np.zeros(2, np.float32))
    return BridgeEngine(2, contract, np.zeros(2, np.float32), **kwargs)


def test_a_claim_without_a_prompt_gets_its_tasks_instruction_and_an_explicit_one_wins():
    engine = _engine(tasks=("left", "right"), instructions={"left": "go left"})
    assert engine.claim(1, engine.check_task({"task": "left"})).prompt == "go left"
    assert engine.claim(1, engine.check_task({"task": "right"})).prompt == "right"
    with pytest.raises(Exception, match="no free slot"):
        engine.claim(1, engine.check_task({"task": "left"}))
    for slot in engine.slots:
        engine.release(slot, "test")
    assert engine.claim(1, engine.check_task({"task": "left", "prompt": "stay"})).prompt == "stay"


def test_a_single_task_bridge_prompts_with_the_sims_instruction():
    engine = _engine(instruction="open the drawer")
    assert engine.claim(1, engine.check_task({})).prompt == "open the drawer"


def test_a_gym_sim_reads_its_envs_instruction_and_a_multitask_sim_takes_a_mapping():
    vec = gym.vector.SyncVectorEnv([lambda: _with(task_description="push the puck")] * 2,
                                   autoreset_mode=gym.vector.AutoresetMode.DISABLED)
    sim = GymSim(vec)
    assert sim.instruction == "push the puck"
    sim.close()
    multi = MultiTaskSim(1, ["a", "b"], Still, instructions={"b": "do b"})
    assert multi.instructions == {"b": "do b"}
    with pytest.raises(ValueError, match="not one of the sim's tasks"):
        MultiTaskSim(1, ["a"], Still, instructions={"b": "do b"})
