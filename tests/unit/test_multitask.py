"""Multi-task bridges without sockets: the engine's task rules, and MultiTaskSim's per-slot env caches.

A claim on a sim that declares tasks names one (checked against the list, defaulting to the first),
lands preferably on a slot that already ran it, and its reset carries it to the sim; a sim without
tasks refuses a claim that names one. ``MultiTaskSim`` keeps each slot's envs to itself, builds a
task's env once per slot, never steps a finished env, and refuses a task whose contract differs.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from pytest_hud.core.contract import Contract, Feature
from pytest_hud.sim.base import SlotFaults
from pytest_hud.bridge.engine import BridgeEngine
from pytest_hud.bridge.exceptions import TaskError
from pytest_hud.sim.multitask import MultiTaskSim

CONTRACT = Contract(
    features={
        "state": Feature("state", "observation", "state", "float32", (2,), ["a", "b"]),
        "action": Feature("action", "action", "box", "float32", (1,), ["a"], [-1.0], [1.0]),
    },
)
TASKS = ("reach", "push", "pick")


def engine(width: int = 3, tasks: tuple[str, ...] = TASKS) -> BridgeEngine:
    return BridgeEngine(width, CONTRACT, np.zeros(1, np.float32), tasks=tasks)


# ------------------------------------------------------------------ engine
def test_a_claim_without_a_task_gets_the_sims_first_task_and_its_name_as_prompt():
    e = engine()
    slot = e.claim(1, e.check_task({"seed": 3}))
    assert slot.task["task"] == "reach" and slot.prompt == "reach"
    assert e.plan_reset([slot]).tasks == ["reach"]


def test_a_claims_own_prompt_wins_over_the_task_name():
    e = engine()
    slot = e.claim(1, e.check_task({"seed": 3, "task": "push", "prompt": "push the puck"}))
    assert slot.prompt == "push the puck" and e.plan_reset([slot]).tasks == ["push"]


def test_an_undeclared_task_is_refused_with_the_list():
    with pytest.raises(TaskError, match=r"task 'stack' is not one of this bridge's 3 tasks \(reach, push, pick\)"):
        engine().check_task({"task": "stack"})
    with pytest.raises(TaskError, match="not one of"):
        engine().check_task({"task": 3})


def test_a_sim_without_tasks_refuses_a_claim_that_names_one_and_plans_no_tasks():
    e = engine(tasks=())
    with pytest.raises(TaskError, match="declares no tasks"):
        e.check_task({"task": "push"})
    slot = e.claim(1, e.check_task({"seed": 1}))
    assert e.plan_reset([slot]).tasks is None and slot.prompt is None


def test_a_claim_prefers_a_free_slot_that_last_ran_its_task():
    e = engine()
    first = [e.claim(1, e.check_task({"task": t})) for t in TASKS]
    assert [s.index for s in first] == [0, 1, 2]
    for s in first:
        e.release(s, "graded")
    assert e.claim(1, e.check_task({"task": "pick"})).index == 2
    assert e.claim(1, e.check_task({"task": "push"})).index == 1
    assert e.claim(1, e.check_task({"task": "push"})).index == 0  # no slot with push free: lowest


# --------------------------------------------------------------- the sim
class Counter(gym.Env):
    """state = [task id, steps]; succeeds (and terminates) after ``length`` steps."""

    observation_space = spaces.Box(-1e6, 1e6, shape=(2,), dtype=np.float32)
    action_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
    live: list[Counter] = []

    def __init__(self, task: str, length: int = 2) -> None:
        self.task_id, self.length, self.t, self.closed, self.steps_after_end = TASKS.index(task), length, 0, False, 0
        Counter.live.append(self)

    def _obs(self):
        return np.array([self.task_id, self.t], np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self.t = 0 if seed is None else seed * 100
        return self._obs(), {}

    def step(self, action):
        if self.t % 100 >= self.length:
            self.steps_after_end += 1
        self.t += 1
        done = self.t % 100 >= self.length
        return self._obs(), 1.0, done, False, {"is_success": done}

    def close(self) -> None:
        self.closed = True


@pytest.fixture(autouse=True)
def _fresh_counters():
    Counter.live = []


def test_slots_run_different_tasks_side_by_side_and_idle_slots_are_not_stepped():
    sim = MultiTaskSim(3, TASKS, Counter)
    sim.reset_slots([0, 2], [1, 2], [None, None], tasks=["pick", "push"])
    assert sim.observe()["state"][[0, 2]].tolist() == [[2, 100], [1, 200]]
    batch = sim.step(np.zeros((3, 1), np.float32))
    assert batch.rewards.tolist() == [1.0, 0.0, 1.0]  # slot 1 idles: never reset, never stepped
    batch = sim.step(np.zeros((3, 1), np.float32))
    assert batch.terminated.tolist() == [True, False, True] and batch.success.tolist() == [True, False, True]
    sim.step(np.zeros((3, 1), np.float32))  # finished envs are not stepped again
    assert all(env.steps_after_end == 0 for env in Counter.live)


def test_a_slot_builds_each_task_once_and_evicts_its_least_recent_env():
    sim = MultiTaskSim(2, TASKS, Counter, cache_size=2)
    assert sim.builds == 1  # the first task's env (slot 0's) gives the contract
    for task in ("reach", "push", "reach", "push"):
        sim.reset_slots([0], [0], [None], tasks=[task])
    assert sim.builds == 2 and sim.stats()["cached"][0] == ["reach", "push"]
    sim.reset_slots([0], [0], [None], tasks=["pick"])  # evicts reach, the least recent
    assert sim.stats()["cached"][0] == ["push", "pick"]
    assert [e.closed for e in Counter.live] == [True, False, False]
    sim.reset_slots([1], [0], [None], tasks=["push"])  # slot 1 never uses slot 0's env
    assert sim.builds == 4
    sim.close()
    assert all(e.closed for e in Counter.live)


def test_a_none_task_parks_the_slot_without_resetting_it():
    sim = MultiTaskSim(1, TASKS, Counter)
    sim.reset_slots([0], [3], [None], tasks=["push"])
    sim.reset_slots([0], [None], [None], tasks=[None])
    assert sim.step(np.zeros((1, 1), np.float32)).rewards.tolist() == [0.0]
    assert sim.observe()["state"][0].tolist() == [1, 300]


def test_a_task_with_another_contract_is_refused_with_both_sides():
    class Wider(Counter):
        observation_space = spaces.Box(-1e6, 1e6, shape=(3,), dtype=np.float32)

        def _obs(self):
            return np.zeros(3, np.float32)

    sim = MultiTaskSim(2, TASKS, lambda task: Wider(task) if task == "pick" else Counter(task))
    with pytest.raises(SlotFaults) as refused:  # the claim of that task fails; the other slot resets
        sim.reset_slots([0, 1], [0, 0], [None, None], tasks=["pick", "reach"])
    assert list(refused.value.faults) == [0] and refused.value.intact == {0}
    assert "ContractError: task 'pick' does not share the contract of task 'reach'" in refused.value.faults[0]
    assert refused.value.result.tolist() == [False, False] and sim._active.tolist() == [False, True]


def test_bad_task_lists_are_refused():
    with pytest.raises(ValueError, match="at least one task"):
        MultiTaskSim(1, [], Counter)
    with pytest.raises(ValueError, match="unique"):
        MultiTaskSim(1, ["reach", "reach"], Counter)


def test_step_slots_advances_only_the_masked_running_slots():
    sim = MultiTaskSim(3, TASKS, Counter)
    assert sim.supports_slot_step
    sim.reset_slots([0, 1], [1, 2], [None, None], tasks=["reach", "push"])
    batch = sim.step_slots(np.zeros((3, 1), np.float32), np.array([False, True, True]))
    assert batch.rewards.tolist() == [0.0, 1.0, 0.0]  # slot 0 not in the mask, slot 2 not running
    assert sim.observe()["state"][:2].tolist() == [[0, 100], [1, 201]]
