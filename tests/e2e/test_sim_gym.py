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
from pytest_hud.sim.base import GymSim, SlotFaults, stepping_hint
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


# ------------------------------------------------------------- --hud-vectorization=threads
def _trajectory(vectorization: str, width: int, ticks: int) -> list:
    """Mixed batched and per-slot steps and resets, as a bridge makes them; every row, every tick."""
    sim = load_sim("Pendulum-v1", width, vectorization)
    try:
        sim.reset_slots(list(range(width)), [100 + i for i in range(width)], [None] * width)
        rng = np.random.default_rng(0)
        seen = []
        for t in range(ticks):
            actions = rng.uniform(-2, 2, (width, 1)).astype(np.float32)
            mask = rng.uniform(size=width) < 0.6
            batch = sim.step(actions) if t % 3 == 0 else sim.step_slots(actions, mask)
            seen.append((batch.rewards.tolist(), sim.observe()["state"].tolist()))
            if t % 7 == 6:
                sim.reset_slots([t % width], [1000 + t], [None])
                seen.append(sim.observe()["state"].tolist())
        return seen
    finally:
        sim.close()


def test_threads_vectorization_gives_every_slot_exactly_what_sync_does():
    assert load_sim("Pendulum-v1", 2, "threads").supports_slot_step
    assert _trajectory("threads", 5, 40) == _trajectory("sync", 5, 40)


def test_each_env_is_built_reset_stepped_and_closed_on_one_thread_of_its_own_never_the_callers():
    import os
    import threading

    sim = load_sim(f"{SIMKIT}:thread_witness", 4, "threads")
    envs = list(sim.env.envs)
    sim.reset_slots([0, 2], [1, 2], [None, None])
    sim.step(np.zeros((4, 1), np.float32))
    sim.step_slots(np.zeros((4, 1), np.float32), np.array([False, True, True, False]))
    sim.close()
    owners = []
    for env in envs:
        assert [w for w, _ in env.calls][:1] == ["make"] and {"reset", "step", "close"} <= {w for w, _ in env.calls}
        threads = {t for _, t in env.calls}
        assert len(threads) == 1, env.calls  # one owner thread for its whole life
        owners.append(threads.pop())
    assert threading.get_ident() not in owners
    assert len(set(owners)) == min(4, len(os.sched_getaffinity(0)))  # one thread per core, at most one per env
    assert owners[0] == owners[len(set(owners)) % 4]  # env i on thread i % threads
    assert not [t for t in threading.enumerate() if t.name.startswith("hud-env-")]  # joined at close


@pytest.mark.parametrize("vectorization", ["sync", "threads"])
def test_an_env_that_raises_is_pinned_on_its_slot_once_every_env_has_stepped(vectorization):
    sim = load_sim(f"{SIMKIT}:step_raises", 3, vectorization)
    try:
        assert sim.isolates_slots
        sim.reset_slots([0, 1, 2], [1, 2, 3], [None] * 3)
        before = sim.observe()["state"].copy()
        with pytest.raises(SlotFaults) as raised:
            sim.step(np.float32([[0.0], [2.0], [0.0]]))
        assert list(raised.value.faults) == [1] and "step refused action 2" in raised.value.faults[1]
        assert "slot 1: RuntimeError: step refused action 2" in str(raised.value)
        after = sim.observe()["state"]
        assert not np.array_equal(after[[0, 2]], before[[0, 2]])  # the others stepped
        assert np.array_equal(after[1], before[1]) and raised.value.result.rewards[1] == 0.0
        sim.rebuild_slot(1)  # a new env, steppable at once
        sim.step(np.zeros((3, 1), np.float32))
    finally:
        sim.close()


def test_env_threads_map_in_order_and_raise_the_first_error_in_slot_order():
    from pytest_hud.sim.threads import EnvThreads, default_threads

    threads = EnvThreads(2)
    try:
        assert threads.map(lambda i: i * i, [3, 0, 2, 1]) == [9, 0, 4, 1]

        def fail(i):
            if i in (1, 3):
                raise ValueError(f"env {i}")
            return i

        with pytest.raises(ValueError, match="env 1"):
            threads.map(fail, [3, 2, 1, 0])
    finally:
        threads.close()
    with pytest.raises(RuntimeError, match="closed"):
        threads.map(lambda i: i, [0])
    assert default_threads(1) == 1 and 1 <= default_threads(64) <= 64
    with pytest.raises(ValueError, match="at least 1"):
        EnvThreads(0)


# ----------------------------------------------------------- a vectorization that does not apply
@pytest.mark.parametrize("target, asked, why", [
    (f"{SIMKIT}:counter", "processes", "the sim steps all its slots in one call"),
    (f"{SIMKIT}:counter", "async", "the factory takes num_envs and vectorizes its envs itself"),
    (f"{SIMKIT}:multitask", "threads", "the factory takes num_envs and vectorizes its envs itself"),
    (f"{SIMKIT}:one_vector_env", "threads", "the factory returns a vectorized sim itself"),
])
def test_a_vectorization_that_does_not_apply_says_why_and_the_sim_runs_as_it_is(target, asked, why):
    sim = load_sim(target, 2, asked)
    try:
        assert type(sim).__name__ != "ProcessSim" and getattr(sim, "_threads", None) is None
        assert sim.vectorization_note.startswith(f"{asked} does not apply: {why}")
    finally:
        sim.close()


@pytest.mark.parametrize("target, asked, width", [
    ("Pendulum-v1", "threads", 2), ("Pendulum-v1", "async", 2), ("Pendulum-v1", "sync", 2),
    (f"{SIMKIT}:counter", "sync", 2), (f"{SIMKIT}:multitask", "processes", 2),
    (f"{SIMKIT}:counter", "processes", 1)])  # one slot: nothing to split
def test_a_vectorization_that_applies_has_no_note(target, asked, width):
    sim = load_sim(target, width, asked)
    try:
        assert sim.vectorization_note is None
    finally:
        sim.close()


@pytest.mark.parametrize("target, asked, width, splittable", [
    ("Pendulum-v1", "sync", 2, True),  # independent envs stepped one after another in one process
    (f"{SIMKIT}:multitask", "sync", 2, True),
    (f"{SIMKIT}:multitask", "threads", 2, True),  # threads did not apply: it runs as it is
    ("Pendulum-v1", "sync", 1, False),  # one slot: nothing to spread
    ("Pendulum-v1", "threads", 2, False), ("Pendulum-v1", "async", 2, False),  # in parallel already
    ("Pendulum-v1", "processes", 2, False),
    (f"{SIMKIT}:counter", "sync", 2, False),  # natively batched: one call steps every slot
    (f"{SIMKIT}:one_vector_env", "sync", 2, False),
])
def test_the_loader_says_which_sims_processes_would_spread_over_the_cores(target, asked, width, splittable):
    sim = load_sim(target, width, asked)
    try:
        assert sim.splittable is splittable
    finally:
        sim.close()


def test_parallel_sims_say_which_lane_steps_each_slot():
    from pytest_hud.sim.threads import default_threads

    n = default_threads(4)
    for asked in ("sync", "threads", "processes"):
        sim = load_sim("Pendulum-v1", 4, asked)
        try:
            if asked == "sync":
                assert sim.lanes is None  # one after another
            elif asked == "threads":
                assert sim.lanes == tuple(i % n for i in range(4))  # env i on thread i % n
            else:  # contiguous blocks, one per process
                assert list(sim.lanes) == sorted(sim.lanes) and sorted(set(sim.lanes)) == list(range(n))
        finally:
            sim.close()


@pytest.mark.parametrize("ticks, env_steps, step_s, span, cores, hinted", [
    (100, 800, 4.0, 10.0, 2, True),     # 5 ms per env-step, busy 40%, 8 envs a tick
    (100, 800, 0.4, 1.0, 2, False),     # 0.5 ms per env-step: cheap
    (100, 800, 2.0, 10.0, 2, False),    # busy 20%: waiting on the policy, not the sim
    (100, 120, 4.0, 10.0, 2, False),    # about one env a tick: nothing to spread
    (100, 800, 4.0, 10.0, 1, False),    # one core
    (0, 0, 0.0, 0.0, 2, False),         # no tick yet
])
def test_the_stepping_hint_speaks_only_when_spreading_envs_over_cores_would_pay(
        ticks, env_steps, step_s, span, cores, hinted):
    sim = load_sim("Pendulum-v1", 8, "sync")
    try:
        hint = stepping_hint(sim, ticks, env_steps, step_s, span, cores)
        assert (hint is not None) is hinted
        if hinted:
            assert hint == ("its 8 envs stepped one after another in one process (5.0 ms per env-step, 40% "
                            "of the time it ran episodes); --hud-vectorization=processes steps them on 2 "
                            "cores, with the same episodes")
        sim.splittable = False
        assert stepping_hint(sim, ticks, env_steps, step_s, span, cores) is None
    finally:
        sim.close()


def test_envs_in_processes_see_the_same_steps_and_render_flags_as_in_one_process():
    """Slots stepped a few at a time, some told their next image goes unread: every row of every
    observation is what the one-process sim gives, and a flag holds for its slot's next step only
    (an answer carries the rows of the slots it stepped, a step takes its flags with it)."""
    from pytest_hud.sim.processes import ProcessSim
    from pytest_hud.sim.target import build_sync

    target = f"{SIMKIT}:skipping_camera"
    one = build_sync(target, 4, {}, None)
    split = ProcessSim(target, 4, {}, None, 2, build=build_sync)
    try:
        rng = np.random.default_rng(3)
        for sim in (one, split):
            sim.reset_slots([0, 1, 2, 3], [1, 2, 3, 4], [None] * 4)
        for _ in range(40):
            mask = rng.random(4) < 0.5
            unread = mask & (rng.random(4) < 0.6)  # as the bridge flags them: stepped slots only
            actions = rng.uniform(-1, 1, (4, 1)).astype(np.float32)
            if rng.random() < 0.2:  # a reset of one slot between steps
                slot = int(rng.integers(4))
                for sim in (one, split):
                    sim.reset_slots([slot], [slot + 7], [None])
            for sim in (one, split):
                sim.skip_renders(unread.copy())
                if mask.any():
                    sim.step_slots(actions, mask)
            for key, rows in one.observe().items():
                np.testing.assert_array_equal(split.observe()[key], rows, err_msg=key)
        drawn = split.observe()["drawn"][:, 0]
        assert (drawn < split.observe()["t"][:, 0] % 1000 + 1).any()  # some renders were skipped
    finally:
        one.close()
        split.close()


# ----------------------------------------------------------------- --hud-vectorization=auto
def test_auto_spreads_envs_whose_step_is_slow_over_processes_and_keeps_cheap_ones_in_the_bridge():
    from pytest_hud.sim.processes import ProcessSim
    from pytest_hud.sim.threads import default_threads

    cheap = load_sim("Pendulum-v1", 2, "auto")
    try:  # ~20 µs per step: stepping in the bridge's process costs less than a pipe round trip
        assert isinstance(cheap, GymSim) and cheap.lanes is None and cheap.splittable
        assert cheap.auto_choice is None and cheap.vectorization_note is None
    finally:
        cheap.close()
    slow = load_sim(f"{SIMKIT}:slow_pendulum", 2, "auto")
    try:
        if default_threads(2) < 2:
            assert isinstance(slow, GymSim) and slow.auto_choice is None  # one core: nothing to spread
        else:
            assert isinstance(slow, ProcessSim) and len(set(slow.lanes)) == 2
            assert slow.auto_choice.startswith("auto chose processes: ")
            assert "ms per env-step, so the 2 envs step on 2 cores" in slow.auto_choice
            assert float(slow.auto_choice.split(": ")[1].split(" ms")[0]) >= 3.0
        assert slow.vectorization_note is None
    finally:
        slow.close()
    for target, width in ((f"{SIMKIT}:slow_pendulum", 1), (f"{SIMKIT}:multitask", 2), (f"{SIMKIT}:counter", 2)):
        sim = load_sim(target, width, "auto")  # one slot; a cheap multi-task sim; a natively batched one
        try:
            assert not isinstance(sim, ProcessSim) and sim.auto_choice is None and sim.vectorization_note is None
        finally:
            sim.close()
    # a num_envs factory's sim runs as it is, even a slow one whose slots are independent envs: a
    # suite runs several bridges at once, and splitting the MT10 bridges measured slower (docs/benchmarks.md)
    slow = load_sim(f"{SIMKIT}:multitask", 2, "auto", {"delay": 0.003})
    try:
        assert not isinstance(slow, ProcessSim) and slow.auto_choice is None and slow.splittable
    finally:
        slow.close()


def test_auto_timing_steps_leave_no_trace_in_the_episodes():
    """auto steps the first env before serving it as slot 0: an episode there is a fresh env's."""
    sim = load_sim("Pendulum-v1", 2, "auto")
    try:
        actions = [0.5, -1.0, 2.0]
        sim.reset_slots([0, 1], [7, 8], [None, None])
        seen = [sim.observe()["state"].copy()]
        for a in actions:
            sim.step(np.float32([[a], [a]]))
            seen.append(sim.observe()["state"].copy())
        for slot, seed in ((0, 7), (1, 8)):
            np.testing.assert_array_equal(np.stack([s[slot] for s in seen]), np.stack(single(seed, actions)))
    finally:
        sim.close()


def test_auto_keeps_an_env_that_refuses_random_actions_in_sync_with_a_fresh_env():
    import sys

    from pytest_hud.sim.threads import default_threads

    sim = load_sim(f"{SIMKIT}:zero_only", 2, "auto")
    try:
        assert isinstance(sim, GymSim)
        if default_threads(2) >= 2:  # said in the summary: auto did not decide on the env's cost
            assert sim.auto_choice == (
                "auto could not time the env (ValueError: this env takes zero actions only), so its envs step "
                "one after another in the bridge's process (processes spreads them over the cores)")
        kit = sys.modules[f"_hud_sim_{abs(hash(str(SIMKIT.resolve())))}"]  # the module the loader ran
        assert kit._ZeroOnly.built == 3  # the timed env was replaced by a fresh one
        sim.reset_slots([0, 1], [1, 2], [None, None])
        sim.step(np.zeros((2, 1), np.float32))
    finally:
        sim.close()


def test_auto_refuses_an_unsupported_space_as_readably_as_sync():
    from pytest_hud.core.contract import ContractError

    messages = []
    for asked in ("sync", "auto"):  # auto would choose processes (3 ms a step): refused before, here
        with pytest.raises(ContractError) as raised:
            load_sim(f"{SIMKIT}:slow_dict_action", 2, asked)
        messages.append(str(raised.value))
    assert messages[0] == messages[1] and "is not supported; use Box, Discrete" in messages[0]


# ----------------------------------------------------------- --hud-vectorization=processes
def test_processes_vectorization_gives_every_slot_exactly_what_sync_does():
    sim = load_sim("Pendulum-v1", 3, "processes")
    try:
        assert sim.supports_slot_step and sim.supports_slot_reset
        assert sim.contract() == load_sim("Pendulum-v1", 1).contract()
    finally:
        sim.close()
    assert _trajectory("processes", 5, 40) == _trajectory("sync", 5, 40)


def test_an_env_process_whose_env_raises_names_the_slot_and_one_that_dies_names_its_slots():
    import os
    import signal

    sim = load_sim(f"{SIMKIT}:step_raises", 3, "processes")
    try:
        sim.reset_slots([0, 1, 2], [1, 2, 3], [None] * 3)
        blocks = {b.slots: b for b in sim._blocks}
        assert set(blocks) in ({"slots 0-1", "slot 2"}, {"slot 0", "slots 1-2"}) or len(blocks) == 1
        last = sim._blocks[-1]
        assert sim.isolates_slots  # an env that raises is its slot's fault, named by the bridge's index
        with pytest.raises(SlotFaults) as raised:
            sim.step(np.float32([[0.0], [0.0], [2.0]]))
        assert list(raised.value.faults) == [2] and "step refused action 2" in raised.value.faults[2]
        sim.rebuild_slot(2)  # in the process that holds it
        sim.step(np.zeros((3, 1), np.float32))  # the pipes stay in step after a fault
        os.kill(last.process.pid, signal.SIGKILL)
        last.process.join(5)
        with pytest.raises(RuntimeError, match=rf"env process of {last.slots} died \(exit code -9\)"):
            sim.step(np.zeros((3, 1), np.float32))
    finally:
        sim.close()
    assert not [b for b in sim._blocks if b.process.is_alive()]
