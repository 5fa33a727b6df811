"""The bridge's tick rules without I/O: the tick mode, when to step, what a step steps, what it returns.

:class:`TickRules` holds the tick mode and its settings (hold, window, lanes, the step timeout)
and the tick counters; the engine (:class:`~pytest_hud.bridge.engine.BridgeEngine`) holds one,
sharing its slots and its :class:`~.faults.FaultRules` (whether the bridge is broken) with it.
Claims and binding are the engine's (:mod:`.engine`); what a sim's exception does is :mod:`.faults`.

Tick rules (DESIGN §6). A bridge ticks in one of three modes (:func:`resolve_tick` picks it):

- **lockstep** (natively batched sims, and any sim that cannot step a subset of its slots): step
  when every LIVE slot has sent an action; every other slot gets the hold action (zeros, or its last
  action with ``hold="repeat"``). A CLAIMED slot is reset with its claim's seed only when its agent
  binds, so hold-steps before that cannot leak into its episode; in wave mode no step at all while a
  reset slot waits for its agent. A finished sub-env is parked (reset without a seed) before the
  next step, except in wave mode: a sim that resets all slots at once would reset live ones too, so
  its finished sub-envs are stepped with holds until the next wave;
- **ready** (sims whose slots are independent envs: ``VectorSim.supports_slot_step``): step only
  the LIVE slots whose actions are in, once every LIVE slot has acted or ``tick_window`` seconds
  after the first pending action arrived, whichever comes first. Nothing else is stepped (no holds,
  no parking), so a slow policy never sets its peers' pace and an episode's steps are the same as
  under lockstep;
- **lanes** (sims whose slots are independent envs spread over processes that step at the same
  time: ``VectorSim.supports_lane_ticks``): each lane (process) ticks in lockstep on its own, when
  every LIVE slot of that lane has acted, while other lanes' steps are under way. Only the LIVE
  slots of the lane are stepped (no holds, no parking, as in ready mode). Slots of a lane still
  act together, so a batching policy server still gets their requests together, and one lane's
  forward pass overlaps the other lanes' sim steps. The steps the lane's slots have queued (a frame
  of several actions each: an open-loop chunk, a replay) go to its process in one run
  (:meth:`TickRules.plan_run`), each step the one that would follow the last one's delivery;
- never step when no slot is LIVE;
- a bad action fails that slot only (:meth:`~pytest_hud.bridge.engine.BridgeEngine.submit_action`);
- a sim exception fails only the episodes of the slots whose envs raised, where the sim isolates
  its slots; any other breaks the bridge and fails every LIVE episode at once (:mod:`.faults`);
- a slot silent past its deadline (first action, then each step) is failed; its peers continue
  (:meth:`~pytest_hud.bridge.engine.BridgeEngine.expire`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from pytest_hud.bridge.faults import FaultRules
from pytest_hud.bridge.slots import Slot, SlotState

__all__ = ["DEFAULT_TICK_WINDOW", "TICK_MODES", "TickPlan", "TickRules", "resolve_tick", "run_length",
           "run_steps"]

#: What ``--hud-tick`` (the bridge's ``--tick``) accepts; ``auto`` resolves to one of the others.
TICK_MODES = ("auto", "lockstep", "ready", "lanes")
#: Ready mode's default window (seconds): long enough that agents answering one tick's frames
#: together land in one step, short next to a policy's milliseconds (``benchmarks/stragglers.py``).
DEFAULT_TICK_WINDOW = 0.001
#: Lanes mode: the most steps a lane's run takes (:meth:`TickRules.plan_run`), the most bytes of one
#: slot's observations it holds (a run's frames are sent when it is over), and about the longest it
#: lasts (a reset waits for the runs under way: a slow sim's steps, whose round trip costs
#: nothing next to them, go one at a time)
RUN_STEPS, RUN_BYTES, RUN_SECONDS = 64, 4 << 20, 0.2


def run_length(obs: dict[str, np.ndarray]) -> int:
    """The most steps of a lane's run for a sim whose observations are ``obs`` (``{feature: [N, ...]}``):
    :data:`RUN_STEPS`, fewer where their frames would hold more than :data:`RUN_BYTES` of a slot's rows.

    >>> pusht, libero = np.zeros((2, 96, 96, 3), np.uint8), np.zeros((2, 256, 256, 6), np.uint8)
    >>> run_length({"pixels": pusht}), run_length({"pixels": libero})
    (64, 10)
    """
    row = sum(v[0].nbytes for v in obs.values() if len(v))
    return max(1, min(RUN_STEPS, RUN_BYTES // max(1, row)))


def run_steps(most: int, step_s: float | None) -> int:
    """How many steps a lane's next run takes: ``most`` (:func:`run_length`), fewer where they
    would last longer than :data:`RUN_SECONDS` at ``step_s`` seconds a step (one while no step has
    been timed yet).

    >>> run_steps(64, None), run_steps(64, 0.002), run_steps(64, 0.012), run_steps(10, 0.5)
    (1, 64, 16, 1)
    """
    if step_s is None:
        return 1
    return max(1, min(most, int(RUN_SECONDS / max(step_s, 1e-9))))


def resolve_tick(requested: str, *, slot_step: bool, slot_reset: bool, batched_parallel: bool = False,
                 lane_ticks: bool = False) -> str:
    """The tick mode a bridge runs: ``auto`` is ``ready`` where the sim can step and reset its slots
    one by one, else ``lockstep``. Raises ValueError for an unknown mode, or ``ready`` or ``lanes``
    on a sim that cannot do it.

    ``batched_parallel``: a batching policy server answers the episodes and the sim steps its slots
    in parallel (processes, threads). ``auto`` is then ``lanes`` where the sim can tick its lanes
    apart (``lane_ticks``: processes), else ``lockstep``: slots stepped together ask the server
    together, so its batches fill (in ready mode the slots drift apart and each asks alone), and
    with lanes one process's slots wait for their forward pass while another's step. A one-thread
    bridge is better left to ready mode, where the sim steps some slots while others wait for the
    server.

    >>> resolve_tick("auto", slot_step=True, slot_reset=True), resolve_tick("auto", slot_step=False, slot_reset=True)
    ('ready', 'lockstep')
    >>> resolve_tick("auto", slot_step=True, slot_reset=True, batched_parallel=True, lane_ticks=True)
    'lanes'
    """
    if requested not in TICK_MODES:
        raise ValueError(f"tick mode must be auto, lockstep, ready or lanes, got {requested!r} (--hud-tick)")
    can_ready = slot_step and slot_reset
    if requested == "auto":
        if can_ready and batched_parallel:
            return "lanes" if lane_ticks else "lockstep"
        return "ready" if can_ready else "lockstep"
    if requested in ("ready", "lanes") and not can_ready:
        why = ("steps all its slots in one batched call" if not slot_step
               else "can only reset all its slots at once")
        raise ValueError(
            f"tick mode {requested!r} needs a sim whose slots are independent envs, but this sim {why}; "
            "use --hud-tick=auto or --hud-tick=lockstep (a bridge started by hand: --tick)")
    if requested == "lanes" and not lane_ticks:
        raise ValueError(
            "tick mode 'lanes' needs a sim whose slots step in several processes at once; use "
            "--hud-vectorization=processes with a width of 2 or more on a machine with 2 or more cores, "
            "or --hud-tick=ready (a bridge started by hand: --vectorization processes, --tick)")
    return requested


@dataclass
class TickPlan:
    """One batched step: the ``[N, *action_shape]`` batch, holds included, and the slots to park first.

    ``mask`` (``[N]`` bool, ready mode) says which slots step; None steps them all (lockstep).
    """

    actions: np.ndarray
    park: list[int]
    acting: list[tuple[Slot, str | None, Any]]  # (slot, its token, its action) when planned
    mask: np.ndarray | None = None
    lane: int | None = None  # lanes mode: the lane this step belongs to
    unread: np.ndarray | None = None  # [N] bool: slots whose next images no one reads (None: all read)
    started: float = 0.0  # lanes mode: when the bridge began the step


class TickRules:
    """When a bridge steps, which slots a step takes and what it hands back to them (see the
    module docstring). ``slots`` and ``faults`` are the engine's, shared; ``mode`` is a resolved
    tick mode (lockstep, ready or lanes: :func:`resolve_tick`), ``lanes`` each slot's lane."""

    def __init__(self, slots: list[Slot], faults: FaultRules, hold_action: Any, *, mode: str = "lockstep",
                 hold: str = "zeros", wave: bool = False, isolates: bool = False,
                 tick_window: float = DEFAULT_TICK_WINDOW, step_timeout: float = 30.0,
                 lanes: tuple[int, ...] | None = None) -> None:
        self.slots = slots
        self.faults = faults
        self.mode, self.hold, self.wave, self.isolates = mode, hold, wave, isolates
        self.tick_window = float(tick_window)
        self.step_timeout = step_timeout  # a LIVE slot's deadline for its next action, from a step
        self._ready = mode == "ready"
        self.hold_action = np.asarray(hold_action)
        self._batch_shape = (len(slots),) + self.hold_action.shape
        #: lanes mode: each lane's slots, in slot order
        self.lane_slots: dict[int, list[Slot]] = {}
        if mode == "lanes":
            for slot in slots:
                self.lane_slots.setdefault(lanes[slot.index], []).append(slot)  # type: ignore[index]
        self.ticks = self.slot_steps = self.env_steps = 0  # steps, slots stepped for agents, envs stepped
        self.sim_calls = 0  # the sim's step calls: a tick's, or a lane's run of several steps (one)
        #: the last step delivered left a slot with queued actions (the server takes its next one,
        #: or holds it while its agent reads slower than the bridge writes, and ticks on the loop's
        #: next turn, not deeper in the stack of the step just done)
        self.acted_again = False

    def ready_to_step(self, now: float = math.inf) -> bool:
        """Whether to step at ``now``: every live slot has sent its action (and one slot is live), or,
        in ready mode, the window of the first pending action has closed (default ``now``: it has)."""
        live, ready = SlotState.LIVE, self._ready  # (locals: this runs once per action received)
        any_live, all_in, first = False, True, math.inf
        for s in self.slots:
            if s.state is live:
                any_live = True
                if s.pending_action is None:
                    if not ready:
                        return False  # lockstep: one missing action is enough to wait
                    all_in = False
                elif s.acted_at < first:
                    first = s.acted_at
        if not any_live:
            return False
        if all_in:
            return True
        return first != math.inf and now >= first + self.tick_window

    def tick_due(self) -> float | None:
        """Ready mode: when the window of the first pending action closes (None when nothing waits)."""
        if not self._ready:
            return None
        pending = [s.acted_at for s in self.slots
                   if s.state is SlotState.LIVE and s.pending_action is not None]
        return min(pending) + self.tick_window if pending else None

    def plan_tick(self, now: float = math.inf) -> TickPlan | None:
        """The next batched step, or None when the rules say not to step at ``now``."""
        if self.faults.broken or not self.ready_to_step(now):
            return None
        if self.wave and any(s.state is SlotState.CLAIMED for s in self.slots):
            return None  # a reset slot whose agent has not bound yet must not be stepped
        actions = np.empty(self._batch_shape, self.hold_action.dtype)
        park, acting = [], []
        if self._ready:  # only the slots whose actions are in; the others are not stepped at all
            mask = np.zeros(len(self.slots), bool)
            for s in self.slots:
                if s.state is SlotState.LIVE and s.pending_action is not None:
                    actions[s.index] = s.pending_action
                    acting.append((s, s.token, s.pending_action))
                    mask[s.index] = True
                else:
                    actions[s.index] = self.hold_action  # keeps the batch well-formed; not stepped
            return TickPlan(actions, park, acting, mask, unread=_unread(acting, len(self.slots)))
        repeat = self.hold == "repeat"
        # a slot out of service (its env raised) is neither parked nor stepped: only the others are
        out = [s.index for s in self.slots if s.service is not None] if self.isolates else []
        mask = None
        if out:
            mask = np.ones(len(self.slots), bool)
            mask[out] = False
        for s in self.slots:
            live = s.state is SlotState.LIVE
            if s.needs_park_reset and not live and not self.wave and s.service is None:
                park.append(s.index)
            if live:
                actions[s.index] = s.pending_action
                acting.append((s, s.token, s.pending_action))
            elif repeat and s.last_action is not None:
                actions[s.index] = s.last_action
            else:
                actions[s.index] = self.hold_action
        return TickPlan(actions, park, acting, mask, unread=_unread(acting, len(self.slots)))

    def plan_lane(self, lane: int) -> TickPlan | None:
        """Lanes mode: the step of ``lane``'s LIVE slots once every one of them has acted, else None.
        The caller keeps a lane from being planned again while its step is under way."""
        if self.faults.broken:
            return None
        live, acting = SlotState.LIVE, []
        for s in self.lane_slots[lane]:
            if s.state is live:
                if s.pending_action is None:
                    return None
                acting.append((s, s.token, s.pending_action))
        if not acting:
            return None
        mask = np.zeros(len(self.slots), bool)
        mask[[s.index for s, _, _ in acting]] = True
        return TickPlan(self._held_but(acting), [], acting, mask, lane,
                        unread=_unread(acting, len(self.slots)))

    def plan_run(self, plan: TickPlan, most: int) -> list[TickPlan]:
        """Lanes mode: ``plan`` (:meth:`plan_lane`) and the steps after it that its slots have queued,
        ``most`` in all: while every one of them has a next queued action, the step of those actions
        (each with its render flag), the one the lane would plan once the step before it is
        delivered and its slots take their next actions (``act_from_queue``). The caller delivers
        each in order and has its slots take their actions before each step after the first."""
        n = min(most - 1, *(len(s.queued) for s, _, _ in plan.acting))
        plans = [plan]
        for k in range(n):
            acting = [(s, token, s.queued[k][0]) for s, token, _ in plan.acting]
            skip = [s.index for s, _, _ in plan.acting if s.queued[k][1]]
            plans.append(TickPlan(self._held_but(acting), [], acting, plan.mask, plan.lane,
                                  unread=_flags(skip, len(self.slots))))
        return plans

    def _held_but(self, acting: list[tuple[Slot, str | None, Any]]) -> np.ndarray:
        """A step's ``[N, *action]`` batch: the hold action but for the acting slots' actions (the
        holds keep it well-formed; only the plan's ``mask`` is stepped)."""
        actions = np.empty(self._batch_shape, self.hold_action.dtype)
        actions[...] = self.hold_action
        for s, _, action in acting:
            actions[s.index] = action
        return actions

    def apply_batch(self, plan: TickPlan, batch: Any, obs: dict[str, np.ndarray],
                    now: float, pack: Callable[..., Any] | None = None) -> list[tuple[int, Any]]:
        """Tally a step's ``batch`` (a :class:`StepBatch`) and ``obs`` (``{feature: [N, ...]}``).

        Returns ``(slot index, observation frame)`` for every slot that acted. ``pack(obs)`` (e.g.
        :func:`pytest_hud.wire.codec.rows_packer`) returns ``f(i, reward, done, truncated, success)``, which
        turns slot ``i``'s frame into what is returned instead of the frame's dict. A slot released
        while the step ran (its token changed) is left alone: its next episode must not inherit the step.
        """
        slots = self.slots
        for i in plan.park:
            slots[i].needs_park_reset = False
        self.ticks += 1
        self.slot_steps += len(plan.acting)
        ended = batch.terminated | batch.truncated
        if plan.mask is None:
            self.env_steps += len(slots)
        else:
            self.env_steps += int(plan.mask.sum())
            ended &= plan.mask  # a slot that was not stepped cannot have ended
        for i in np.flatnonzero(ended):
            slots[i].needs_park_reset = True
        # Python lists: one conversion per tick instead of a numpy scalar per slot and field
        rewards, success = np.asarray(batch.rewards, np.float64).tolist(), np.asarray(batch.success).tolist()
        score = None if batch.score is None else np.asarray(batch.score, np.float64).tolist()
        ended_l, terminated, truncated_l = ended.tolist(), np.asarray(batch.terminated).tolist(), \
            np.asarray(batch.truncated).tolist()
        deadline = now + self.step_timeout
        frame = (pack or _rows)(obs)
        frames = []
        self.acted_again = False
        for s, token, action in plan.acting:
            if s.token != token:
                continue
            i = s.index
            reward = rewards[i]
            done, truncated = bool(ended_l[i]), bool(truncated_l[i])
            s.took_step(reward, success[i], None if score is None else score[i], done, bool(terminated[i]), truncated)
            s.last_action, s.pending_action = action, None
            if not done and s.state is SlotState.LIVE:
                if s.queued:  # the next of its actions is in already (the server takes it)
                    self.acted_again = True
                else:
                    s.deadline, s.awaiting = deadline, "action"
            frames.append((i, frame(i, reward, done, truncated, s.success)))
        return frames


def _unread(acting: list[tuple[Slot, str | None, Any]], width: int) -> np.ndarray | None:
    """The ``[N]`` flags of the acting slots whose agents will not read the step's images, or None."""
    return _flags([s.index for s, _, _ in acting if s.skip_render], width)


def _flags(skip: list[int], width: int) -> np.ndarray | None:
    """``[N]`` flags, True at the slots of ``skip`` (whose images no one reads), or None when it is empty."""
    if not skip:
        return None
    unread = np.zeros(width, bool)
    unread[skip] = True
    return unread


def _rows(obs: dict[str, np.ndarray]) -> Callable[[int, float, bool, bool, bool], dict[str, Any]]:
    """Slot ``i``'s observation frame of a step's ``obs``, as a dict."""
    return lambda i, *outcome: _frame({k: v[i] for k, v in obs.items()}, *outcome)


def _frame(obs: dict[str, Any], reward: float, done: bool, truncated: bool, success: bool) -> dict[str, Any]:
    """One observation frame: the contract's features plus the step's outcome (DESIGN §4)."""
    out: dict[str, Any] = dict(obs)
    out["reward"] = np.float32(reward)
    out["terminated"] = done  # terminated or truncated: the episode is over either way
    out["truncated"] = truncated
    out["success"] = success
    return out

