"""Multi-task bridges end to end: one bridge process, claims for different tasks in its slots.

The sim is ``tests/simkit.py:multitask`` (a :class:`pytest_hud.sim.MultiTaskSim` over three small
tasks whose state says which task and which seed produced it), so every frame shows whether it came
from the claimed task and seed.
"""

from __future__ import annotations

import threading

import gymnasium as gym
import numpy as np
import pytest
from conftest import SIMKIT, run_threads

from pytest_hud.client.bridge import BridgeError, ControlClient, SlotClient

pytestmark = pytest.mark.timeout(90)

MULTITASK = f"{SIMKIT}:multitask"
TASKS = ("left", "right", "up")


def play(address, seed, task=None, hold_others=0, build=None, barrier=None):
    """One whole episode; returns (slot, prompt, every state seen, grade)."""
    extra = {"build": build} if build else {}
    with ControlClient(address) as control:
        held = [control.claim(seed=0, task="up", **extra) for _ in range(hold_others)]  # occupy lower slots
        claim = control.claim(seed=seed, **({"task": task} if task else {}), **extra)
        if barrier is not None:
            barrier.wait(30)  # every episode holds its slot before any steps
        seen = []
        with SlotClient(address, claim.token) as ws:
            frame = ws.first_observation
            seen.append(np.array(frame["state"]))
            while not frame["terminated"]:
                frame = ws.step(np.ones(1, np.float32))
                seen.append(np.array(frame["state"]))
        grade = control.result(claim.token)
        for h in held:
            control.release(h.token)
    return claim.slot, claim.prompt, np.array(seen), grade


def reference(task, seed):
    """The same episode in a single env, outside any bridge."""
    from simkit import _TaskEnv

    env = _TaskEnv(task)
    obs, _ = env.reset(seed=seed)
    seen, done = [obs], False
    while not done:
        obs, _, done, _, _ = env.step(np.ones(1, np.float32))
        seen.append(obs)
    return np.array(seen)


@pytest.mark.parametrize("vectorization", ["sync", "processes"])
def test_concurrent_claims_for_different_tasks_share_one_bridge(bridge, vectorization):
    address = bridge(MULTITASK, 3, "--vectorization", vectorization)
    results = {}
    barrier = threading.Barrier(len(TASKS))

    def episode(task, seed):
        def go():
            results[task] = play(address, seed, task, barrier=barrier)
        return go

    assert run_threads([episode(t, s) for t, s in zip(TASKS, (5, 6, 7))]) == []
    assert sorted(r[0] for r in results.values()) == [0, 1, 2]
    for (task, seed) in zip(TASKS, (5, 6, 7)):
        slot, prompt, seen, grade = results[task]
        assert prompt == task  # the task name is the episode's prompt
        np.testing.assert_array_equal(seen, reference(task, seed))
        assert grade["steps"] == 3 + TASKS.index(task) and grade["task"]["task"] == task
        assert grade["success"] == (task != "left")
    with ControlClient(address) as control:
        stats = control.stats()
    assert stats["tasks"] == list(TASKS)
    if vectorization == "sync":
        # one env per slot for its task, plus the first task's env that slot 0 built for the contract
        # when another task's claim got there first
        assert stats["sim"]["builds"] in (3, 4)
    else:
        # the slots split across processes (one per core, at most 3), each block's sim built its own
        # first-task env for the contract: the per-slot caches show where each claim ran
        assert 1 <= stats["sim"]["processes"] <= 3 and len(stats["sim"]["cached"]) == 3
        for slot, cached in enumerate(stats["sim"]["cached"]):
            ran = [task for task, r in results.items() if r[0] == slot]
            assert cached[-1] == ran[0], (slot, cached, ran)


def test_multitask_episodes_are_the_same_in_processes_after_task_switches(bridge):
    """A task and seed give the same episode in a block process, on any slot, after other tasks."""
    address = bridge(MULTITASK, 3, "--vectorization", "processes", "--build-args", '{"cache_size": 1}')
    expected = reference("up", 9)
    for task in ("left", "right"):
        play(address, 2, task, build={"cache_size": 1})
    slot, prompt, seen, _ = play(address, 9, "up", hold_others=2, build={"cache_size": 1})
    # the two held claims spread over the processes (lanes), so which slot is left depends on the
    # cores; whichever it is, the episode is the reference one
    assert slot in (1, 2) and prompt == "up"
    np.testing.assert_array_equal(seen, expected)
    with ControlClient(address) as control:
        stats = control.stats()
    assert stats["sim"]["switches"] >= 1  # slot 0's one-env cache rebuilt for other tasks


def test_a_task_and_seed_give_the_same_episode_on_any_slot_width_and_after_other_tasks(bridge):
    wide, narrow = bridge(MULTITASK, 3), bridge(MULTITASK, 1, "--build-args", '{"cache_size": 1}')
    expected = reference("right", 11)
    np.testing.assert_array_equal(play(wide, 11, "right")[2], expected)
    slot, _, seen, _ = play(wide, 11, "right", hold_others=2)
    assert slot == 2
    np.testing.assert_array_equal(seen, expected)
    for task in ("up", "left", "right"):  # the narrow bridge's one slot switches (and rebuilds) envs
        play(narrow, 3, task, build={"cache_size": 1})
    np.testing.assert_array_equal(play(narrow, 11, "right", build={"cache_size": 1})[2], expected)


def test_a_claim_without_a_task_runs_the_first_one(bridge):
    _, prompt, seen, _ = play(bridge(MULTITASK, 1), 4)
    assert prompt == "left" and seen[0][0] == 0


def test_an_undeclared_task_is_refused_and_the_bridge_keeps_serving(bridge):
    address = bridge(MULTITASK, 1)
    with ControlClient(address) as control, pytest.raises(BridgeError, match=r"task 'down' is not one of this bridge's 3 tasks \(left, right, up\)"):
        control.claim(seed=1, task="down")
    np.testing.assert_array_equal(play(address, 2, "up")[2], reference("up", 2))


def test_a_bridge_without_tasks_refuses_a_claim_that_names_one(bridge):
    with ControlClient(bridge("Pendulum-v1", 1)) as control, pytest.raises(BridgeError, match="declares no tasks"):
        control.claim(seed=1, task="up")
    assert gym.spec("Pendulum-v1")  # the bridge above was a plain gym id: unchanged behaviour


PLUGIN_SUITE = f'''
import os
import pytest

@pytest.mark.hud(sim="{MULTITASK}", policy="policies:ones")
@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("task", ["left", "right", "up"])
def test_tasks(shared_sim, robot_agent, task, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed, task=task))
    with open(os.environ["BRIDGE_PIDS"], "a") as fh:
        fh.write(f"{{shared_sim.address.pid}} {{result.prompt}} {{result.steps}}\\n")
    assert result.steps == 3 + ["left", "right", "up"].index(task)
'''


def test_the_pool_serves_every_task_of_a_suite_from_one_bridge_per_width_group(pytester, monkeypatch):
    pytester.makepyfile(test_tasks=PLUGIN_SUITE, policies="import numpy as np\ndef ones():\n    return lambda obs: np.ones(1, np.float32)\n")
    pids = pytester.path / "pids.txt"
    monkeypatch.setenv("BRIDGE_PIDS", str(pids))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--hud-width=2", timeout=180)
    result.assert_outcomes(passed=6)
    lines = [line.split() for line in pids.read_text().splitlines()]
    assert len(lines) == 6 and len({pid for pid, _, _ in lines}) == 1  # three tasks, one bridge
    assert sorted(prompt for _, prompt, _ in lines) == ["left", "left", "right", "right", "up", "up"]
