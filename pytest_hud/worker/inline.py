"""A sim run inside this worker (``--hud-inline``): the bridge's slot rules on one slot of its own.

When one env-step costs less than a round trip to a shared bridge (CartPole, MountainCar), or the
sim renders no camera (Meta-World from state: see :mod:`pytest_hud.controller.inline`), a worker
steps its own env: :class:`InlineBridge` is what :class:`ControlClient`
and :class:`SlotClient` are to a bridge process, without a process or a socket. It builds the sim
as a bridge's loader does (one slot) and runs the same :class:`~pytest_hud.bridge.engine.BridgeEngine`
for claims, seeds, resets and grades; each step checks the action as the bridge does, steps the env
as the bridge's sim steps a slot's env, tallies the episode by the bridge's rules (return, latched
success, score, the end) and hands the agent the frame it would have read off the wire. So an
episode's steps, return and success are those of the same claim on a bridge, whatever the worker
or the width (``tests/e2e/test_inline_sims.py`` runs the same episodes both ways).
"""
from __future__ import annotations

import json
import math
import sys
import time
import traceback
from typing import Any

import numpy as np

from pytest_hud.bridge.engine import BridgeEngine, Timeouts
from pytest_hud.bridge.exceptions import SlotError, SlotFailure, TaskError
from pytest_hud.bridge.simcalls import explain, reset_and_observe
from pytest_hud.bridge.slots import SlotState
from pytest_hud.client.protocol import BridgeError, Claim, action_frame, frames_to_end, read_frame
from pytest_hud.core.contract import Contract, ContractError
from pytest_hud.sim.base import GymSim, SlotFaults, info_success
from pytest_hud.sim.target import load_sim
from pytest_hud.wire.codec import packb, unpack_action

__all__ = ["AsyncInlineSlot", "InlineBridge", "InlineSlot"]

_OWNER = 0  # the one "control connection": this worker
_refs = sys.getrefcount
# what it says of an array held by one local name: from 3.14 the interpreter may leave references
# it borrows uncounted, so a count no longer proves that no one else holds the array (0: copy always)
_SOLE = 2 if sys.version_info < (3, 14) else 0
_ONE = np.ones(1, bool)  # the step mask of the one slot


_REWARDS: dict[float, np.float32] = {}  # the float32 of rewards seen (a sim gives few distinct ones)
_ZEROS = (np.float32(0.0), np.float32(-0.0))


def _float32(reward: float) -> np.float32:
    """``np.float32(reward)``, as the wire gives a reward, from a cache of the values seen (numpy
    scalars are immutable, so frames may share one): a cheap sim's step costs little more than
    making one. Zero is looked up by its sign (-0.0 == 0.0 as a key); NaN is never found, and
    the cache stops growing at 256 values."""
    r32 = _REWARDS.get(reward)
    if r32 is not None:
        return r32 if reward != 0.0 else _ZEROS[math.copysign(1.0, reward) < 0]
    r32 = np.float32(reward)
    if len(_REWARDS) < 256:
        _REWARDS[reward] = r32
    return r32


class InlineBridge:
    """``target``'s sim with one slot, in this process; the control calls of a bridge (``contract``,
    ``claim``, ``result``, ``release``, ``stats``) and :meth:`open_slot` for an episode's steps."""

    address = None  # no process, no socket

    def __init__(self, target: str, build: dict[str, Any], timeouts: Timeouts | None = None) -> None:
        self.target = target
        self.sim = load_sim(target, 1, "sync", build)
        try:
            if not (self.sim.supports_slot_reset and getattr(self.sim, "isolates_slots", False)):
                raise BridgeError(f"{target} is not a factory of single envs, so it cannot run in a worker; "
                                  "use --hud-inline=never")
            self._contract = self.sim.contract()
            self.engine = BridgeEngine(1, self._contract, self.sim.hold_action(), build_args=build,
                                       timeouts=timeouts, tasks=tuple(getattr(self.sim, "tasks", ()) or ()),
                                       instructions=getattr(self.sim, "instructions", None) or {},
                                       instruction=getattr(self.sim, "instruction", None),
                                       claims=self.sim.claim_rules)
        except BaseException:
            self.sim.close()
            raise
        self.coerce = self._contract.action_coercer()  # an action's check, per step
        self.info = {"inline": True, "width": 1, "target": target, "build": build, "vectorization": "inline"}
        self.started = time.monotonic()

    def contract(self) -> Contract:
        return self._contract

    def claim(self, wait: float = 0.0, **task: Any) -> Claim:
        engine = self.engine
        try:
            task = engine.check_task(task)
        except TaskError as exc:
            raise BridgeError(str(exc)) from None
        if engine.broken:
            raise BridgeError(f"the sim is broken: {engine.broken_reason}")
        if not engine.can_claim():
            raise BridgeError("this worker's own sim runs one episode at a time, and one is running; "
                              "finish it first, or use --hud-inline=never for concurrent episodes")
        slot = engine.claim(_OWNER, task)
        return Claim(slot.token, slot.index, slot.prompt, slot.seed, slot.task.get("task"))

    reset = claim

    def result(self, token: str) -> dict[str, Any]:
        slot = self._owned(token)
        grade = self.engine.grade(slot)
        self.engine.release(slot, "episode graded")
        return json.loads(json.dumps(grade))  # as it crosses a bridge's control channel

    def release(self, token: str) -> dict[str, Any]:
        slot = self._owned(token)
        self.engine.release(slot, "token released")
        return {"released": True, "slot": slot.index}

    def _owned(self, token: str) -> Any:
        try:
            return self.engine.owned(_OWNER, token)
        except SlotError as exc:
            raise BridgeError(str(exc)) from None

    def stats(self) -> dict[str, Any]:
        engine = self.engine
        return {"width": 1, "target": self.target, "build": engine.build_args, "broken": engine.broken,
                "ticks": engine.tick_rules.ticks, "env_steps": engine.tick_rules.env_steps,
                "slot_steps": engine.tick_rules.slot_steps,
                "episodes": engine.episodes, "uptime_s": time.monotonic() - self.started,
                "vectorization": "inline", "slots": engine.snapshot()}

    def open_slot(self, token: str | None) -> InlineSlot:
        return InlineSlot(self, token)

    def close(self) -> None:
        self.sim.close()


class InlineSlot:
    """One episode's steps on an :class:`InlineBridge` (what :class:`SlotClient` is to a bridge)."""

    def __init__(self, bridge: InlineBridge, token: str | None) -> None:
        self.bridge = bridge
        engine, sim = bridge.engine, bridge.sim
        try:
            self.slot = engine.bind(engine.open(time.monotonic()), {"claim": token})
            plan = engine.plan_reset([self.slot])
            try:
                flags, rows, faults = reset_and_observe(sim, plan.indices, plan.seeds, plan.options, plan.tasks,
                                                        plan.rebuild)
                if faults:
                    raise RuntimeError("\n".join(faults.values()))
            except Exception:
                failure, _ = engine.reset_failed(plan, explain(traceback.format_exc()))
                raise failure from None
            engine.apply_reset(plan, flags, rows)
            frame = engine.start(self.slot, time.monotonic())
        except SlotFailure as failure:
            raise BridgeError(str(failure)) from None
        # a GymSim's one env, stepped here directly; any other sim (a MultiTaskSim) through its
        # step_slots, as the bridge steps it
        self._env = sim.env.envs[0] if isinstance(sim, GymSim) else None
        self._hold = engine.tick_rules.hold_action
        self._batch_shape = (1, *self._hold.shape)
        # looked up once per episode, not per step: the step is most of a cheap sim's cost
        self._coerce, self._counts = bridge.coerce, engine.tick_rules
        self._rows = tuple(sim.observe().items()) if self._env is not None else None
        # an observation that is one array (no dict) of the row's dtype and shape is copied into the
        # frame as it is (what the row would hold), not written into the row and copied out of it
        bare = sim._bare_key if self._env is not None else None
        self._bare = None
        if bare is not None:
            row = sim.observe()[bare]
            self._bare = (bare, row.dtype, row.shape[1:])
        self.metadata = {"claim_required": True, "width": 1, "inline": True}
        self.first_observation = read_frame(packb(frame), "first observation")

    def step(self, action: Any, render: bool = True) -> dict[str, Any]:
        """One action (``[A]``) in, the next observation frame out, as through a bridge (``render``,
        the hint that no one reads this step's images, is not needed: an env cheap enough to run in
        the worker renders what it renders).

        The bridge's per-step path without its batch plumbing (one slot has no batch): the action
        as the wire delivers it, checked by the contract; the env stepped as the bridge's sim steps
        a slot's env (:meth:`GymSim.step_slots`); the episode tallied as :meth:`TickRules.apply_batch`
        tallies a slot (steps, return, latched success, score, the end); the frame as the wire
        reads it (the features' rows as read-only arrays, the reward a float32)."""
        slot = self.slot
        if slot.state is not SlotState.LIVE:
            engine = self.bridge.engine
            raise BridgeError(engine.late_frame(slot).args[0] if slot.failure is None else str(slot.failure))
        if type(action) is not np.ndarray or action.dtype.kind not in "biuf":
            arr = np.asarray(action)
            if arr.dtype.kind not in "biuf":  # what the wire would make of it, exactly
                action = unpack_action(action_frame(action))["actions"]
        try:
            action = self._coerce(action)
        except ContractError as exc:
            engine = self.bridge.engine
            raise BridgeError(str(engine.refuse_action(slot, str(exc)))) from None
        except Exception as exc:  # noqa: BLE001 - numpy refuses some values: the agent's error, as on a bridge
            engine = self.bridge.engine
            raise BridgeError(str(engine.refuse_action(
                slot, f"the action is not an array of numbers ({type(exc).__name__}: {exc})"))) from None
        obs = None
        try:
            if self._env is None:
                reward, success, score, terminated, truncated = self._step_sim(action)
            else:
                obs, reward, terminated, truncated, info = self._env.step(action)
                bare = self._bare
                if bare is not None and type(obs) is np.ndarray and obs.dtype == bare[1] and obs.shape == bare[2]:
                    # the frame's feature as it is (not written into the row and copied out), copied
                    # unless no one else can reach it: an array that owns its memory (no base) and
                    # is referenced only here (this name and getrefcount's argument) is a fresh one
                    # the env kept no hold of (CartPole makes one each step)
                    if obs.base is not None or _refs(obs) > _SOLE:
                        obs = obs.copy()
                else:
                    self.bridge.sim._write_row(0, obs)  # the dtype, shape and keys a bridge's row gives it
                    obs = None
                success = bool(info) and info_success(info)
                score = info.get("score") if info else None  # as GymSim reads an env's info
        except Exception as exc:  # this episode fails; a fresh env serves the next, as a bridge rebuilds one
            why = exc.faults[0] if isinstance(exc, SlotFaults) else explain(traceback.format_exc())
            failure = f"slot {slot.index}: sim raised during step: {why.splitlines()[-1]}\n{why}"
            slot.end(failure, None)
            try:
                self.bridge.sim.rebuild_slot(0)
            except Exception:  # noqa: BLE001 - no env to go on with: later claims hear why
                self.bridge.engine.faults.mark_broken(traceback.format_exc())
            raise BridgeError(failure) from None
        reward, terminated, truncated = float(reward), bool(terminated), bool(truncated)
        counts = self._counts
        counts.ticks += 1
        counts.env_steps += 1
        counts.slot_steps += 1
        done = terminated or truncated
        slot.took_step(reward, success, None if score is None else float(score), done, terminated, truncated)
        if obs is not None:
            obs.setflags(False)  # write=False (a keyword costs as much as the call)
            frame: dict[str, Any] = {self._bare[0]: obs}
        else:
            frame = {}
            for key, rows in self._rows or self.bridge.sim.observe().items():
                row = rows[0].copy()
                row.setflags(False)
                frame[key] = row
        frame["reward"] = _float32(reward)
        frame["terminated"], frame["truncated"], frame["success"] = done, truncated, slot.success
        return frame

    def step_many(self, actions: Any, render: Any = None) -> list[dict[str, Any]]:
        """Several actions in turn, as :meth:`SlotClient.step_many <pytest_hud.client.bridge.SlotClient.step_many>`
        (here there is no round trip to save): their frames, up to the episode's end (``render`` is
        not needed, as in :meth:`step`)."""
        rows = iter(actions)
        return frames_to_end(lambda: self.step(next(rows)), len(actions))

    def _step_sim(self, action: Any) -> tuple[float, bool, float | None, bool, bool]:
        """One step of a sim other than a GymSim, as the bridge steps a slot of it: the action
        batch built as the bridge's ticks build it, :meth:`VectorSim.step_slots` on this one slot;
        its reward, success, score (None: none given), terminated and truncated."""
        actions = np.empty(self._batch_shape, self._hold.dtype)
        actions[0] = action
        batch = self.bridge.sim.step_slots(actions, _ONE)
        score = None if batch.score is None else float(batch.score[0])
        return (float(batch.rewards[0]), bool(batch.success[0]), score, bool(batch.terminated[0]),
                bool(batch.truncated[0]))

    def close(self) -> None:
        pass

    def __enter__(self) -> InlineSlot:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncInlineSlot:
    """:class:`InlineSlot` for ``Agent.arun`` (what :class:`AsyncSlotClient` is to a bridge): the
    steps run in the calling thread, as cheap as they are (that is why the env runs here)."""

    def __init__(self, slot: InlineSlot) -> None:
        self._slot = slot
        self.metadata, self.first_observation = slot.metadata, slot.first_observation

    async def step(self, action: Any, render: bool = True) -> dict[str, Any]:
        return self._slot.step(action)

    async def close(self) -> None:
        self._slot.close()
