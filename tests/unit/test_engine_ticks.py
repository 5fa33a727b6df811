"""The bridge engine's tick rules as plain function calls: lockstep, holds and parking, waves,
ready mode, lanes and starting together (a fake batch stands in for the sim; time is a number).
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


def test_a_lanes_run_is_the_steps_its_slots_have_queued_each_with_its_render_flags():
    """A lane's run: the step planned, then one step per action every slot of it has queued (up to
    ``most`` in all), each the actions and render flags that slot would act with next."""
    engine, sim = lanes(length=50)
    a, b = sorted((live_slot(engine, sim, seed) for seed in (1, 2)), key=lambda s: s.index)[:2]
    assert engine.lanes[a.index] != engine.lanes[b.index]  # (claims alternate between the lanes)
    c = live_slot(engine, sim, 3)  # a's lane mate
    assert engine.lanes[c.index] == engine.lanes[a.index]
    rows = np.arange(6, dtype=np.float32)[:, None]
    engine.submit_action(a, {"actions": rows, "steps": 6, "render": [False] * 5 + [True]}, 0.0)
    engine.submit_action(c, {"actions": -rows[:4], "steps": 4, "render": False}, 0.0)
    rules = engine.tick_rules
    plans = rules.plan_run(rules.plan_lane(engine.lanes[a.index]), most=64)
    assert len(plans) == 4  # c has three actions queued after its first
    assert [p.actions[[a.index, c.index], 0].tolist() for p in plans] == [[k, -k] for k in range(4)]
    assert all(p.unread[[a.index, c.index]].tolist() == [True, True] for p in plans)
    assert all(p.mask.tolist() == plans[0].mask.tolist() and p.lane == plans[0].lane for p in plans)
    assert [[entry[0] for entry in p.acting] for p in plans] == [[a, c]] * 4
    assert len(rules.plan_run(rules.plan_lane(engine.lanes[a.index]), most=2)) == 2
    # delivered in order, each after its slots take their next actions, as single steps would be
    for k, plan in enumerate(plans):
        if k:
            for slot, _, _ in plan.acting:
                slot.act_from_queue(0.0)
        rules.apply_batch(plan, *sim.step(plan), now=0.0)
    assert (a.steps, c.steps, len(a.queued), len(c.queued)) == (4, 4, 2, 0)
    assert rules.acted_again and a.pending_action is None  # a takes its next action from its queue
    assert c.pending_action is None and c.awaiting == "action"  # c waits for its agent
    assert rules.plan_lane(engine.lanes[b.index]) is None  # b has not acted


def test_a_run_lasts_a_fraction_of_a_second_so_a_reset_never_waits_long_for_it():
    from pytest_hud.bridge.ticks import RUN_SECONDS, run_steps

    assert run_steps(64, None) == 1  # nothing timed yet: one step
    assert run_steps(64, 1e-5) == 64 and run_steps(10, 1e-5) == 10
    assert run_steps(64, RUN_SECONDS / 8) == 8
    assert run_steps(64, 0.25) == 1  # a LIBERO-like step: one at a time, as before runs


def test_the_run_length_keeps_a_runs_frames_to_a_few_megabytes_a_slot():
    from pytest_hud.bridge.ticks import RUN_BYTES, RUN_STEPS, run_length

    assert run_length({"state": np.zeros((4, 3), np.float32)}) == RUN_STEPS
    assert run_length({"pixels": np.zeros((4, 224, 224, 3), np.uint8), "state": np.zeros((4, 8))}) == \
        RUN_BYTES // (224 * 224 * 3 + 64)
    assert run_length({"pixels": np.zeros((1, 4096, 4096, 3), np.uint8)}) == 1
