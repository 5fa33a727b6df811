"""The bridge's rules without I/O: claims, ticks, holds, timeouts and failures of its slots.

:class:`BridgeEngine` holds every slot (:mod:`.slots`) and decides what happens to it; :mod:`.server`
only moves bytes (sockets, codec) and runs the sim calls the engine plans, on the main thread. Time
is passed in (``now``: seconds on a monotonic clock), so every rule, timeouts included, is testable
with plain function calls and a fake batch.

The engine holds two rule objects of its own, sharing its slots with them: its tick rules (the
three tick modes, holds, parking, the tick counters) are ``engine.tick_rules``, a
:class:`~.ticks.TickRules`, and the bridge's health (broken or not, envs to rebuild, retired slots)
is ``engine.faults``, a :class:`~.faults.FaultRules`. This module keeps the rest of a slot's life:
claims, binding agents, resets, starting together, timeouts.

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

What the engine refuses or ends is a :mod:`.exceptions` class; ``str(failure)`` is what the agent reads.
"""

from __future__ import annotations

import json
import random
import secrets
from collections import Counter
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any

import numpy as np

from pytest_hud.core.contract import Contract, ContractError
from pytest_hud.sim.claims import ClaimRules
from pytest_hud.sim.instructions import check_instructions, claim_prompt
from pytest_hud.bridge.exceptions import (
    ActionTimeout, BadAction, BadClaim, BridgeBroken, ClaimTimeout, EpisodeOver, NoFirstObservation,
    SlotError, SlotFailure, SlotReleased, TaskError,
)
from pytest_hud.bridge.faults import FaultRules
from pytest_hud.bridge.slots import Slot, SlotState
from pytest_hud.bridge.ticks import DEFAULT_TICK_WINDOW, TICK_MODES, TickPlan, TickRules, _frame, resolve_tick

__all__ = ["DEFAULT_START_WINDOW", "DEFAULT_TICK_WINDOW", "TICK_MODES", "BridgeEngine", "Handshake", "ResetPlan", "TickPlan", "Timeouts", "resolve_tick"]

#: How long a held episode waits for the others to start with it (``start_together``): about the
#: spread of a wave's starts on a busy machine (the workers encode videos and write reports between
#: episodes), and short next to an episode.
DEFAULT_START_WINDOW = 0.5


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


class BridgeEngine:
    """Slots and claims of one bridge with ``width`` slots (see the module docstring); its ticks
    are ``tick_rules`` (:class:`~.ticks.TickRules`), its faults ``faults`` (:class:`~.faults.FaultRules`)."""

    def __init__(self, width: int, contract: Contract, hold_action: Any, *, hold: str = "zeros",
                 wave: bool = False, timeouts: Timeouts | None = None,
                 build_args: dict[str, Any] | None = None, tick: str = "lockstep",
                 tick_window: float = DEFAULT_TICK_WINDOW, tasks: tuple[str, ...] = (),
                 instructions: Mapping[str, str] | None = None, instruction: str | None = None,
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
        self.contract, self.wave, self.tick = contract, wave, tick
        self._coerce = contract.action_coercer()  # an action's check, per action
        self.isolates = isolates and not wave  # an env's exception is its slot's alone (FaultRules.faulted)
        self._wave_resetting = False  # a wave reset is planned and not applied yet
        self.timeouts = timeouts or Timeouts()
        self.build_args = dict(build_args or {})
        self.tasks = tuple(tasks)  # what a claim may choose from (empty: the sim has no tasks)
        # what a claim without a prompt is prompted with (pytest_hud.sim.instructions)
        self.instructions = check_instructions(instructions, self.tasks)
        self.instruction = instruction
        self._build_key = json.dumps(self.build_args, sort_keys=True)
        self._by_token: dict[str, Slot] = {}
        self._handshakes: set[Handshake] = set()
        self.claims = claims or ClaimRules()
        self._rng = rng or random.SystemRandom()  # seeds for claims that give none
        self.faults = FaultRules(self.slots, max_faults)
        self.tick_rules = TickRules(self.slots, self.faults, hold_action, mode=tick, hold=hold, wave=wave,
                                    isolates=self.isolates, tick_window=tick_window,
                                    step_timeout=self.timeouts.step, lanes=lanes)
        self.episodes = 0

    @property
    def width(self) -> int:
        return len(self.slots)

    @property
    def broken(self) -> str | None:
        """The sim's traceback once it broke the bridge (``faults.broken``), else None."""
        return self.faults.broken

    @property
    def broken_reason(self) -> str:
        return self.faults.broken_reason

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
        slot.options = task.get("options")
        # an explicit prompt, else the task's instruction, else its name (a multi-task policy learns
        # the episode's task from its prompt), else the sim's one instruction
        slot.prompt = claim_prompt(task.get("prompt"), name, self.instructions, self.instruction)
        if name is not None:
            slot.last_task = name
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
        """``result(token)``: the slot's :class:`~pytest_hud.core.results.EpisodeResult` as it
        crosses the control channel, plus the claim's task; the caller then releases the slot."""
        result = slot.result().to_dict()
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
        slot.queued.clear()
        return SlotReleased(f"slot {slot.index} released: {why}")

    def snapshot(self) -> list[dict[str, Any]]:
        return [
            {"slot": s.index, "state": s.state.value, "steps": s.steps, "connected": s.connected,
             "faults": s.faults, "service": s.service}
            for s in self.slots
        ]

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

    def reset_failed(self, plan: ResetPlan, traceback: str) -> tuple[SlotFailure, list[tuple[int, SlotFailure]]]:
        """The sim raised during ``plan`` and cannot pin it on a slot: the bridge is broken
        (:meth:`FaultRules.reset_failed <.faults.FaultRules.reset_failed>`); a wave reset is over."""
        self._wave_resetting = False
        return self.faults.reset_failed(plan, traceback)

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
            slot.end(str(failure), failure)
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
        steps = action_frame.get("steps")
        # {"actions": ..., "render": False}: the agent will not read this step's images (a frame
        # without the key, as every openpi/0 peer sends, gets them rendered)
        render = action_frame.get("render", True)
        if steps is None:
            action = self._checked(slot, action_frame["actions"], "")
            skip = render is False
        else:  # several actions, stepped in turn: {"actions": [T, *action], "steps": T}
            rows = self._rows(slot, action_frame["actions"], steps)
            # "render": one flag for every step, or one per step (a chunk of which the agent reads
            # only the last observation)
            skips = self._skips(slot, render, steps)
            action, skip = rows[0], skips[0]
            slot.queued.extend(zip(rows[1:], skips[1:]))
        slot.pending_action, slot.acted_at, slot.skip_render = action, now, skip
        slot.deadline = None  # its clock restarts when its next observation is ready

    def _checked(self, slot: Slot, action: Any, which: str) -> Any:
        """``action`` as the contract takes it, or the slot failed (:class:`BadAction`) for it."""
        try:
            return self._coerce(action)
        except ContractError as exc:
            raise self.refuse_action(slot, f"{which}{exc}") from None
        except Exception as exc:  # noqa: BLE001 - numpy refuses some values (ragged lists): the agent's error
            raise self.refuse_action(
                slot, f"{which}the action is not an array of numbers ({type(exc).__name__}: {exc})") from None

    def _rows(self, slot: Slot, actions: Any, steps: Any) -> list[Any]:
        """The ``steps`` actions of a frame of several, each checked as a one-action frame's is
        (a replay sends an episode's actions in one frame; the slot gets one observation frame per
        action, and none after its episode ends)."""
        if type(steps) is not int or steps < 1:
            raise self.refuse_action(slot, f"'steps' is the number of actions in the frame, an int >= 1, "
                                           f"got {steps!r}")
        try:
            rows = np.asarray(actions)
        except Exception as exc:  # noqa: BLE001 - a ragged list of actions
            raise self.refuse_action(slot, f"the actions are not an array of numbers ({type(exc).__name__}: {exc})") from None
        if rows.ndim == 0 or len(rows) != steps:
            raise self.refuse_action(slot, f"a frame of {steps} actions has them along its first axis, "
                                           f"got an array of shape {list(rows.shape)}")
        return [self._checked(slot, row, f"action {i} of {steps}: ") for i, row in enumerate(rows)]

    def _skips(self, slot: Slot, render: Any, steps: int) -> list[bool]:
        """Per action of a frame of ``steps``, whether its images go unread: ``render`` is one bool
        for all of them or a list of ``steps`` bools (False: unread)."""
        if type(render) is bool:
            return [not render] * steps
        if not isinstance(render, (list, tuple)):
            got = _describe(render)
        elif len(render) != steps:
            got = f"a list of {len(render)} items"
        elif any(type(r) is not bool for r in render):
            got = f"a list of {len(render)} items not all bools"
        else:
            return [not r for r in render]
        raise self.refuse_action(slot, f"'render' is a bool, or a list of one bool per action "
                                       f"({steps}), got {got}")

    def refuse_action(self, slot: Slot, reason: str) -> BadAction:
        """Fail ``slot`` for an unusable action frame (its peers continue); returns the failure."""
        failure = BadAction(f"slot {slot.index}: {reason}")
        slot.end(str(failure), failure)
        return failure

    def late_frame(self, slot: Slot) -> EpisodeOver:
        return EpisodeOver(f"slot {slot.index}: the episode is over; call result(token)")

    def disconnect(self, slot: Slot, clean: bool) -> None:
        """The agent hung up. A clean close mid-episode is an agent that stopped; anything else an error."""
        if slot.state is SlotState.LIVE:
            slot.end(None if clean else f"slot {slot.index}: agent disconnected mid-episode")

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
                    f"slot {s.index}'s agent read none of its observations within {limit:g} s ({flag}), "
                    "so its queued actions were not stepped; its peers continue" if s.awaiting == "read" else
                    f"slot {s.index} sent no {s.awaiting} within {limit:g} s ({flag}); its peers continue")
                s.end(str(failure), failure)
                expired.append((s, failure))
        return expired


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return f"a map with keys {sorted(map(str, value))[:8]}"
    return type(value).__name__
