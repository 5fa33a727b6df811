"""The bridge engine's rules as plain function calls: claims, ticks, holds, timeouts, failures.

No sockets, no subprocess: a fake in-memory batch stands in for the vectorized sim, and time is a
number passed in. ``tests/e2e/test_bridge.py`` drives the same rules end to end through real sockets.
"""

from __future__ import annotations

import numpy as np
import pytest

from pytest_hud.core.contract import Contract, Feature
from pytest_hud.sim.base import StepBatch
from pytest_hud.bridge.engine import BridgeEngine, ResetPlan, TickPlan, Timeouts, resolve_tick
from pytest_hud.bridge.failures import (
    ActionTimeout, BadAction, BadClaim, BridgeBroken, ClaimTimeout, EpisodeOver, NoFirstObservation,
    SimFailed, SlotError, SlotReleased, TaskError,
)
from pytest_hud.bridge.server import close_code
from pytest_hud.bridge.slots import Slot, SlotState

CONTRACT = Contract(
    features={
        "state": Feature("state", "observation", "state", "float32", (2,), ["seed", "step"]),
        "action": Feature("action", "action", "box", "float32", (1,), ["a"], [-1.0], [1.0]),
    },
    control_rate=10.0,
)
TIMEOUTS = Timeouts(claim=30.0, first_action=300.0, step=5.0)


class FakeBatch:
    """An in-memory vectorized sim: slot i's state is ``[seed, steps since reset]``.

    An episode lasts ``length`` steps, earns ``seed / length`` per step and succeeds at its end when
    the seed is above 4; a seed of 100 or more is "already solved" at reset.
    """

    def __init__(self, width: int, length: int = 3) -> None:
        self.width, self.length = width, length
        self.seed, self.t = np.zeros(width), np.zeros(width)
        self.resets: list[list[int]] = []
        self.actions: list[np.ndarray] = []
        self.stepped: list[list[int]] = []

    def reset(self, plan: ResetPlan):
        self.resets.append(list(plan.indices))
        for i, seed in zip(plan.indices, plan.seeds):
            self.seed[i], self.t[i] = seed or 0, 0
        flags = np.array([self.seed[i] >= 100 for i in plan.indices])
        return flags, {k: v[plan.indices] for k, v in self.observe().items()}

    def step(self, plan: TickPlan):
        """Steps every slot, or (ready mode) only those in ``plan.mask``; ``stepped`` logs which."""
        for i in plan.park:
            self.seed[i] = self.t[i] = 0
            self.resets.append([i])
        self.actions.append(plan.actions.copy())
        stepped = np.ones(self.width, bool) if plan.mask is None else plan.mask
        self.stepped.append(np.flatnonzero(stepped).tolist())
        self.t += stepped
        done = (self.t >= self.length) & stepped
        batch = StepBatch(np.where(stepped, self.seed / self.length, 0.0), done, np.zeros(self.width, bool),
                          done & (self.seed > 4))
        return batch, self.observe()

    def observe(self):
        return {"state": np.stack([self.seed, self.t], axis=1).astype(np.float32)}


def make(width: int = 2, length: int = 3, **kwargs) -> tuple[BridgeEngine, FakeBatch]:
    kwargs.setdefault("timeouts", TIMEOUTS)
    return BridgeEngine(width, CONTRACT, np.zeros(1, np.float32), **kwargs), FakeBatch(width, length)


def live_slot(engine: BridgeEngine, sim: FakeBatch, seed: int, owner: int = 1, now: float = 0.0) -> Slot:
    """Claim, bind and reset a slot the way the server does; returns it LIVE."""
    slot = engine.claim(owner, {"seed": seed})
    bound = engine.bind(engine.open(now), {"claim": slot.token})
    assert bound is slot
    plan = engine.plan_reset([slot])
    engine.apply_reset(plan, *sim.reset(plan))
    frame = engine.start(slot, now)
    assert list(frame["state"]) == [seed, 0] and frame["terminated"] is False
    return slot


def act(engine: BridgeEngine, *slots: Slot, value: float = 0.0, now: float = 0.0) -> None:
    for slot in slots:
        engine.submit_action(slot, {"actions": np.array([value], np.float32)}, now)


def tick(engine: BridgeEngine, sim: FakeBatch, now: float = 0.0) -> dict[int, dict] | None:
    """One tick if the rules allow it at ``now``: ``{slot index: frame}``, or None when nothing was stepped."""
    plan = engine.tick_rules.plan_tick(now)
    if plan is None:
        return None
    return dict(engine.tick_rules.apply_batch(plan, *sim.step(plan), now=now))


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


# ----------------------------------------------------------------- ticks
def test_ticks_wait_for_every_live_slot():
    engine, sim = make(2)
    a, b = live_slot(engine, sim, 3), live_slot(engine, sim, 6)
    act(engine, a)
    assert not engine.tick_rules.ready_to_step() and tick(engine, sim) is None
    act(engine, b)
    frames = tick(engine, sim)
    assert sorted(frames) == [0, 1] and list(frames[1]["state"]) == [6, 1]
    assert (a.steps, b.steps, engine.tick_rules.ticks, engine.tick_rules.slot_steps) == (1, 1, 1, 2)


def test_no_step_without_a_live_slot():
    engine, sim = make(2, length=1)
    engine.claim(1, {"seed": 1})
    assert not engine.tick_rules.ready_to_step() and engine.tick_rules.plan_tick() is None
    assert sim.actions == []
    slot = live_slot(engine, sim, 2)
    act(engine, slot)
    tick(engine, sim)  # its last step: nothing is live afterwards
    assert slot.state is SlotState.DONE and engine.tick_rules.plan_tick() is None and len(sim.actions) == 1


def test_a_claimed_but_unbound_slot_is_held_and_reset_only_when_its_agent_binds():
    engine, sim = make(2)
    waiting = engine.claim(1, {"seed": 9})
    busy = live_slot(engine, sim, 2)
    while busy.state is SlotState.LIVE:
        act(engine, busy, value=0.5)
        frames = tick(engine, sim)
        assert frames.keys() == {busy.index}  # the claimed slot is stepped with the hold, never for itself
    assert [a[waiting.index, 0] for a in sim.actions] == [0.0, 0.0, 0.0]
    assert waiting.steps == 0 and waiting.state is SlotState.CLAIMED
    engine.bind(engine.open(0.0), {"claim": waiting.token})
    plan = engine.plan_reset([waiting])
    assert plan.indices == [waiting.index] and plan.seeds == [9]
    engine.apply_reset(plan, *sim.reset(plan))
    assert list(engine.start(waiting, 0.0)["state"]) == [9, 0]  # fresh, whatever the peer did


def test_free_and_finished_slots_get_the_hold_action():
    engine, sim = make(3, length=1)
    a, b = live_slot(engine, sim, 1), live_slot(engine, sim, 2)
    act(engine, a, b, value=0.7)
    tick(engine, sim)  # both finish (length 1)
    assert a.state is SlotState.DONE and b.state is SlotState.DONE
    engine.release(b, "episode graded")
    c = live_slot(engine, sim, 3)
    act(engine, c, value=0.4)
    tick(engine, sim)
    assert c.index == 1  # the lowest free slot; slot 0 is finished and slot 2 was never claimed
    np.testing.assert_array_equal(sim.actions[-1][:, 0], np.float32([0.0, 0.4, 0.0]))


def test_repeat_hold_gives_a_finished_slot_its_last_action():
    engine, sim = make(2, length=1, hold="repeat")
    a = live_slot(engine, sim, 1)
    act(engine, a, value=0.7)
    tick(engine, sim)
    b = live_slot(engine, sim, 2)
    act(engine, b, value=-0.2)
    tick(engine, sim)
    assert sim.actions[-1][a.index, 0] == np.float32(0.7)  # finished: repeats its last action
    assert sim.actions[-1][b.index, 0] == np.float32(-0.2)


def test_a_finished_sub_env_is_parked_before_the_next_step():
    engine, sim = make(2, length=2)
    a, b = live_slot(engine, sim, 1), live_slot(engine, sim, 2)
    act(engine, a, b)
    tick(engine, sim)
    engine.release(a, "token released")  # a leaves mid-episode; b runs on and finishes
    act(engine, b)
    tick(engine, sim)
    assert b.state is SlotState.DONE
    c = live_slot(engine, sim, 5)  # reusing slot 0 resets it with its own seed
    act(engine, c)
    plan = engine.tick_rules.plan_tick()
    assert plan.park == [b.index]  # finished and not live: reset before it is stepped again
    engine.tick_rules.apply_batch(plan, *sim.step(plan), now=0.0)
    assert sim.resets[-1] == [b.index] and not b.needs_park_reset


def test_a_wrong_shape_action_fails_that_slot_only_and_its_peer_steps_on():
    engine, sim = make(2)
    bad, good = live_slot(engine, sim, 1), live_slot(engine, sim, 2)
    with pytest.raises(BadAction, match=r"slot 0: action of shape \(3,\), contract says \(1,\)"):
        engine.submit_action(bad, {"actions": np.zeros(3, np.float32)})
    assert bad.state is SlotState.DONE and "shape" in bad.error
    frames: dict[int, dict] = {}
    while good.state is SlotState.LIVE:
        act(engine, good)
        frames.update(tick(engine, sim))
    assert good.steps == 3 and bad.steps == 0 and frames.keys() == {good.index}
    assert good.result().total_reward == pytest.approx(2.0)


@pytest.mark.parametrize("frame, reason", [
    ({"action": [0.0]}, r"an action frame is \{'actions': array\}, got a map with keys \['action'\]"),
    ({"actions": [[1.0], [2.0, 3.0]]}, "the action is not an array of numbers"),
    ({"actions": "left"}, "action has dtype <U4"),
    ([0.0], "got list"),
])
def test_an_unusable_action_frame_is_refused_with_its_reason(frame, reason):
    engine, sim = make(1)
    slot = live_slot(engine, sim, 1)
    with pytest.raises(BadAction, match=reason) as refused:
        engine.submit_action(slot, frame)
    assert slot.failure is refused.value and str(refused.value).startswith("slot 0: ")


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


# ------------------------------------------------------------------ wave
def test_wave_claims_wait_for_the_next_global_reset():
    engine, sim = make(2, wave=True)
    a, b = engine.claim(1, {"seed": 3}), engine.claim(2, {"seed": 6})
    plan = engine.plan_wave()
    assert plan.indices == [0, 1] and plan.seeds == [3, 6]
    engine.apply_reset(plan, *sim.reset(plan))
    engine.bind(engine.open(0.0), {"claim": a.token})
    engine.start(a, 0.0)
    act(engine, a)
    assert engine.tick_rules.plan_tick() is None  # b is reset but its agent has not bound: nobody steps
    engine.bind(engine.open(0.0), {"claim": b.token})
    assert list(engine.start(b, 0.0)["state"]) == [6, 0]
    assert not engine.can_claim()  # a new claim waits for the next wave, it does not fail
    act(engine, b)
    assert tick(engine, sim).keys() == {0, 1}
    engine.release(a, "episode graded")
    assert not engine.can_claim()  # b still runs
    engine.release(b, "episode graded")
    assert engine.can_claim() and engine.plan_wave() is None


def test_a_wave_bridge_never_parks_a_finished_slot_alone():
    # A sim that can only reset all slots at once would reset the live peer too: the finished
    # sub-env is stepped with holds until the next wave instead.
    engine, sim = make(2, length=3, wave=True)
    a, b = engine.claim(1, {"seed": 3}), engine.claim(2, {"seed": 6})
    plan = engine.plan_wave()
    engine.apply_reset(plan, *sim.reset(plan))
    for slot in (a, b):
        engine.bind(engine.open(0.0), {"claim": slot.token})
        engine.start(slot, 0.0)
    act(engine, a, b)
    plan = engine.tick_rules.plan_tick()
    batch, obs = sim.step(plan)
    batch.terminated[a.index] = True  # a's episode ends early; b's goes on
    engine.tick_rules.apply_batch(plan, batch, obs, now=0.0)
    assert a.state is SlotState.DONE and b.state is SlotState.LIVE
    act(engine, b)
    plan = engine.tick_rules.plan_tick()
    assert plan.park == [] and plan.actions[a.index, 0] == 0.0  # held, not reset
    engine.tick_rules.apply_batch(plan, *sim.step(plan), now=0.0)
    assert sim.resets == [[0, 1]]  # only the wave's own global reset


def test_a_wave_claim_waits_while_a_planned_wave_runs():
    engine, sim = make(3, wave=True)
    a = engine.claim(1, {"seed": 3})
    plan = engine.plan_wave()
    assert not engine.can_claim()  # the wave's reset is in flight: a claim now waits for the next one
    engine.apply_reset(plan, *sim.reset(plan))
    assert not engine.can_claim()  # reset, its agent not bound yet: the next global reset would undo it
    assert engine.plan_wave() is None
    engine.bind(engine.open(0.0), {"claim": a.token})
    engine.start(a, 0.0)
    assert not engine.can_claim() and engine.plan_wave() is None
    engine.release(a, "episode graded")
    assert engine.can_claim()


def test_a_wave_bridge_plans_no_more_waves_once_its_sim_raised():
    engine, _ = make(2, wave=True)
    engine.claim(1, {"seed": 3})
    engine.reset_failed(engine.plan_wave(), "Traceback\nRuntimeError: no GL context")
    engine.claim(2, {"seed": 4})
    assert engine.broken and engine.plan_wave() is None


# ------------------------------------------------------------ ready mode
def ready(width: int = 3, window: float = 0.002, **kwargs) -> tuple[BridgeEngine, FakeBatch]:
    return make(width, tick="ready", tick_window=window, **kwargs)


def test_ready_mode_steps_the_slots_whose_actions_are_in_once_the_window_closes():
    engine, sim = ready(3, window=0.002)
    a, b, c = (live_slot(engine, sim, seed) for seed in (1, 2, 3))
    act(engine, a, now=10.000)
    act(engine, b, now=10.001)
    assert engine.tick_rules.tick_due() == pytest.approx(10.002)  # from the first pending action
    assert tick(engine, sim, now=10.0019) is None  # c may still come within the window
    frames = tick(engine, sim, now=10.002)
    assert frames.keys() == {a.index, b.index} and sim.stepped == [[0, 1]]
    assert list(frames[b.index]["state"]) == [2, 1]
    assert (a.steps, b.steps, c.steps) == (1, 1, 0) and list(sim.observe()["state"][c.index]) == [3, 0]
    assert engine.tick_rules.tick_due() is None and engine.tick_rules.plan_tick(now=99.0) is None  # nothing pending


def test_ready_mode_steps_at_once_when_every_live_slot_has_acted():
    engine, sim = ready(3, window=60.0)
    a, b = live_slot(engine, sim, 1), live_slot(engine, sim, 2)
    engine.claim(1, {"seed": 9})  # claimed, not bound: nobody waits for it
    act(engine, a, b, now=5.0)
    assert tick(engine, sim, now=5.0).keys() == {a.index, b.index}


def test_lockstep_waits_for_every_live_slot_whatever_the_time():
    engine, sim = make(2, tick="lockstep", tick_window=0.002)
    a, _ = live_slot(engine, sim, 1), live_slot(engine, sim, 2)
    act(engine, a, now=0.0)
    assert engine.tick_rules.tick_due() is None and tick(engine, sim, now=1e9) is None


def test_ready_mode_never_steps_idle_slots_so_nothing_is_held_or_parked():
    engine, sim = ready(4, length=1, window=0.0)
    done = live_slot(engine, sim, 1)
    act(engine, done)
    tick(engine, sim)  # length 1: finished at once
    assert done.state is SlotState.DONE
    claimed = engine.claim(1, {"seed": 7})
    slot = live_slot(engine, sim, 2)
    act(engine, slot, now=1.0)
    plan = engine.tick_rules.plan_tick(now=1.0)
    assert plan.mask.tolist() == [False, False, True, False] and plan.park == []
    engine.tick_rules.apply_batch(plan, *sim.step(plan), now=1.0)
    assert sim.stepped == [[0], [2]] and claimed.steps == 0
    assert (engine.tick_rules.ticks, engine.tick_rules.slot_steps, engine.tick_rules.env_steps) == (2, 2, 2)


def test_a_slot_warming_up_its_model_does_not_hold_back_its_peers_in_ready_mode():
    engine, sim = ready(2, length=3, window=0.002)
    warming, quick = live_slot(engine, sim, 1, now=0.0), live_slot(engine, sim, 6, now=0.0)
    now = 0.0
    while quick.state is SlotState.LIVE:  # a whole episode while the peer has not acted once
        act(engine, quick, now=now)
        assert tick(engine, sim, now=now) is None
        now += 0.002
        tick(engine, sim, now=now)
    assert quick.result().steps == 3 and quick.result().success
    assert warming.state is SlotState.LIVE and warming.steps == 0
    assert list(sim.observe()["state"][warming.index]) == [1, 0]


def test_an_episode_takes_the_same_steps_under_lockstep_and_ready():
    def play(engine, sim, order):
        slots = [live_slot(engine, sim, seed) for seed in (2, 5, 7)]
        frames = {s.index: [] for s in slots}
        now = 0.0
        for who in order:  # who acts this round; in lockstep only a full round steps
            now += 1.0
            act(engine, *[slots[i] for i in who if slots[i].state is SlotState.LIVE], value=0.1, now=now)
            for i, frame in (tick(engine, sim, now=now + 1.0) or {}).items():
                frames[i].append(frame["state"].tolist())
        return [s.result().to_dict() for s in slots], frames

    rounds = [(0,), (1, 2), (0, 1, 2), (2,), (0, 1)] * 3
    ready_result = play(*ready(3, window=0.5), rounds)
    lock_result = play(*make(3), [(0, 1, 2)] * 15)
    assert ready_result == lock_result


def test_a_ready_mode_step_reports_only_the_slots_it_stepped_as_ended():
    engine, sim = ready(2, length=3)
    a, b = live_slot(engine, sim, 1), live_slot(engine, sim, 2)
    act(engine, a)
    plan = engine.tick_rules.plan_tick()
    batch, obs = sim.step(plan)
    batch.terminated[b.index] = True  # a sim's stale row for a slot it did not step
    engine.tick_rules.apply_batch(plan, batch, obs, now=0.0)
    assert b.state is SlotState.LIVE and not b.needs_park_reset


@pytest.mark.parametrize("requested, slot_step, slot_reset, batched_parallel, mode", [
    ("auto", True, True, False, "ready"),
    ("auto", False, True, False, "lockstep"),  # natively batched
    ("auto", True, False, False, "lockstep"),  # resets all at once: waves tick in lockstep
    ("auto", True, True, True, "lockstep"),  # parallel lanes asking a batching server: in step
    ("lockstep", True, True, False, "lockstep"),
    ("ready", True, True, False, "ready"),
    ("ready", True, True, True, "ready"),  # asked for: as asked
])
def test_auto_picks_ready_where_the_sim_steps_its_slots_on_their_own(requested, slot_step, slot_reset,
                                                                       batched_parallel, mode):
    assert resolve_tick(requested, slot_step=slot_step, slot_reset=slot_reset,
                        batched_parallel=batched_parallel) == mode


@pytest.mark.parametrize("requested, batched_parallel, mode", [
    ("auto", True, "lanes"),  # processes asking a batching server: each in step, apart from the others
    ("auto", False, "ready"),  # no batching server: the slots need not act together
    ("lanes", False, "lanes"),
    ("lockstep", True, "lockstep"),
])
def test_auto_ticks_the_lanes_of_a_process_sim_apart_for_a_batching_server(requested, batched_parallel, mode):
    assert resolve_tick(requested, slot_step=True, slot_reset=True, batched_parallel=batched_parallel,
                        lane_ticks=True) == mode


@pytest.mark.parametrize("requested, slot_step, slot_reset, lane_ticks, message", [
    ("ready", False, True, False,
     "this sim steps all its slots in one batched call; use --hud-tick=auto or --hud-tick=lockstep"),
    ("ready", True, False, False, "this sim can only reset all its slots at once; use --hud-tick=auto"),
    ("lanes", False, True, True, "tick mode 'lanes' needs a sim whose slots are independent envs"),
    ("lanes", True, True, False, "tick mode 'lanes' needs a sim whose slots step in several processes at "
                                 "once; use --hud-vectorization=processes"),
    ("fast", True, True, False, "tick mode must be auto, lockstep, ready or lanes, got 'fast'"),
])
def test_an_impossible_tick_mode_is_refused_with_the_fix(requested, slot_step, slot_reset, lane_ticks, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        resolve_tick(requested, slot_step=slot_step, slot_reset=slot_reset, lane_ticks=lane_ticks)


def test_start_together_holds_new_episodes_until_they_and_the_live_ones_are_enough():
    engine, sim = make(3, start_together=3)
    assert [engine.starts_now(n) for n in (1, 2, 3)] == [False, False, True]
    live_slot(engine, sim, 1)  # one episode running: two more make three
    assert [engine.starts_now(n) for n in (1, 2)] == [False, True]
    assert make(3)[0].starts_now(1)  # off: every episode starts at once
    assert make(2, start_together=5)[0].start_together == 2  # never more than the slots
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="start_together must be a whole number"):
            make(2, start_together=bad)


def lanes(width: int = 4, length: int = 3, lane_of=(0, 0, 1, 1)) -> tuple[BridgeEngine, FakeBatch]:
    return make(width, length, tick="lanes", lanes=tuple(lane_of))


def lane_tick(engine: BridgeEngine, sim: FakeBatch, lane: int, now: float = 0.0) -> dict[int, dict] | None:
    plan = engine.tick_rules.plan_lane(lane)
    if plan is None:
        return None
    assert plan.lane == lane
    return dict(engine.tick_rules.apply_batch(plan, *sim.step(plan), now=now))


def test_a_lane_steps_when_its_own_live_slots_have_acted_whatever_the_other_lanes_do():
    engine, sim = lanes()
    # (claims alternate between the lanes: the least busy first; sorted by slot, two per lane)
    a, b, c, d = sorted((live_slot(engine, sim, seed) for seed in (1, 2, 3, 4)), key=lambda s: s.index)
    assert [engine.lanes[s.index] for s in (a, b, c, d)] == [0, 0, 1, 1]
    act(engine, a, c)
    assert engine.tick_rules.plan_lane(0) is None and engine.tick_rules.plan_lane(1) is None  # b and d have not acted
    act(engine, b)
    frames = lane_tick(engine, sim, 0)  # lane 0 is complete; lane 1 still waits for d
    assert frames.keys() == {a.index, b.index} and sim.stepped == [[0, 1]]
    assert (a.steps, b.steps, c.steps, d.steps) == (1, 1, 0, 0)
    assert c.pending_action is not None and engine.tick_rules.plan_lane(1) is None
    act(engine, d)
    assert lane_tick(engine, sim, 1).keys() == {c.index, d.index} and sim.stepped[-1] == [2, 3]


def test_a_lane_never_steps_its_idle_slots_and_a_lane_without_live_slots_never_steps():
    engine, sim = lanes(length=1)
    a = live_slot(engine, sim, 1)
    engine.claim(1, {"seed": 9})  # claimed, not bound: nobody waits for it
    act(engine, a)
    plan = engine.tick_rules.plan_lane(0)
    assert plan.mask.tolist() == [True, False, False, False] and plan.park == []
    engine.tick_rules.apply_batch(plan, *sim.step(plan), now=0.0)
    assert a.state is SlotState.DONE and engine.tick_rules.plan_lane(0) is None and engine.tick_rules.plan_lane(1) is None
    assert (engine.tick_rules.ticks, engine.tick_rules.slot_steps, engine.tick_rules.env_steps) == (1, 1, 1)


def test_an_episode_takes_the_same_steps_under_lockstep_and_lanes():
    def play(engine, sim, step):  # -> {seed: (its result but the slot, its frames)}
        slots = [live_slot(engine, sim, seed) for seed in (2, 5, 7, 6)]
        frames = {s.index: [] for s in slots}
        for _ in range(6):
            act(engine, *[s for s in slots if s.state is SlotState.LIVE], value=0.1)
            for i, frame in step(engine, sim).items():
                frames[i].append(frame["state"].tolist())
        return {s.seed: ({k: v for k, v in s.result().to_dict().items() if k != "slot"}, frames[s.index]) for s in slots}

    def by_lane(engine, sim):  # lane 1 first, as when its process answers first
        return {**(lane_tick(engine, sim, 1) or {}), **(lane_tick(engine, sim, 0) or {})}

    assert play(*lanes(length=4), by_lane) == play(*make(4, 4), lambda e, s: tick(e, s) or {})


def test_lanes_mode_needs_the_lane_of_each_slot_and_per_slot_resets():
    with pytest.raises(ValueError, match="needs the lane of each slot"):
        make(2, tick="lanes")
    with pytest.raises(ValueError, match="a wave bridge ticks in lockstep"):
        make(2, tick="lanes", lanes=(0, 1), wave=True)


def test_the_engine_refuses_ready_mode_on_a_wave_bridge_and_a_negative_window():
    with pytest.raises(ValueError, match="a wave bridge ticks in lockstep"):
        make(2, tick="ready", wave=True)
    with pytest.raises(ValueError, match="tick_window must be a non-negative"):
        make(2, tick="ready", tick_window=-1)
    with pytest.raises(ValueError, match="resolve 'auto' first"):
        make(2, tick="auto")


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
