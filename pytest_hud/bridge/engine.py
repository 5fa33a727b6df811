"""The bridge's rules without I/O: claims, ticks, holds, timeouts and failures of its slots.

(Over 400 lines on purpose: every slot rule of the bridge in one pure class, so they are read and unit-tested together.)

:class:`BridgeEngine` holds every slot (:mod:`.slots`) and decides what happens to it; :mod:`.server`
only moves bytes (sockets, codec) and runs the sim calls the engine plans, on the main thread. Time
is passed in (``now``: seconds on a monotonic clock), so every rule, timeouts included, is testable
with plain function calls and a fake batch.

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
  forward pass overlaps the other lanes' sim steps;
- never step when no slot is LIVE;
- a bad action fails that slot only;
- a sim whose slots are independent envs (``isolates``) pins an exception on the slots whose envs
  raised (:meth:`BridgeEngine.faulted`): their episodes fail, their envs are rebuilt before the next
  claim lands there (a slot is retired after ``max_faults`` faults, or when its rebuild fails), and
  every other slot goes on exactly as without the fault. Any other sim exception breaks the bridge
  and fails every LIVE episode at once (``bridge broken by slot N's reset: ...``): none waits for its
  own timeout;
- a slot silent past its deadline (first action, then each step) is failed; its peers continue.

Starting together (``start_together``, for a batching policy server): an episode whose slot was
reset does not get its first observation until it and the LIVE episodes are ``start_together``
(the workers that share the bridge), or until the server's window runs out. Episodes that start
on the same tick ask the policy server for their action chunks on the same ticks, so its batches
stay full; started a few ticks apart, each group of them needs a forward pass of its own, and a
lockstep tick waits for every one.

Claims are checked against the sim's :class:`~.claims.ClaimRules` before any env is touched, and a
claim without a seed gets one drawn here (returned with the claim, so the episode can be run again).

Wave mode (sims that reset all slots at once): claims gather until the next global reset; once a
wave is planned, a new claim waits until every episode of that wave is over, because the next global
reset would reset them too.

What the engine refuses or ends is a :mod:`.failures` class; ``str(failure)`` is what the agent reads.
"""

from __future__ import annotations

import json
import math
import random
import secrets
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pytest_hud.core.contract import Contract, ContractError
from pytest_hud.sim.base import last_line
from pytest_hud.sim.claims import ClaimRules
from pytest_hud.bridge.failures import (
    ActionTimeout, BadAction, BadClaim, BridgeBroken, ClaimTimeout, EpisodeOver, NoFirstObservation,
    SimFailed, SlotError, SlotFailure, SlotReleased, TaskError,
)
from pytest_hud.bridge.slots import Slot, SlotState

__all__ = ["DEFAULT_START_WINDOW", "DEFAULT_TICK_WINDOW", "TICK_MODES", "BridgeEngine", "Handshake", "ResetPlan", "TickPlan", "Timeouts", "resolve_tick"]

#: What ``--hud-tick`` (the bridge's ``--tick``) accepts; ``auto`` resolves to one of the others.
TICK_MODES = ("auto", "lockstep", "ready", "lanes")
#: Ready mode's default window (seconds): long enough that agents answering one tick's frames
#: together land in one step, short next to a policy's milliseconds (``benchmarks/stragglers.py``).
DEFAULT_TICK_WINDOW = 0.001
#: How long a held episode waits for the others to start with it (``start_together``): about the
#: spread of a wave's starts on a busy machine (the workers encode videos and write reports between
#: episodes), and short next to an episode.
DEFAULT_START_WINDOW = 0.5


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
class Timeouts:
    """Seconds a bridge waits for each thing before failing the slot that is late."""

    claim: float = 30.0  # WebSocket connect → claim frame
    first_action: float = 300.0  # first observation → first action (model warm-up)
    step: float = 30.0  # observation → next action
    wait_slot: float = 600.0  # reset() waiting for a free slot or the next wave


@dataclass(eq=False)
class Handshake:
    """A WebSocket that has not sent its claim frame yet (``deadline`` is None once settled)."""

    deadline: float | None
    failure: SlotFailure | None = None


@dataclass
class ResetPlan:
    """Slots to reset, with each claim's own seed and options (all lists in slot order)."""

    slots: list[Slot]
    indices: list[int]
    seeds: list[int | None]
    options: list[dict[str, Any] | None]
    tasks: list[str | None] | None = None  # each slot's task, for a sim that declares tasks
    rebuild: list[int] = field(default_factory=list)  # slots whose env raised: rebuilt before their reset


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
    started: float = 0.0  # lanes mode: when the bridge began the step


class BridgeEngine:
    """Slots, claims and tick rules of one bridge with ``width`` slots (see the module docstring)."""

    def __init__(self, width: int, contract: Contract, hold_action: Any, *, hold: str = "zeros",
                 wave: bool = False, timeouts: Timeouts | None = None,
                 build_args: dict[str, Any] | None = None, tick: str = "lockstep",
                 tick_window: float = DEFAULT_TICK_WINDOW, tasks: tuple[str, ...] = (),
                 lanes: tuple[int, ...] | None = None, start_together: int = 0,
                 claims: ClaimRules | None = None, isolates: bool = False, max_faults: int = 3,
                 rng: random.Random | None = None) -> None:
        if width < 1:
            raise ValueError(f"width must be at least 1, got {width}")
        if hold not in ("zeros", "repeat"):
            raise ValueError(f"hold must be 'zeros' or 'repeat', got {hold!r}")
        if tick not in ("lockstep", "ready", "lanes"):
            raise ValueError(f"tick must be 'lockstep', 'ready' or 'lanes' (resolve 'auto' first), got {tick!r}")
        if tick != "lockstep" and wave:
            raise ValueError(f"tick mode {tick!r} needs per-slot resets; a wave bridge ticks in lockstep")
        if tick == "lanes" and lanes is None:
            raise ValueError("tick mode 'lanes' needs the lane of each slot")
        if not tick_window >= 0:
            raise ValueError(f"tick_window must be a non-negative number of seconds, got {tick_window!r}")
        if isinstance(start_together, bool) or not isinstance(start_together, int) or start_together < 0:
            raise ValueError(f"start_together must be a whole number of episodes >= 0, got {start_together!r}")
        if lanes is not None and len(lanes) != width:
            raise ValueError(f"lanes names {len(lanes)} slots, the bridge has {width}")
        self.slots = [Slot(i) for i in range(width)]
        self.start_together = min(start_together, width)  # 0 or 1: every episode starts at once
        self.lanes = lanes  # the parallel lane of each slot (None: slots step one after another)
        self.contract, self.hold, self.wave = contract, hold, wave
        self.tick, self.tick_window = tick, float(tick_window)
        self._ready = tick == "ready"
        #: lanes mode: each lane's slots, in slot order
        self.lane_slots: dict[int, list[Slot]] = {}
        if tick == "lanes":
            for slot in self.slots:
                self.lane_slots.setdefault(lanes[slot.index], []).append(slot)  # type: ignore[index]
        self._wave_resetting = False  # a wave reset is planned and not applied yet
        self.timeouts = timeouts or Timeouts()
        self.build_args = dict(build_args or {})
        self.tasks = tuple(tasks)  # what a claim may choose from (empty: the sim has no tasks)
        self._build_key = json.dumps(self.build_args, sort_keys=True)
        self._hold_action = np.asarray(hold_action)
        self._batch_shape = (width,) + self._hold_action.shape
        self._by_token: dict[str, Slot] = {}
        self._handshakes: set[Handshake] = set()
        self.broken: str | None = None  # the sim's traceback, once it raised
        self.claims = claims or ClaimRules()
        self._rng = rng or random.SystemRandom()  # seeds for claims that give none
        self.isolates = isolates and not wave  # an env's exception is its slot's alone (see faulted)
        if max_faults < 1:
            raise ValueError(f"max_faults must be at least 1, got {max_faults}")
        self.max_faults = max_faults
        self.notes: list[str] = []  # slots retired, for the bridge's stats (the run's summary)
        self.ticks = self.slot_steps = self.env_steps = self.episodes = 0

    @property
    def width(self) -> int:
        return len(self.slots)

    @property
    def broken_reason(self) -> str:
        """The last line of the sim's traceback (the exception itself), or '' when not broken."""
        return self.broken.splitlines()[-1] if self.broken else ""

    # ---------------------------------------------------------------- claims
    def check_task(self, task: dict[str, Any]) -> dict[str, Any]:
        """``task`` without its ``build`` arguments, once they match this bridge; else :class:`TaskError`."""
        task = dict(task)
        build = task.pop("build", None) or {}
        if not isinstance(build, dict):
            raise TaskError("build must be an object of env-defining arguments")
        if json.dumps(build, sort_keys=True) != self._build_key:
            raise TaskError(
                f"this bridge was built with {self.build_args!r} but the claim asks for {build!r}; "
                "env-defining arguments must match across a bridge's slots, so claim on another "
                "bridge (the pytest plugin's pool routes such claims for you)"
            )
        seed = task.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise TaskError(f"seed must be a non-negative integer or null, got {seed!r}")
        options = task.get("options")
        if options is not None and not isinstance(options, dict):
            raise TaskError(f"options must be an object or null, got {type(options).__name__}")
        problem = self.claims.problem(seed, options)
        if problem:
            raise TaskError(problem)
        if seed is None:  # drawn here and returned: the episode can be run again from its record
            task["seed"] = self.claims.draw_seed(self._rng)
        prompt = task.get("prompt")
        if prompt is not None and not isinstance(prompt, str):
            raise TaskError(f"prompt must be a string or null, got {type(prompt).__name__}")
        name = task.get("task")
        if self.tasks:
            if name is None:
                task["task"] = self.tasks[0]  # the sim's default task
            elif not isinstance(name, str) or name not in self.tasks:
                shown = ", ".join(self.tasks[:12]) + (", ..." if len(self.tasks) > 12 else "")
                raise TaskError(
                    f"task {name!r} is not one of this bridge's {len(self.tasks)} tasks ({shown}); "
                    "choose one of them, or declare it in the sim's task list")
        elif name is not None:
            raise TaskError(
                f"this bridge's sim declares no tasks, so a claim cannot choose one (got task={name!r}); "
                "choose the env with build arguments, or serve a VectorSim that declares tasks "
                "(pytest_hud.sim.MultiTaskSim)")
        return task

    def can_claim(self) -> bool:
        """A slot is free, and (wave mode) no wave is planned or running: such a claim waits for the next."""
        if self.wave and self._wave_busy():
            return False
        return any(s.state is SlotState.FREE and s.service is None for s in self.slots)

    def _wave_busy(self) -> bool:
        """A wave is being reset, or its slots wait for their agents or run (wave mode)."""
        return self._wave_resetting or any(
            s.state in (SlotState.LIVE, SlotState.DONE)
            or (s.state is SlotState.CLAIMED and s.first_obs is not None) for s in self.slots)

    def claim(self, owner: int, task: dict[str, Any], index: int | None = None) -> Slot:
        """Mint a token for a free slot (the lowest free index unless ``index`` is given).

        A claim for a task prefers a free slot whose last episode ran that task: its env is cached.
        Where slots step in parallel lanes (``lanes``), it then prefers the lane with the fewest
        claimed slots, so that two episodes on a bridge of two processes step on both.
        """
        free = [s for s in self.slots
                if s.state is SlotState.FREE and s.service is None and index in (None, s.index)]
        if not free:
            raise SlotError("no free slot")
        name = task.get("task")
        slot = next((s for s in free if name is not None and s.last_task == name), None)
        if slot is None and self.lanes is not None:
            lanes = self.lanes
            busy = Counter(lanes[s.index] for s in self.slots if s.state is not SlotState.FREE)
            slot = min(free, key=lambda s: (busy[lanes[s.index]], s.index))
        if slot is None:
            slot = free[0]
        slot.clear_episode()
        slot.state = SlotState.CLAIMED
        slot.token = secrets.token_hex(16)  # 128 bits: unguessable, and short on the wire
        slot.owner = owner
        slot.task = dict(task)
        seed = task.get("seed")
        slot.seed = None if seed is None else int(seed)
        slot.options, slot.prompt = task.get("options"), task.get("prompt")
        if name is not None:
            slot.last_task = name
            if slot.prompt is None:
                slot.prompt = name  # a multi-task policy learns the episode's task from its prompt
        self._by_token[slot.token] = slot
        return slot

    def by_token(self, token: Any) -> Slot:
        if not isinstance(token, str):
            raise SlotError(f"a claim token is a string, got {type(token).__name__}")
        slot = self._by_token.get(token)
        if slot is None:
            raise SlotError(
                "unknown or released token; claim a slot with reset() on the control channel first"
            )
        return slot

    def owned(self, owner: int, token: Any) -> Slot:
        """The slot of ``token``, which only the connection that minted it may grade or release."""
        slot = self.by_token(token)
        if slot.owner != owner:
            raise SlotError("this token was minted on another connection; only its owner may use it")
        return slot

    def owned_by(self, owner: int) -> list[Slot]:
        return [s for s in self.slots if s.owner == owner and s.state is not SlotState.FREE]

    def grade(self, slot: Slot) -> dict[str, Any]:
        """``result(token)``: the grade, its prompt and task; the caller then releases the slot."""
        result = slot.result()
        result["prompt"] = slot.prompt
        result["task"] = {k: v for k, v in slot.task.items() if k != "options"}
        self.episodes += 1
        return result

    def release(self, slot: Slot, why: str) -> SlotReleased:
        """Free a slot whatever its state; returns the failure for an agent still waiting on it."""
        if slot.token is not None:
            self._by_token.pop(slot.token, None)
        slot.token, slot.owner = None, None
        slot.state = SlotState.FREE
        slot.connected = False
        slot.pending_action = slot.first_obs = slot.deadline = None
        return SlotReleased(f"slot {slot.index} released: {why}")

    def snapshot(self) -> list[dict[str, Any]]:
        return [
            {"slot": s.index, "state": s.state.value, "steps": s.steps, "connected": s.connected,
             "faults": s.faults, "service": s.service}
            for s in self.slots
        ]

    @property
    def in_service(self) -> int:
        """Slots not retired (the bridge's width as it now runs)."""
        return sum(1 for s in self.slots if not (s.service or "").startswith("retired"))

    # ---------------------------------------------------------------- resets
    def plan_reset(self, slots: list[Slot]) -> ResetPlan:
        tasks = [s.task.get("task") for s in slots] if self.tasks else None
        return ResetPlan(list(slots), [s.index for s in slots], [s.seed for s in slots],
                         [s.options for s in slots], tasks,
                         [s.index for s in slots if s.service == "rebuild"])

    def plan_wave(self) -> ResetPlan | None:
        """Wave mode: reset every claim gathered so far at once (None when there is none, or while an
        earlier wave still runs: the global reset would reset its episodes too)."""
        if self.broken or self._wave_busy():
            return None
        claimed = [s for s in self.slots if s.state is SlotState.CLAIMED]
        if not claimed:
            return None
        self._wave_resetting = True
        return self.plan_reset(claimed)

    def apply_reset(self, plan: ResetPlan, success_at_reset: Any, rows: dict[str, np.ndarray]) -> None:
        """Store each reset slot's first observation (``rows``: ``{feature: [len(plan.slots), ...]}``)."""
        for pos, (s, flag) in enumerate(zip(plan.slots, success_at_reset)):
            s.success_at_reset = bool(flag)  # reported as such, never as the policy's success
            s.needs_park_reset = False
            s.first_obs = {k: v[pos] for k, v in rows.items()}
        if self.wave:  # a global reset leaves no finished sub-env behind
            self._wave_resetting = False
            for s in self.slots:
                s.needs_park_reset = False

    def reset_failed(self, plan: ResetPlan, traceback: str) -> tuple[SimFailed, list[tuple[int, SlotFailure]]]:
        """The sim raised during ``plan`` and cannot pin it on a slot: the bridge is broken, the slots
        being bound fail, and so does every LIVE episode at once (none could ever step again).
        Returns the reset's failure and ``(slot index, failure)`` for each LIVE slot ended."""
        self._mark_broken(traceback)
        self._wave_resetting = False
        which = ", ".join(map(str, plan.indices))
        cause = f"slot {which}'s reset" if len(plan.indices) == 1 else f"the reset of slots {which}"
        failure = SimFailed(f"sim raised during reset: {self.broken_reason}")
        for s in plan.slots:
            if s.connected:  # per-slot reset at bind; a wave's claimers hear it from reset()
                self._end(s, str(failure), failure)
        return failure, self._break_live(cause)

    def _break_live(self, cause: str) -> list[tuple[int, SlotFailure]]:
        """End every LIVE episode of a bridge that ``cause`` broke; returns them, to be told now."""
        ended: list[tuple[int, SlotFailure]] = []
        for s in self.slots:
            if s.state is SlotState.LIVE:
                failure = BridgeBroken(f"slot {s.index}: bridge broken by {cause}: {self.broken_reason}; "
                                       "the pool replaces it")
                self._end(s, str(failure), failure)
                ended.append((s.index, failure))
        return ended

    # ---------------------------------------------------------------- faults
    def faulted(self, acting: list[tuple[Slot, str | None]], faults: dict[int, str],
                stage: str, intact: Any = ()) -> list[tuple[int, SimFailed]]:
        """The envs of ``faults``' slots raised during a ``stage`` (reset, step) of a sim that isolates
        its slots: each one's episode fails (if it was one of ``acting``, as ``(slot, token)``), its
        env is to be rebuilt (:meth:`to_rebuild`) or, after ``max_faults`` faults, the slot is retired.
        Every other slot is untouched, and so is each slot of ``intact`` (its env is unharmed: the
        claim itself could not be served). Returns the failures to tell the slots' agents now."""
        tokens = {s.index: token for s, token in acting}
        failed: list[tuple[int, SimFailed]] = []
        for i, trace in sorted(faults.items()):
            slot = self.slots[i]
            why = last_line(trace)
            if i not in intact and not (slot.service or "").startswith("retired"):  # (retired stays retired)
                slot.faults += 1
                if slot.faults >= self.max_faults:
                    self._retire(slot, f"its env raised {slot.faults} times (last: {why})")
                else:
                    slot.service = "rebuild"
            if i in tokens and slot.token is not None and slot.token == tokens[i]:
                what = f"slot {i} could not serve this claim" if i in intact else f"slot {i}'s env raised"
                failure = SimFailed(f"{what} during {stage}: {why}; this episode fails, the "
                                    f"bridge's other slots go on\n{trace.rstrip()}")
                self._end(slot, str(failure), failure)
                failed.append((i, failure))
        return failed

    def to_rebuild(self) -> list[int]:
        """Slots whose env raised and is not rebuilt yet, and that no claim holds (a claimed one is
        rebuilt by its own reset: :attr:`ResetPlan.rebuild`)."""
        return [s.index for s in self.slots
                if s.service == "rebuild" and s.state in (SlotState.FREE, SlotState.DONE)]

    def rebuilt(self, index: int, error: str | None) -> None:
        """Slot ``index``'s env was rebuilt (``error`` None) or its rebuild raised: it is retired."""
        slot = self.slots[index]
        if slot.service != "rebuild":
            return
        if error is None:
            slot.service = None
        else:
            self._retire(slot, f"its env could not be rebuilt ({last_line(error)})")

    def _retire(self, slot: Slot, why: str) -> None:
        slot.service = f"retired: {why}"
        left = self.in_service
        self.notes.append(f"slot {slot.index} retired: {why}; the bridge runs on {left} of {self.width} slots")
        if not left:
            self._mark_broken(f"every slot of this bridge was retired: {why}")

    # ------------------------------------------------------------- agent side
    def open(self, now: float) -> Handshake:
        """An agent connected; it has until ``now + Timeouts.claim`` to send its claim frame."""
        handshake = Handshake(now + self.timeouts.claim)
        self._handshakes.add(handshake)
        return handshake

    def hang_up(self, handshake: Handshake) -> None:
        self._handshakes.discard(handshake)
        handshake.deadline = None

    def resolve_claim(self, token: Any) -> Slot:
        """The slot a claim binds to (``None`` binds the only claimed slot); else :class:`SlotError`."""
        if token is None:
            waiting = [s for s in self.slots if s.state is SlotState.CLAIMED and not s.connected]
            if len(waiting) != 1:
                raise SlotError(
                    f"a None claim needs exactly one claimed, undialed slot; there are "
                    f"{len(waiting)}: send the token that reset() returned"
                )
            return waiting[0]
        slot = self.by_token(token)
        if slot.connected or slot.state is not SlotState.CLAIMED:
            raise SlotError(f"token for slot {slot.index} is already in use by another connection")
        return slot

    def bind(self, handshake: Handshake, claim_frame: Any) -> Slot:
        """Bind the agent's decoded claim frame to its slot; raises a :class:`SlotFailure` if refused."""
        self.hang_up(handshake)
        if handshake.failure is not None:
            raise handshake.failure
        if not isinstance(claim_frame, dict) or "claim" not in claim_frame:
            raise BadClaim("the first frame must be {'claim': TOKEN}")
        try:
            slot = self.resolve_claim(claim_frame["claim"])
        except SlotError as exc:
            raise BadClaim(str(exc)) from None
        if self.broken:
            raise BridgeBroken(f"bridge is broken: {self.broken_reason}")
        slot.connected = True
        return slot

    def start(self, slot: Slot, now: float) -> dict[str, Any]:
        """The bound slot goes LIVE; returns its first observation frame and starts its first-action clock."""
        if self.broken:  # its reset ran after another call broke the bridge: it could never step
            failure = BridgeBroken(f"bridge is broken: {self.broken_reason}")
            self._end(slot, str(failure), failure)
            raise failure
        obs = slot.first_obs
        if obs is None:
            raise NoFirstObservation(f"slot {slot.index} has no first observation (its reset failed)")
        slot.first_obs = None
        slot.state = SlotState.LIVE
        slot.deadline, slot.awaiting = now + self.timeouts.first_action, "first action"
        return _frame(obs, 0.0, False, False, False)

    def starts_now(self, waiting: int) -> bool:
        """Whether the ``waiting`` episodes (their slots reset, their first observations held back)
        start now: at once unless ``start_together`` is 2 or more, else once they and the LIVE
        episodes are that many. (The caller also starts them when its window runs out.)"""
        if self.start_together <= 1:
            return True
        live = SlotState.LIVE
        return waiting + sum(1 for s in self.slots if s.state is live) >= self.start_together

    def submit_action(self, slot: Slot, action_frame: Any, now: float = 0.0) -> None:
        """Queue a LIVE slot's decoded action frame, which arrived at ``now``; a bad one fails that
        slot (raises :class:`BadAction`). In ready mode ``now`` opens the tick window."""
        if not isinstance(action_frame, dict) or "actions" not in action_frame:
            got = _describe(action_frame)
            raise self.refuse_action(slot, f"an action frame is {{'actions': array}}, got {got}")
        try:
            action = self.contract.coerce_action(action_frame["actions"])
        except ContractError as exc:
            raise self.refuse_action(slot, str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - numpy refuses some values (ragged lists): the agent's error
            raise self.refuse_action(
                slot, f"the action is not an array of numbers ({type(exc).__name__}: {exc})") from None
        slot.pending_action, slot.acted_at = action, now
        slot.deadline = None  # its clock restarts when its next observation is ready

    def refuse_action(self, slot: Slot, reason: str) -> BadAction:
        """Fail ``slot`` for an unusable action frame (its peers continue); returns the failure."""
        failure = BadAction(f"slot {slot.index}: {reason}")
        self._end(slot, str(failure), failure)
        return failure

    def late_frame(self, slot: Slot) -> EpisodeOver:
        return EpisodeOver(f"slot {slot.index}: the episode is over; call result(token)")

    def disconnect(self, slot: Slot, clean: bool) -> None:
        """The agent hung up. A clean close mid-episode is an agent that stopped; anything else an error."""
        if slot.state is SlotState.LIVE:
            self._end(slot, None if clean else f"slot {slot.index}: agent disconnected mid-episode")

    def expire(self, now: float) -> list[tuple[Slot | Handshake, SlotFailure]]:
        """Fail every handshake and LIVE slot whose deadline is ``now`` or earlier; returns them."""
        expired: list[tuple[Slot | Handshake, SlotFailure]] = []
        for hs in [h for h in self._handshakes if h.deadline is not None and h.deadline <= now]:
            self.hang_up(hs)
            hs.failure = ClaimTimeout(
                f"no claim frame within {self.timeouts.claim:.0f} s; send {{'claim': TOKEN}}")
            expired.append((hs, hs.failure))
        for s in self.slots:
            if s.state is SlotState.LIVE and s.deadline is not None and s.deadline <= now:
                first = s.awaiting == "first action"
                limit, flag = ((self.timeouts.first_action, "--hud-first-action-timeout") if first
                               else (self.timeouts.step, "--hud-step-timeout"))
                failure = ActionTimeout(
                    f"slot {s.index} sent no {s.awaiting} within {limit:g} s ({flag}); its peers continue")
                self._end(s, str(failure), failure)
                expired.append((s, failure))
        return expired

    # ------------------------------------------------------------------ ticks
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
        if self.broken or not self.ready_to_step(now):
            return None
        if self.wave and any(s.state is SlotState.CLAIMED for s in self.slots):
            return None  # a reset slot whose agent has not bound yet must not be stepped
        actions = np.empty(self._batch_shape, self._hold_action.dtype)
        park, acting = [], []
        if self._ready:  # only the slots whose actions are in; the others are not stepped at all
            mask = np.zeros(len(self.slots), bool)
            for s in self.slots:
                if s.state is SlotState.LIVE and s.pending_action is not None:
                    actions[s.index] = s.pending_action
                    acting.append((s, s.token, s.pending_action))
                    mask[s.index] = True
                else:
                    actions[s.index] = self._hold_action  # keeps the batch well-formed; not stepped
            return TickPlan(actions, park, acting, mask)
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
                actions[s.index] = self._hold_action
        return TickPlan(actions, park, acting, mask)

    def plan_lane(self, lane: int) -> TickPlan | None:
        """Lanes mode: the step of ``lane``'s LIVE slots once every one of them has acted, else None.
        The caller keeps a lane from being planned again while its step is under way."""
        if self.broken:
            return None
        live, acting = SlotState.LIVE, []
        for s in self.lane_slots[lane]:
            if s.state is live:
                if s.pending_action is None:
                    return None
                acting.append((s, s.token, s.pending_action))
        if not acting:
            return None
        actions = np.empty(self._batch_shape, self._hold_action.dtype)
        actions[...] = self._hold_action  # keeps the batch well-formed; only ``mask`` is stepped
        mask = np.zeros(len(self.slots), bool)
        for s, _, action in acting:
            actions[s.index] = action
            mask[s.index] = True
        return TickPlan(actions, [], acting, mask, lane)

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
        deadline = now + self.timeouts.step
        frame = (pack or _rows)(obs)
        frames = []
        for s, token, action in plan.acting:
            if s.token != token:
                continue
            i = s.index
            reward = rewards[i]
            s.steps += 1
            s.total_reward += reward
            if success[i]:
                s.success = True  # latched: a later step cannot take it back
            if score is not None and not math.isnan(score[i]):
                s.score = score[i]
            s.last_action, s.pending_action = action, None
            done, truncated = bool(ended_l[i]), bool(truncated_l[i])
            if done:
                s.terminated, s.truncated = bool(terminated[i]), truncated
                s.state, s.deadline = SlotState.DONE, None
            elif s.state is SlotState.LIVE:
                s.deadline, s.awaiting = deadline, "action"
            frames.append((i, frame(i, reward, done, truncated, s.success)))
        return frames

    def step_failed(self, plan: TickPlan, traceback: str) -> list[tuple[int, SlotFailure]]:
        """The sim raised during ``plan`` and cannot pin it on a slot: the bridge is broken, every slot
        that acted fails, and so does every other LIVE one at once (it could never step again)."""
        self._mark_broken(traceback)
        # the exception's own line first: it is what a summary line or a report shows
        why = f"sim raised during step: {self.broken_reason}\n{self.broken}"
        failed: list[tuple[int, SlotFailure]] = []
        for s, token, _ in plan.acting:
            if s.token == token:
                failure = SimFailed(f"slot {s.index}: {why}")
                self._end(s, why, failure)
                failed.append((s.index, failure))
        stepped = ", ".join(str(s.index) for s, _, _ in plan.acting) or "none"
        return failed + self._break_live(f"a step of slots {stepped}")

    # --------------------------------------------------------------- helpers
    def _end(self, slot: Slot, error: str | None, failure: SlotFailure | None = None) -> None:
        if slot.state is SlotState.LIVE or slot.state is SlotState.CLAIMED:
            slot.state = SlotState.DONE
        if error and not slot.error:
            slot.error = error
            if slot.failure is None:
                slot.failure = failure
        slot.pending_action = slot.deadline = None

    def _mark_broken(self, traceback: str) -> None:
        if not self.broken:
            self.broken = traceback.strip()


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


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return f"a map with keys {sorted(map(str, value))[:8]}"
    return type(value).__name__
