"""The bridge engine's claim rules as plain function calls: tokens, binding, timeouts, grades,
releases and the sim's declared claim rules (a fake batch stands in for the sim; time is a number).
``tests/e2e/test_bridge.py`` drives the same rules end to end through real sockets.
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

# ---------------------------------------------------------------- claims
def test_tokens_are_unguessable_and_unique():
    engine, _ = make(4)
    tokens = {engine.claim(1, {"seed": i}).token for i in range(4)}
    assert len(tokens) == 4 and all(len(t) == 32 for t in tokens)  # 128 bits of hex


def test_a_full_bridge_refuses_claims_until_a_slot_is_released():
    engine, _ = make(1)
    slot = engine.claim(1, {})
    assert not engine.can_claim()
    with pytest.raises(SlotError, match="no free slot"):
        engine.claim(1, {})
    assert isinstance(engine.release(slot, "token released"), SlotReleased)
    assert engine.can_claim() and engine.claim(2, {}).index == 0


def test_claims_go_to_the_least_busy_lane_where_slots_step_in_parallel():
    engine, _ = make(4, lanes=(0, 0, 1, 1))  # two processes of two slots each
    a, b = engine.claim(1, {}), engine.claim(1, {})
    assert (a.index, b.index) == (0, 2)  # one episode on each process
    assert engine.claim(1, {}).index == 1  # lanes equally busy: the lowest free index
    engine.release(b, "done")
    assert engine.claim(1, {}).index == 2  # lane 1 is the idle one again
    plain, _ = make(4)  # one after another: the lowest free index, as ever
    assert [plain.claim(1, {}).index for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="lanes names 3 slots, the bridge has 4"):
        make(4, lanes=(0, 0, 1))


def test_closing_an_owner_releases_only_its_claims():
    engine, _ = make(3)
    a, b = engine.claim(1, {}), engine.claim(2, {})
    token = a.token
    assert engine.owned_by(1) == [a]
    for slot in engine.owned_by(1):
        engine.release(slot, "the control connection that claimed this slot closed")
    assert a.state is SlotState.FREE and b.state is SlotState.CLAIMED
    with pytest.raises(SlotError, match="unknown or released"):
        engine.by_token(token)
    with pytest.raises(SlotError, match="only its owner"):
        engine.owned(1, b.token)


def test_a_none_claim_binds_only_an_unambiguous_slot():
    engine, _ = make(2)
    one = engine.claim(1, {})
    assert engine.resolve_claim(None) is one
    engine.claim(1, {})
    with pytest.raises(BadClaim, match="exactly one"):
        engine.bind(engine.open(0.0), {"claim": None})


def test_a_claim_frame_must_name_a_claimed_token_once():
    engine, _ = make(1)
    slot = engine.claim(1, {})
    with pytest.raises(BadClaim, match=r"must be \{'claim': TOKEN\}"):
        engine.bind(engine.open(0.0), [slot.token])
    with pytest.raises(BadClaim, match="unknown or released token"):
        engine.bind(engine.open(0.0), {"claim": "f" * 32})
    engine.bind(engine.open(0.0), {"claim": slot.token})
    with pytest.raises(BadClaim, match="already in use"):
        engine.bind(engine.open(0.0), {"claim": slot.token})


def test_a_task_must_match_the_bridges_build_arguments_and_types():
    engine, _ = make(1, build_args={"task": "push"})
    assert engine.check_task({"build": {"task": "push"}, "seed": 3}) == {"seed": 3}
    with pytest.raises(TaskError, match="claim on another bridge"):
        engine.check_task({"build": {"task": "pull"}})
    with pytest.raises(TaskError, match="non-negative integer"):
        engine.check_task({"build": {"task": "push"}, "seed": True})
    with pytest.raises(TaskError, match="options must be an object"):
        engine.check_task({"build": {"task": "push"}, "options": [1]})


# -------------------------------------------------------------- timeouts
def test_the_claim_frame_deadline_fires_at_its_second():
    engine, _ = make(1)
    handshake = engine.open(now=100.0)
    assert engine.expire(129.9) == []
    [(who, failure)] = engine.expire(130.0)
    assert who is handshake and isinstance(failure, ClaimTimeout)
    assert str(failure) == "no claim frame within 30 s; send {'claim': TOKEN}"
    slot = engine.claim(1, {})
    with pytest.raises(ClaimTimeout):  # a claim frame that arrives after the deadline is refused
        engine.bind(handshake, {"claim": slot.token})


def test_first_action_and_step_deadlines_fire_at_the_right_time():
    engine, sim = make(2)
    slow, quick = live_slot(engine, sim, 1, now=0.0), live_slot(engine, sim, 2, now=0.0)
    assert engine.expire(299.0) == []  # model warm-up: minutes allowed for the first action
    act(engine, slow, quick)
    tick(engine, sim, now=299.5)
    assert engine.expire(304.0) == []  # 5 s per later action, from the observation
    act(engine, quick)
    assert engine.expire(304.4) == []
    [(who, failure)] = engine.expire(304.5)
    assert who is slow and isinstance(failure, ActionTimeout)
    assert str(failure) == "slot 0 sent no action within 5 s (--hud-step-timeout); its peers continue"
    assert slow.state is SlotState.DONE and slow.failure is failure and slow.error == str(failure)
    frames = tick(engine, sim, now=304.5)  # the silent slot no longer holds the tick back
    assert frames.keys() == {quick.index}


def test_a_silent_first_action_names_its_own_flag():
    engine, sim = make(1)
    slot = live_slot(engine, sim, 1, now=10.0)
    [(_, failure)] = engine.expire(310.0)
    assert "sent no first action within 300 s (--hud-first-action-timeout)" in str(failure)
    assert slot.result().steps == 0 and "no first action" in slot.result().error


def test_a_slot_waiting_for_its_peers_is_never_late():
    engine, sim = make(2)
    a, b = live_slot(engine, sim, 1), live_slot(engine, sim, 2)
    act(engine, a)
    [(who, _)] = engine.expire(1000.0)  # only the peer that never acted is failed
    assert who is b and a.state is SlotState.LIVE


# --------------------------------------------------------------- success
def test_success_is_latched_and_success_at_reset_is_flagged():
    engine, sim = make(2, length=10)
    slot, already = live_slot(engine, sim, 1), live_slot(engine, sim, 100)
    assert already.success_at_reset and not slot.success_at_reset
    for success in (True, False):
        act(engine, slot, already)
        plan = engine.tick_rules.plan_tick()
        batch, obs = sim.step(plan)
        batch.success[:] = [success, False]
        frames = dict(engine.tick_rules.apply_batch(plan, batch, obs, now=0.0))
        assert frames[slot.index]["success"] is True  # latched: the second step cannot take it back
    assert slot.result().success and slot.result().score == 1.0
    result = already.result()
    assert result.success_at_reset and not result.success  # not counted as the policy's success


def test_a_terminal_step_ends_the_episode_and_a_later_frame_is_refused():
    engine, sim = make(1, length=2)
    slot = live_slot(engine, sim, 6)
    for _ in range(2):
        act(engine, slot)
        frame = tick(engine, sim)[slot.index]
    assert frame["terminated"] is True and frame["success"] is True and slot.state is SlotState.DONE
    assert "the episode is over" in str(engine.late_frame(slot))
    grade = engine.grade(slot)
    assert grade["total_reward"] == pytest.approx(6.0) and grade["terminated"] and engine.episodes == 1


# --------------------------------------------------- release / disconnect
def test_release_and_disconnect_free_or_end_the_slot():
    engine, sim = make(3)
    a, b, c = live_slot(engine, sim, 1), live_slot(engine, sim, 2), live_slot(engine, sim, 3)
    engine.disconnect(a, clean=True)  # an agent that stopped: no error
    engine.disconnect(b, clean=False)
    assert a.state is b.state is SlotState.DONE and a.error is None
    assert b.error == "slot 1: agent disconnected mid-episode"
    act(engine, c, value=0.3)
    assert engine.tick_rules.plan_tick().actions[:, 0].tolist() == [0.0, 0.0, pytest.approx(0.3)]  # held
    failure = engine.release(c, "token released")
    assert str(failure) == "slot 2 released: token released"
    assert c.state is SlotState.FREE and c.token is None and engine.tick_rules.plan_tick() is None
    assert [s["state"] for s in engine.snapshot()] == ["done", "done", "free"]


def test_a_step_in_flight_when_its_slot_is_released_does_not_leak_into_the_next_episode():
    engine, sim = make(1)
    old = live_slot(engine, sim, 1)
    act(engine, old)
    plan = engine.tick_rules.plan_tick()
    engine.release(old, "token released")  # while the sim runs the step
    new = engine.claim(2, {"seed": 4})
    assert engine.tick_rules.apply_batch(plan, *sim.step(plan), now=0.0) == []
    assert new.steps == 0 and new.total_reward == 0.0 and new.state is SlotState.CLAIMED


# ------------------------------------------------------------ claim rules
def test_claims_outside_the_sims_declared_rules_are_refused_before_any_env_is_touched():
    from pytest_hud.sim.claims import ClaimRules

    engine, _ = make(1, claims=ClaimRules(max_seed=99, options=("difficulty",)))
    assert engine.check_task({"seed": 99})["seed"] == 99
    with pytest.raises(TaskError, match="seed 100 is out of this sim's range: its seeds are 0 to 99"):
        engine.check_task({"seed": 100})
    with pytest.raises(TaskError, match=r"option\(s\) colour are not read by this sim \(it reads: difficulty\)"):
        engine.check_task({"seed": 1, "options": {"colour": 1, "difficulty": 2}})
    batched, _ = make(2, claims=ClaimRules(seeded=False))
    with pytest.raises(TaskError, match="takes one seed for all its slots"):
        batched.check_task({"seed": 3})
    assert batched.check_task({})["seed"] is None  # no seed of its own to draw


def test_a_claim_without_a_seed_gets_one_drawn_within_the_sims_range():
    import random

    from pytest_hud.sim.claims import ClaimRules

    engine, _ = make(1, claims=ClaimRules(max_seed=9), rng=random.Random(0))
    seeds = {engine.check_task({})["seed"] for _ in range(200)}
    assert seeds == set(range(10))
    free, _ = make(1, rng=random.Random(1))
    drawn = free.check_task({"options": None})["seed"]
    assert isinstance(drawn, int) and 0 <= drawn < 2**32
    assert free.claim(1, free.check_task({})).seed is not None
