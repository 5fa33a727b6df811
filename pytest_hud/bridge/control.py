"""The bridge's control channel: the JSON-RPC handlers that claim, grade, release and rebuild its slots.

:class:`ControlHandlers` is the control half of :class:`~pytest_hud.bridge.server.BridgeServer`,
a mixin with no state of its own: ``contract``, ``stats``, ``claim`` (also ``reset``; in wave mode
the global reset it waits for), ``result`` and ``release``, and what a closed control connection
frees. The resets and env rebuilds they plan run through the server's sim gate, so they take
turns with the tick (:mod:`.server`, which keeps the slot WebSocket path and the tick).
"""

from __future__ import annotations

import asyncio
import os
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

from pytest_hud.wire.rpc import RpcError
from pytest_hud.sim.base import VectorSim, sim_stats, stepping_hint
from pytest_hud.bridge.closing import close_reason, fail
from pytest_hud.bridge.engine import BridgeEngine, ResetPlan
from pytest_hud.bridge.failures import SimFailed, SlotError, SlotFailure, TaskError
from pytest_hud.bridge.simcalls import explain, reset_and_observe
from pytest_hud.bridge.simgate import SimGate
from pytest_hud.bridge.slots import Slot, SlotState
from pytest_hud.sim.threads import default_threads
from pytest_hud.bridge.wsserver import WsConnection

__all__ = ["ControlHandlers"]


class ControlHandlers:
    """The control channel's RPC handlers and the resets and rebuilds they run (a mixin of
    :class:`~pytest_hud.bridge.server.BridgeServer`; see the module docstring)."""

    # The server's state and methods these handlers use: declared, not imported, because the
    # server imports this module (set by BridgeServer.__init__, or methods of the server).
    sim: VectorSim
    engine: BridgeEngine
    target: str
    contract_dict: dict[str, Any]
    started: float
    step_s: float
    _ticked_from: float
    _ticked_until: float
    _held: list[Any]
    _sockets: dict[int, WsConnection]
    _slot_changed: asyncio.Condition
    _sim_gate: SimGate
    _wave_gather_s: float
    _wave_task: asyncio.Task | None
    _rebuild_task: asyncio.Task | None
    _sim_call: Callable[..., Awaitable[Any]]
    _maybe_tick: Callable[[], None]

    async def _rpc_contract(self, conn: Any) -> dict[str, Any]:
        return self.contract_dict

    async def _rpc_stats(self, conn: Any) -> dict[str, Any]:
        engine = self.engine
        return {
            "width": engine.width,
            "pid": os.getpid(),
            "target": self.target,
            "build": engine.build_args,
            "broken": engine.broken,
            "ticks": engine.tick_rules.ticks,
            "env_steps": engine.tick_rules.env_steps,
            "slot_steps": engine.tick_rules.slot_steps,
            "episodes": engine.episodes,
            "uptime_s": time.monotonic() - self.started,
            "slots": engine.snapshot(),
            "wave": engine.wave,
            "tick": engine.tick,
            "start_together": engine.start_together,
            "starts_held": len(self._held),
            "vectorization": self.sim.vectorization,
            "tasks": list(engine.tasks),
            "sim": sim_stats(self.sim),
            "step_s": self.step_s,
            "hint": stepping_hint(self.sim, engine.tick_rules.ticks, engine.tick_rules.env_steps, self.step_s,
                                  self._ticked_until - self._ticked_from, default_threads(engine.width)),
            "isolates": engine.isolates,
            "in_service": engine.faults.in_service,
            "notes": list(engine.faults.notes),
        }

    async def _rpc_claim(self, conn: Any, **task: Any) -> dict[str, Any]:
        """``claim(**task)`` (also ``reset``): check the claim, wait for a free slot, mint its token.
        The slot is reset with the claim's seed when its agent binds (or, for a wave sim, in the
        next wave, which this call waits for)."""
        engine = self.engine
        try:
            task = engine.check_task(task)
        except TaskError as exc:
            raise RpcError(str(exc)) from None
        deadline = time.monotonic() + engine.timeouts.wait_slot
        async with self._slot_changed:
            while True:
                if engine.broken:
                    raise RpcError(f"bridge is broken: {engine.broken_reason}; the pool will replace it")
                if engine.can_claim():
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RpcError(
                        f"no slot of {engine.width} became free within "
                        f"{engine.timeouts.wait_slot:.0f} s; raise --hud-width or release tokens"
                    )
                try:
                    await asyncio.wait_for(self._slot_changed.wait(), remaining)
                except TimeoutError:
                    continue
            slot = engine.claim(conn.id, task)
        if engine.wave:
            await self._join_wave(slot)
        # the seed (drawn here when the claim gave none) and task the episode runs: its record's
        return {"token": slot.token, "slot": slot.index, "prompt": slot.prompt, "seed": slot.seed,
                "task": slot.task.get("task")}

    async def _join_wave(self, slot: Slot) -> None:
        """Wave fallback: wait for the next global reset, which gathers every pending claim."""
        if self._wave_task is None or self._wave_task.done():
            self._wave_task = asyncio.ensure_future(self._run_wave())
        await asyncio.shield(self._wave_task)
        if slot.first_obs is None:
            raise RpcError(f"slot {slot.index} missed its wave reset: {slot.error}")

    async def _run_wave(self) -> None:
        await asyncio.sleep(self._wave_gather_s)
        async with self._sim_gate:
            plan = self.engine.plan_wave()
            if plan is None:
                return
            try:
                await self._reset(plan)
            except SimFailed as failure:
                async with self._slot_changed:
                    self._slot_changed.notify_all()  # claims waiting for the next wave hear it is broken
                raise RpcError(str(failure)) from None

    async def _reset(self, plan: ResetPlan) -> None:
        """Run ``plan`` on the main thread. A sim exception breaks the bridge (raises :class:`SimFailed`;
        every LIVE episode hears it at once); where the sim isolates its slots, only the slots whose
        envs raised fail (raises :class:`SimFailed` when the slot of ``plan`` is one of them)."""
        engine = self.engine
        try:
            flags, rows, faults = await self._sim_call(
                reset_and_observe, self.sim, plan.indices, plan.seeds, plan.options, plan.tasks, plan.rebuild
            )
        except Exception:
            failure, ended = engine.reset_failed(plan, explain(traceback.format_exc()))
            self._tell(ended)
            raise failure from None
        if not faults:
            for i in plan.rebuild:
                engine.faults.rebuilt(i, None)
            engine.apply_reset(plan, flags, rows)
            return
        if not engine.isolates:  # a sim that says it isolates slots but does not: broken, as above
            failure, ended = engine.reset_failed(plan, explain("\n".join(faults.values())))
            self._tell(ended)
            raise failure
        for i in plan.rebuild:  # a rebuild that raised retires its slot
            engine.faults.rebuilt(i, faults.get(i))
        failed = dict(engine.faults.faulted([(s, s.token) for s in plan.slots], faults, "reset", faults.intact))
        keep = [n for n, i in enumerate(plan.indices) if i not in faults]
        if keep:
            kept = ResetPlan([plan.slots[n] for n in keep], [plan.indices[n] for n in keep],
                             [plan.seeds[n] for n in keep], [plan.options[n] for n in keep],
                             None if plan.tasks is None else [plan.tasks[n] for n in keep])
            engine.apply_reset(kept, [flags[n] for n in keep], {k: v[keep] for k, v in rows.items()})
        self._rebuild_soon()
        if failed:
            raise next(iter(failed.values()))

    def _tell(self, failed: list[tuple[int, SlotFailure]]) -> None:
        """Send each ``(slot index, failure)`` to that slot's agent now."""
        for i, failure in failed:
            conn = self._sockets.get(i)
            if conn is not None:
                fail(conn, failure)

    def _rebuild_soon(self) -> None:
        """Rebuild the envs that raised (on the main thread, in turn with resets and steps)."""
        if self._rebuild_task is None or self._rebuild_task.done():
            self._rebuild_task = asyncio.ensure_future(self._rebuild())

    async def _rebuild(self) -> None:
        async with self._sim_gate:
            for i in self.engine.faults.to_rebuild():
                try:
                    await self._sim_call(self.sim.rebuild_slot, i)
                except Exception:  # noqa: BLE001 - the slot is retired; the others go on
                    self.engine.faults.rebuilt(i, traceback.format_exc())
                else:
                    self.engine.faults.rebuilt(i, None)
        async with self._slot_changed:
            self._slot_changed.notify_all()  # claims waiting for a slot: one may be back in service

    def _owned(self, conn: Any, token: Any) -> Slot:
        try:
            return self.engine.owned(conn.id, token)
        except SlotError as exc:
            raise RpcError(str(exc)) from None

    async def _rpc_result(self, conn: Any, token: Any) -> dict[str, Any]:
        slot = self._owned(conn, token)
        result = self.engine.grade(slot)
        await self._free(slot, "episode graded")
        return result

    async def _rpc_release(self, conn: Any, token: Any) -> dict[str, Any]:
        slot = self._owned(conn, token)
        await self._free(slot, "token released")
        return {"released": True, "slot": slot.index}

    async def _on_control_close(self, conn: Any) -> None:
        for slot in self.engine.owned_by(conn.id):
            await self._free(slot, "the control connection that claimed this slot closed")

    async def _free(self, slot: Slot, why: str) -> None:
        ws = self._sockets.pop(slot.index, None)
        awaiting = slot.state is SlotState.LIVE and slot.pending_action is not None
        failure = self.engine.release(slot, why)
        if ws is not None:  # an agent waiting for an observation reads why, as a text frame
            if awaiting:
                fail(ws, failure)
            else:
                ws.close(1000, close_reason(why))
        async with self._slot_changed:
            self._slot_changed.notify_all()
        self._maybe_tick()  # a released slot may have been the one the tick waited for
