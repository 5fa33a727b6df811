"""The gymnasium adapter (``GymSim``) with real envs, in process: which envs step per slot, and how.

Ready-mode ticks step a subset of a ``SyncVectorEnv``'s sub-envs; every slot must then evolve
exactly as a single env with its seed and actions, whatever its neighbours do.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from conftest import SIMKIT
from pytest_hud.sim.base import GymSim
from pytest_hud.sim.target import load_sim


def single(seed: int, actions: list[float]) -> list[np.ndarray]:
    env = gym.make("Pendulum-v1")
    return [env.reset(seed=seed)[0]] + [env.step(np.float32([a]))[0] for a in actions]


def test_stepping_a_subset_matches_single_envs_and_leaves_the_other_slots_alone():
    sim = load_sim("Pendulum-v1", 3)
    assert sim.supports_slot_step
    sim.reset_slots([0, 1, 2], [10, 11, 12], [None] * 3)
    actions = np.float32([[0.5], [9.9], [-1.0]])  # slot 1's row must be ignored: it is not stepped
    for _ in range(3):
        batch = sim.step_slots(actions, np.array([True, False, True]))
        assert batch.rewards[1] == 0.0 and not batch.terminated[1]
    sim.reset_slots([0], [20], [None])  # a later per-slot reset must not touch the others' rows
    state = sim.observe()["state"]
    np.testing.assert_array_equal(state[0], single(20, [])[0])
    np.testing.assert_array_equal(state[1], single(11, [])[0])
    np.testing.assert_array_equal(state[2], single(12, [-1.0] * 3)[-1])
    sim.step_slots(actions, np.array([False, True, False]))
    np.testing.assert_array_equal(sim.observe()["state"][1], single(11, [9.9])[-1])


def test_a_dict_observation_and_success_are_read_per_slot():
    sim = load_sim(f"{SIMKIT}:image_state", 2)
    sim.reset_slots([0, 1], [1, 2], [None, None])
    before = {k: v.copy() for k, v in sim.observe().items()}
    batch = sim.step_slots(np.zeros((2, 2), np.float32), np.array([False, True]))
    assert batch.success.tolist() == [False, True]
    after = sim.observe()
    assert set(after) == {"pixels/top", "agent_pos"}
    np.testing.assert_array_equal(after["agent_pos"][0], before["agent_pos"][0])
    assert not np.array_equal(after["agent_pos"][1], before["agent_pos"][1])


@pytest.mark.parametrize("make, steps_per_slot", [
    (lambda: load_sim("Pendulum-v1", 2), True),  # one env per slot, autoreset disabled
    pytest.param(lambda: load_sim("Pendulum-v1", 2, "async"), False,  # sub-processes: batched calls only
                 marks=pytest.mark.slow),
    (lambda: GymSim(gym.make_vec("CartPole-v1", 2, vectorization_mode="vector_entry_point")), False),
    (lambda: GymSim(SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2,
                                  autoreset_mode=AutoresetMode.NEXT_STEP)), False),  # resets all at once
])
def test_only_sync_vector_envs_with_per_slot_resets_step_per_slot(make, steps_per_slot):
    sim = make()
    try:
        assert sim.supports_slot_step is steps_per_slot
        if not steps_per_slot:
            with pytest.raises(NotImplementedError, match="SyncVectorEnv with autoreset disabled"):
                sim.step_slots(np.stack([sim.hold_action()] * 2), np.array([True, False]))
    finally:
        sim.close()


def test_a_natively_batched_env_refuses_per_slot_seeds_with_the_fix_and_runs_at_width_one():
    wide = GymSim(gym.make_vec("CartPole-v1", 2, vectorization_mode="vector_entry_point"))
    with pytest.raises(ValueError, match="natively batched vector env.*--hud-width=1.*vectorization_mode='sync'"):
        wide.reset_slots([0, 1], [3, 4], [None, None])
    wide.reset_slots([0, 1], [None, None], [None, None])  # unseeded resets still work

    def first_obs(seed):
        sim = GymSim(gym.make_vec("CartPole-v1", 1, vectorization_mode="vector_entry_point"))
        sim.reset_slots([0], [seed], [None])
        return next(iter(sim.observe().values())).copy()

    assert np.array_equal(first_obs(7), first_obs(7)) and not np.array_equal(first_obs(7), first_obs(8))
