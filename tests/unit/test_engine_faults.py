"""The bridge engine's fault rules as plain function calls: a sim exception that breaks the bridge,
an isolated slot's fault, rebuilds and retirements (a fake batch stands in for the sim).
"""

from __future__ import annotations

import numpy as np
import pytest

from pytest_hud.bridge.engine import BridgeEngine, Timeouts, resolve_tick
from pytest_hud.bridge.exceptions import (
    ActionTimeout, BadAction, BadClaim, BridgeBroken, ClaimTimeout, EpisodeOver, NoFirstObservation,
    SimFailed, SlotError, SlotReleased, TaskError,
)
from pytest_hud.bridge.server import close_code
from pytest_hud.bridge.slots import Slot, SlotState
from enginekit import CONTRACT, TIMEOUTS, FakeBatch, act, lane_tick, lanes, live_slot, make, ready, tick

# ------------------------------------------------------- sim exceptions
def test_a_sim_exception_fails_every_live_slot_and_breaks_the_bridge():
    engine, sim = make(3)
    a, b = live_slot(engine, sim, 1), live_slot(engine, sim, 2)
    waiting = engine.claim(1, {"seed": 3})
    act(engine, a, b)
    failed = dict(engine.faults.step_failed(engine.tick_rules.plan_tick(), "Traceback ...\nRuntimeError: it exploded"))
    assert failed.keys() == {a.index, b.index}
    assert all(isinstance(f, SimFailed) and "RuntimeError: it exploded" in str(f) for f in failed.values())
    assert a.state is b.state is SlotState.DONE and a.error.startswith("sim raised during step: RuntimeError")
    assert engine.broken and engine.broken_reason == "RuntimeError: it exploded"
    with pytest.raises(BridgeBroken, match="bridge is broken: RuntimeError: it exploded"):
        engine.bind(engine.open(0.0), {"claim": waiting.token})
    assert engine.tick_rules.plan_tick() is None


def test_a_slot_whose_reset_ran_after_the_bridge_broke_fails_instead_of_waiting_forever():
    engine, sim = make(2)
    a = live_slot(engine, sim, 1)
    b = engine.claim(2, {"seed": 2})
    assert engine.bind(engine.open(0.0), {"claim": b.token}) is b  # bound: its reset waits for the sim
    act(engine, a)
    engine.faults.step_failed(engine.tick_rules.plan_tick(), "Traceback ...\nRuntimeError: it exploded")
    plan = engine.plan_reset([b])
    engine.apply_reset(plan, *sim.reset(plan))  # the sim may well reset after a step raised
    with pytest.raises(BridgeBroken, match="bridge is broken: RuntimeError: it exploded"):
        engine.start(b, 0.0)
    assert b.state is SlotState.DONE and "it exploded" in b.error


def test_in_ready_mode_a_sim_exception_also_fails_the_live_slots_that_did_not_act():
    engine, sim = make(2, tick="ready", tick_window=0.002)
    a, b = live_slot(engine, sim, 1), live_slot(engine, sim, 2)
    act(engine, a, now=1.0)
    plan = engine.tick_rules.plan_tick(now=2.0)  # only a's action is in
    assert [s for s, _, _ in plan.acting] == [a]
    failed = dict(engine.faults.step_failed(plan, "Traceback ...\nRuntimeError: it exploded"))
    assert isinstance(failed[a.index], SimFailed) and isinstance(failed[b.index], BridgeBroken)
    assert "it exploded" in str(failed[b.index]) and b.state is SlotState.DONE


def test_a_sim_exception_at_reset_fails_the_slot_being_bound():
    engine, _ = make(1)
    slot = engine.claim(1, {"seed": 1})
    engine.bind(engine.open(0.0), {"claim": slot.token})
    failure, ended = engine.reset_failed(engine.plan_reset([slot]), "Traceback\nValueError: bad seed")
    assert str(failure) == "sim raised during reset: ValueError: bad seed" and ended == []
    assert slot.state is SlotState.DONE and slot.error == str(failure)


def test_a_bound_slot_that_missed_its_reset_has_no_first_observation():
    engine, _ = make(1, wave=True)
    slot = engine.claim(1, {})
    engine.bind(engine.open(0.0), {"claim": None})  # dialed before any wave reset ran
    with pytest.raises(NoFirstObservation, match="slot 0 has no first observation"):
        engine.start(slot, 0.0)


def test_only_a_sim_fault_closes_with_1011():
    assert close_code(SimFailed("sim raised during step: boom")) == 1011
    # an agent's own error that happens to mention the words is still the agent's
    assert close_code(BadAction("slot 0: an action frame is {'actions': array}, got a map with "
                                "keys ['sim raised']")) == 1008
    for failure in (BadClaim("x"), ClaimTimeout("x"), ActionTimeout("x"), BridgeBroken("x"),
                    SlotReleased("x"), EpisodeOver("x"), NoFirstObservation("x")):
        assert close_code(failure) == 1008


# ------------------------------------------------------------ slot faults
def test_a_reset_that_breaks_a_natively_batched_sim_fails_every_live_episode_at_once():
    engine, sim = make(3)
    running = live_slot(engine, sim, seed=5)
    act(engine, running)  # waiting for the lockstep tick, which can never come now
    claimed = engine.claim(2, {"seed": 13})
    engine.bind(engine.open(0.0), {"claim": claimed.token})
    failure, ended = engine.reset_failed(engine.plan_reset([claimed]), "Traceback\nValueError: seed 13")
    assert claimed.error == str(failure)
    assert [i for i, _ in ended] == [running.index] and running.state is SlotState.DONE
    told = ended[0][1]
    assert isinstance(told, BridgeBroken)
    assert str(told).startswith(f"slot {running.index}: bridge broken by slot {claimed.index}'s reset: "
                                "ValueError: seed 13")
    assert engine.tick_rules.plan_tick(now=1.0) is None and not engine.can_claim() or engine.broken


def test_an_isolated_slots_fault_fails_its_episode_only_and_the_slot_is_rebuilt_before_its_next_claim():
    engine, sim = make(3, isolates=True)
    a, b = live_slot(engine, sim, seed=5), live_slot(engine, sim, seed=6, owner=2)
    act(engine, a, b)
    plan = engine.tick_rules.plan_tick(now=0.0)
    failed = dict(engine.faults.faulted([(s, t) for s, t, _ in plan.acting], {a.index: "Traceback\nKeyError: 'x'"},
                                 "step"))
    assert list(failed) == [a.index] and isinstance(failed[a.index], SimFailed)
    assert str(failed[a.index]).startswith(f"slot {a.index}'s env raised during step: KeyError: 'x'")
    assert a.state is SlotState.DONE and b.state is SlotState.LIVE and not engine.broken
    plan.acting = [e for e in plan.acting if e[0] is not a]
    frames = dict(engine.tick_rules.apply_batch(plan, *sim.step(plan), now=0.0))
    assert list(frames) == [b.index] and b.steps == 1 and a.steps == 0
    engine.release(a, "graded")
    assert engine.faults.to_rebuild() == [a.index]
    assert engine.claim(3, {"seed": 1}).index != a.index  # never lands on a slot being rebuilt
    engine.faults.rebuilt(a.index, None)
    assert a.service is None and engine.faults.to_rebuild() == []


def test_a_lockstep_tick_does_not_step_or_park_a_slot_out_of_service():
    engine, sim = make(3, isolates=True)
    a = live_slot(engine, sim, seed=5)
    engine.faults.faulted([], {2: "Traceback\nRuntimeError: hold step"}, "step")  # a free slot's hold step raised
    act(engine, a)
    plan = engine.tick_rules.plan_tick(now=0.0)
    assert plan.mask is not None and plan.mask.tolist() == [True, True, False] and 2 not in plan.park


def test_a_slot_is_retired_after_repeated_faults_or_a_failed_rebuild_and_the_last_one_breaks_the_bridge():
    engine, _ = make(2, isolates=True, max_faults=2)
    engine.faults.faulted([], {0: "Traceback\nValueError: one"}, "reset")
    engine.faults.rebuilt(0, None)
    engine.faults.faulted([], {0: "Traceback\nValueError: two"}, "reset")
    assert engine.slots[0].service.startswith("retired: its env raised 2 times (last: ValueError: two)")
    assert engine.faults.in_service == 1 and engine.faults.to_rebuild() == []
    assert engine.faults.notes == ["slot 0 retired: its env raised 2 times (last: ValueError: two); "
                            "the bridge runs on 1 of 2 slots"]
    assert [engine.claim(1, {}).index for _ in range(1)] == [1] and not engine.can_claim()
    engine.faults.faulted([], {1: "Traceback\nOSError: gone"}, "step")
    engine.faults.rebuilt(1, "Traceback\nOSError: cannot build")
    assert engine.broken and "every slot of this bridge was retired" in engine.broken
