"""The bridge's control channel: the JSON-RPC handlers that claim, grade, release and rebuild its slots.

:class:`ControlChannel` holds what the control calls need and nothing else: the sim and the
engine, the sim gate and the call that runs a sim call on the main thread (so resets and env
rebuilds take turns with the tick), the slot sockets (the server's map, shared: a released slot's
agent is told), and its own state (the condition claims wait on, the wave and rebuild tasks). Its
handlers are ``claim`` (also ``reset``; in wave mode the global reset it waits for), ``result``
and ``release``, and what a closed control connection frees; the server (:mod:`.server`) adds
``contract`` and ``stats``, and uses :meth:`ControlChannel.reset`, :meth:`ControlChannel.tell` and
:meth:`ControlChannel.rebuild_soon` on the slot WebSocket path.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

from pytest_hud.wire.rpc import RpcError
from pytest_hud.sim.base import VectorSim
from pytest_hud.bridge.closing import close_reason, fail
from pytest_hud.bridge.engine import BridgeEngine, ResetPlan
from pytest_hud.bridge.exceptions import SimFailed, SlotError, SlotFailure, TaskError
from pytest_hud.bridge.simcalls import explain, reset_and_observe
from pytest_hud.bridge.simgate import SimGate
from pytest_hud.bridge.slots import Slot, SlotState
from pytest_hud.bridge.wsserver import WsConnection

__all__ = ["ControlChannel"]


class ControlChannel:
    """The control channel's RPC handlers and the resets and rebuilds they run (see the module
    docstring). ``sim_call(fn, *args)`` runs a sim call on the main thread; ``slot_freed()`` is
    called once a slot is released (the tick may have waited for it)."""

    def __init__(self, sim: VectorSim, engine: BridgeEngine, gate: SimGate,
                 sim_call: Callable[..., Awaitable[Any]], sockets: dict[int, WsConnection], *,
                 slot_freed: Callable[[], None], wave_gather_s: float = 0.05) -> None:
        self.sim = sim
        self.engine = engine
        self._sim_gate = gate
        self._sim_call = sim_call
        self._sockets = sockets
        self._slot_freed = slot_freed
        self._wave_gather_s = wave_gather_s
        self._slot_changed = asyncio.Condition()  # claims waiting for a free slot, or a wave
        self._wave_task: asyncio.Task | None = None
        self._rebuild_task: asyncio.Task | None = None

    def handlers(self) -> dict[str, Callable[..., Awaitable[Any]]]:
        """The JSON-RPC methods this channel answers, by name."""
        return {"claim": self._rpc_claim,
                "reset": self._rpc_claim,  # the call's first name, for clients written to it
                "result": self._rpc_result,
                "release": self._rpc_release}

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
                await self.reset(plan)
            except SimFailed as failure:
                async with self._slot_changed:
                    self._slot_changed.notify_all()  # claims waiting for the next wave hear it is broken
                raise RpcError(str(failure)) from None

    async def reset(self, plan: ResetPlan) -> None:
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
            self.tell(ended)
            raise failure from None
        if not faults:
            for i in plan.rebuild:
                engine.faults.rebuilt(i, None)
            engine.apply_reset(plan, flags, rows)
            return
        if not engine.isolates:  # a sim that says it isolates slots but does not: broken, as above
            failure, ended = engine.reset_failed(plan, explain("\n".join(faults.values())))
            self.tell(ended)
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
        self.rebuild_soon()
        if failed:
            raise next(iter(failed.values()))

    def tell(self, failed: list[tuple[int, SlotFailure]]) -> None:
        """Send each ``(slot index, failure)`` to that slot's agent now."""
        for i, failure in failed:
            conn = self._sockets.get(i)
            if conn is not None:
                fail(conn, failure)

    def rebuild_soon(self) -> None:
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

    async def on_control_close(self, conn: Any) -> None:
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
        self._slot_freed()  # a released slot may have been the one the tick waited for
