"""A sim run inside this worker (``--hud-inline``): the bridge's slot rules on one slot of its own.

When one env-step costs less than a round trip to a shared bridge (CartPole, MountainCar, small
state-only sims), a worker steps its own env: :class:`InlineBridge` is what :class:`ControlClient`
and :class:`SlotClient` are to a bridge process, without a process or a socket. It runs the same
:class:`~pytest_hud.bridge.engine.BridgeEngine` (claims, seeds, latched success, grades), the same
sim calls (:mod:`pytest_hud.bridge.simcalls`) on the sim the bridge's loader builds, and the same
frames, packed and read as on the wire (an action as ``action_frame`` packs it; an observation as
the bridge packs it and the worker's reader reads it): an episode's steps, returns and success are
those of the same claim on a bridge, whatever the worker or the width.
"""

from __future__ import annotations

import json
import time
import traceback
from typing import Any

from pytest_hud.bridge.engine import BridgeEngine, Timeouts
from pytest_hud.bridge.failures import SlotError, SlotFailure, TaskError
from pytest_hud.bridge.simcalls import explain, park_step_observe, reset_and_observe
from pytest_hud.client.protocol import BridgeError, Claim, ObservationReader, action_frame, read_frame
from pytest_hud.core.contract import Contract
from pytest_hud.sim.target import load_sim
from pytest_hud.wire.codec import packb, rows_packer, unpack_action

__all__ = ["AsyncInlineSlot", "InlineBridge", "InlineSlot"]

_OWNER = 0  # the one "control connection": this worker


class InlineBridge:
    """``target``'s sim with one slot, in this process; the control calls of a bridge (``contract``,
    ``claim``, ``result``, ``release``, ``stats``) and :meth:`open_slot` for an episode's steps."""

    address = None  # no process, no socket

    def __init__(self, target: str, build: dict[str, Any], timeouts: Timeouts | None = None) -> None:
        self.target = target
        self.sim = load_sim(target, 1, "sync", build)
        try:
            if not self.sim.supports_slot_reset:
                raise BridgeError(f"{target} resets all its envs at once, so it cannot run in a worker; "
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
                "ticks": engine.ticks, "env_steps": engine.env_steps, "slot_steps": engine.slot_steps,
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
        self._read = ObservationReader()
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
        self.metadata = {"claim_required": True, "width": 1, "inline": True}
        self.first_observation = read_frame(packb(frame), "first observation")

    def step(self, action: Any) -> dict[str, Any]:
        """One action (``[A]``) in, the next observation frame out, as through a bridge."""
        engine, slot = self.bridge.engine, self.slot
        now = time.monotonic()
        try:
            engine.submit_action(slot, unpack_action(action_frame(action)), now)
        except SlotFailure as failure:
            raise BridgeError(str(failure)) from None
        plan = engine.plan_tick(now)
        if plan is None:
            raise BridgeError(f"slot {slot.index}: the episode is over; call result(token)")
        try:
            batch, obs, faults = park_step_observe(self.bridge.sim, plan.park, plan.actions, plan.mask)
            if faults:
                raise RuntimeError("\n".join(faults.values()))
        except Exception:
            failed = engine.step_failed(plan, explain(traceback.format_exc()))
            raise BridgeError(str(failed[0][1]) if failed else "the sim raised during its step") from None
        frames = engine.apply_batch(plan, batch, obs, time.monotonic(), rows_packer)
        return self._read(frames[0][1])

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

    async def step(self, action: Any) -> dict[str, Any]:
        return self._slot.step(action)

    async def close(self) -> None:
        self._slot.close()
