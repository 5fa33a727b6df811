"""The bridge's I/O shell: the control channel, the slot WebSockets and the sim calls.

Runs on an asyncio loop in a background thread. What happens to a slot (claims, ticks, holds,
timeouts, failures) is decided by :class:`~.engine.BridgeEngine`; this module decodes frames, asks
the engine, runs the sim calls it plans on the main thread through ``submit(loop, fn, *args)``
(an awaitable answer; see :mod:`pytest_hud.sim.mainthread`), serialised by one lock so a slot's
reset can never interleave with a batched step, and sends back what the engine answers. The tick
writes every acting slot's observation itself, and one timer watches all deadlines: the per-step
path has one wake-up per tick, not one per slot.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.protocol import State

from ..rpc import RpcError, RpcServer
from ..wire import MAX_FRAME_BYTES, WireError, packb, unpackb
from .base import VectorSim
from .engine import DEFAULT_TICK_WINDOW, BridgeEngine, Handshake, ResetPlan, Timeouts, resolve_tick
from .failures import BadAction, BadClaim, NoFirstObservation, SimFailed, SlotError, SlotFailure, TaskError
from .slots import Slot, SlotState

__all__ = ["Timeouts", "BridgeServer", "close_code"]

PROTOCOL = "pytest-hud/control/1"
_LATE = object()  # what _next_frame returns once the engine has failed the one waiting for lateness


def close_code(failure: SlotFailure) -> int:
    """The WebSocket close code after ``failure``'s error frame: 1011 for a sim fault, else 1008."""
    return 1011 if isinstance(failure, SimFailed) else 1008


class BridgeServer:
    def __init__(
        self,
        sim: VectorSim,
        submit: Callable[..., Any],
        *,
        secret: str,
        host: str = "127.0.0.1",
        timeouts: Timeouts | None = None,
        hold: str = "zeros",
        build_args: dict[str, Any] | None = None,
        target: str = "",
        wave_gather_s: float = 0.05,
        tick: str = "auto",
        tick_window: float = DEFAULT_TICK_WINDOW,
    ) -> None:
        self.sim = sim
        self._submit = submit
        self.secret = secret
        self.host = host
        self.target = target
        self.contract = sim.contract()
        self.contract_dict = self.contract.to_dict()
        tick = resolve_tick(tick, slot_step=sim.supports_slot_step, slot_reset=sim.supports_slot_reset)
        self.engine = BridgeEngine(sim.width, self.contract, sim.hold_action(), hold=hold,
                                   wave=not sim.supports_slot_reset, timeouts=timeouts,
                                   build_args=build_args, tick=tick, tick_window=tick_window,
                                   tasks=tuple(getattr(sim, "tasks", ()) or ()))
        self.started = time.monotonic()
        self._wave_gather_s = wave_gather_s
        self._sim_lock = asyncio.Lock()
        self._slot_changed = asyncio.Condition()
        self._deadline: tuple[float, asyncio.TimerHandle] | None = None  # (due, its timer)
        self._sockets: dict[int, ServerConnection] = {}
        self._tick_task: asyncio.Task | None = None
        self._ticking = False
        self._window: tuple[float, asyncio.TimerHandle] | None = None  # ready mode: (due, its timer)
        self._wave_task: asyncio.Task | None = None
        self.rpc = RpcServer(
            {
                "contract": self._rpc_contract,
                "reset": self._rpc_reset,
                "result": self._rpc_result,
                "release": self._rpc_release,
                "stats": self._rpc_stats,
            },
            secret,
            on_close=self._on_control_close,
            hello_info=self._hello_info,
        )
        self.control_port = 0
        self.ws_port = 0
        self._ws_server: Any = None

    # ------------------------------------------------------------- lifecycle
    async def start(self, control_port: int = 0, ws_port: int = 0) -> None:
        self.control_port = await self.rpc.start(self.host, control_port)
        self._ws_server = await serve(
            self._serve_ws,
            self.host,
            ws_port,
            compression=None,
            max_size=MAX_FRAME_BYTES,
            ping_interval=None,  # ticks may legitimately pause for minutes (model warm-up)
        )
        self.ws_port = self._ws_server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        await self.rpc.close()
        if self._ws_server is not None:
            self._ws_server.close()

    async def _sim_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await self._submit(asyncio.get_running_loop(), fn, *args)

    def _hello_info(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL,
            "width": self.engine.width,
            "ws": self.ws_port,
            "pid": os.getpid(),
            "target": self.target,
            "build": self.engine.build_args,
            "wave": self.engine.wave,
            "tick": self.engine.tick,
            "tasks": list(self.engine.tasks),
        }

    # --------------------------------------------------------------- control
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
            "ticks": engine.ticks,
            "env_steps": engine.env_steps,
            "slot_steps": engine.slot_steps,
            "episodes": engine.episodes,
            "uptime_s": time.monotonic() - self.started,
            "slots": engine.snapshot(),
            "wave": engine.wave,
            "tick": engine.tick,
            "tasks": list(engine.tasks),
            "sim": _sim_stats(self.sim),
        }

    async def _rpc_reset(self, conn: Any, **task: Any) -> dict[str, Any]:
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
                except asyncio.TimeoutError:
                    continue
            slot = engine.claim(conn.id, task)
        if engine.wave:
            await self._join_wave(slot)
        return {"token": slot.token, "slot": slot.index, "prompt": slot.prompt}

    async def _join_wave(self, slot: Slot) -> None:
        """Wave fallback: wait for the next global reset, which gathers every pending claim."""
        if self._wave_task is None or self._wave_task.done():
            self._wave_task = asyncio.ensure_future(self._run_wave())
        await asyncio.shield(self._wave_task)
        if slot.first_obs is None:
            raise RpcError(f"slot {slot.index} missed its wave reset: {slot.error}")

    async def _run_wave(self) -> None:
        await asyncio.sleep(self._wave_gather_s)
        async with self._sim_lock:
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
        """Run ``plan`` on the main thread; a sim exception breaks the bridge (raises :class:`SimFailed`)."""
        try:
            flags, rows = await self._sim_call(
                _reset_and_observe, self.sim, plan.indices, plan.seeds, plan.options, plan.tasks
            )
        except Exception:
            raise self.engine.reset_failed(plan, traceback.format_exc()) from None
        self.engine.apply_reset(plan, flags, rows)

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
            asyncio.ensure_future(_fail(ws, failure) if awaiting else ws.close(1000, _close_reason(why)))
        async with self._slot_changed:
            self._slot_changed.notify_all()
        self._maybe_tick()  # a released slot may have been the one the tick waited for

    # ------------------------------------------------------------- websocket
    async def _serve_ws(self, ws: ServerConnection) -> None:
        slot: Slot | None = None
        handshake: Handshake | None = None
        try:
            await ws.send(packb({"claim_required": True, "width": self.engine.width,
                                 "contract": self.contract_dict}))
            handshake = self.engine.open(time.monotonic())
            raw = await self._next_frame(ws, handshake)
            if raw is _LATE:
                await _fail(ws, handshake.failure)
                return
            slot = await self._bind(ws, handshake, raw)
            if slot is not None:
                await self._drive(ws, slot)
        except ConnectionClosed:
            pass
        finally:
            if handshake is not None:
                self.engine.hang_up(handshake)
            if slot is not None and self._sockets.get(slot.index) is ws:
                self._sockets.pop(slot.index, None)
                rcvd = ws.protocol.close_rcvd
                self.engine.disconnect(slot, clean=rcvd is not None and rcvd.code in (1000, 1001))
                self._maybe_tick()

    async def _next_frame(self, ws: ServerConnection, waiting: Handshake) -> Any:
        """The agent's claim frame, or ``_LATE`` once the engine has failed ``waiting`` for lateness."""
        while waiting.deadline is not None:
            try:
                async with asyncio.timeout(waiting.deadline - time.monotonic()):
                    return await ws.recv()
            except TimeoutError:
                self._expire()
        return _LATE

    async def _bind(self, ws: ServerConnection, handshake: Handshake, raw: Any) -> Slot | None:
        try:
            if isinstance(raw, str):
                raise BadClaim("the claim frame must be binary msgpack {'claim': TOKEN}")
            try:
                claim = unpackb(raw)
            except WireError as exc:
                raise BadClaim(str(exc)) from None
            slot = self.engine.bind(handshake, claim)
        except SlotFailure as failure:
            await _fail(ws, failure)
            return None
        self._sockets[slot.index] = ws
        try:
            if not self.engine.wave:  # per-slot reset, with the claim's seed, now that its agent is here
                async with self._sim_lock:
                    await self._reset(self.engine.plan_reset([slot]))
            frame = self.engine.start(slot, time.monotonic())
        except (SimFailed, NoFirstObservation) as failure:
            await _fail(ws, failure)
            return None
        self._arm_deadline()  # its first-action clock
        await ws.send(packb(frame))
        return slot

    async def _drive(self, ws: ServerConnection, slot: Slot) -> None:
        """Read this slot's actions until its episode ends; the tick sends its observations.

        Nothing waits here for an observation: the tick writes every acting slot's frame itself
        (one wake-up per tick, not one per slot), and the bridge's deadline timer fails a late
        slot (see :meth:`_arm_deadline`).
        """
        token = slot.token
        engine = self.engine
        while True:
            raw = await ws.recv()
            if slot.token != token:
                return  # released: _free closes the socket
            if slot.state is not SlotState.LIVE:
                if slot.failure is None:  # the episode is over: stay connected until the agent hangs up
                    await _fail(ws, engine.late_frame(slot))
                return  # a failed slot is told by whoever failed it (the tick, the deadline timer)
            try:
                if isinstance(raw, str):
                    raise WireError("action frames must be binary msgpack, not text")
                if slot.pending_action is not None:
                    raise WireError("an action arrived before the observation of the previous one; "
                                    "send one action per observation")
                engine.submit_action(slot, unpackb(raw), time.monotonic())
            except (WireError, BadAction) as exc:
                failure = exc if isinstance(exc, BadAction) else engine.refuse_action(slot, str(exc))
                self._maybe_tick()
                await _fail(ws, failure)
                return
            if not self._ticking and engine.ready_to_step(time.monotonic()):
                await self._tick()  # the last slot to act runs the tick itself: no extra task
            elif not self._ticking:
                self._arm_window()

    # -------------------------------------------------------------- deadlines
    def _arm_deadline(self) -> None:
        """Keep one timer at the earliest deadline of any LIVE slot (not one timer per receive)."""
        due = min((s.deadline for s in self.engine.slots if s.deadline is not None), default=None)
        if due is None or (self._deadline is not None and self._deadline[0] <= due):
            return
        if self._deadline is not None:
            self._deadline[1].cancel()
        delay = max(0.0, due - time.monotonic())
        self._deadline = (due, asyncio.get_running_loop().call_later(delay, self._deadline_passed))

    def _deadline_passed(self) -> None:
        self._deadline = None
        self._expire()
        self._arm_deadline()

    def _expire(self) -> None:
        """Fail every slot and handshake past its deadline; a failed slot no longer holds its peers."""
        for late, failure in self.engine.expire(time.monotonic()):
            ws = self._sockets.get(late.index) if isinstance(late, Slot) else None
            if ws is not None:
                asyncio.ensure_future(_fail(ws, failure))
        self._maybe_tick()

    # ------------------------------------------------------------------ tick
    def _maybe_tick(self) -> None:
        if self._ticking:
            return
        if self.engine.ready_to_step(time.monotonic()):
            self._tick_task = asyncio.ensure_future(self._tick())
        else:
            self._arm_window()

    def _arm_window(self) -> None:
        """Ready mode: wake up when the first pending action's tick window closes."""
        due = self.engine.tick_due()
        if due is None or (self._window is not None and self._window[0] <= due):
            return
        if self._window is not None:
            self._window[1].cancel()
        delay = max(0.0, due - time.monotonic())
        self._window = (due, asyncio.get_running_loop().call_later(delay, self._window_closed))

    def _window_closed(self) -> None:
        self._window = None
        self._maybe_tick()

    async def _tick(self) -> None:
        self._ticking = True
        try:
            async with self._sim_lock:
                plan = self.engine.plan_tick(time.monotonic())
                if plan is None:
                    return
                try:
                    batch, obs = await self._sim_call(_park_step_observe, self.sim, plan.park, plan.actions,
                                                      plan.mask)
                except Exception:
                    for i, failure in self.engine.step_failed(plan, traceback.format_exc()):
                        ws = self._sockets.get(i)
                        if ws is not None:
                            asyncio.ensure_future(_fail(ws, failure))
                    return
                # packed under the lock: ``obs`` may be the sim's own buffers, which its next call reuses
                sockets = self._sockets
                for i, frame in self.engine.apply_batch(plan, batch, obs, time.monotonic()):
                    ws = sockets.get(i)
                    if ws is not None:
                        _send_now(ws, packb(frame))
        finally:
            self._ticking = False
        self._arm_deadline()
        self._maybe_tick()


# ----------------------------------------------------------- main-thread work
def _reset_and_observe(sim: VectorSim, idx, seeds, options, tasks=None):
    if tasks is not None:  # a multi-task sim takes each slot's task (and options) itself
        flags = sim.reset_slots(idx, seeds, options, tasks=tasks)
    elif len({json.dumps(o, sort_keys=True, default=str) for o in options}) > 1:
        # options differ: one reset call per slot keeps each slot's options its own
        flags = np.concatenate([sim.reset_slots([i], [s], [o]) for i, s, o in zip(idx, seeds, options)])
    else:
        flags = sim.reset_slots(idx, seeds, options)
    return flags, {k: v[idx] for k, v in sim.observe().items()}  # fancy indexing copies the rows


def _park_step_observe(sim: VectorSim, park: list[int], actions: np.ndarray, mask: np.ndarray | None = None):
    if park:
        if getattr(sim, "tasks", ()):  # a None task: the episode is over, idle until the next claim
            sim.reset_slots(park, [None] * len(park), [None] * len(park), tasks=[None] * len(park))
        else:
            sim.reset_slots(park, [None] * len(park), [None] * len(park))
    batch = sim.step(actions) if mask is None else sim.step_slots(actions, mask)  # mask: ready mode
    return batch, sim.observe()


def _send_now(ws: ServerConnection, data: bytes) -> None:
    """Write one binary message to ``ws`` now, from the tick, without a task or an await.

    websockets' sans-I/O ``protocol`` frames it and ``send_data`` hands it to the transport: what
    ``ws.send`` does, minus its async context and its wait for the write buffer to drain. Lockstep
    bounds that buffer (an agent gets one observation per action), and a slow reader must not
    hold the tick of its peers. A closing connection is skipped: its reader learns why elsewhere.
    """
    if ws.protocol.state is not State.OPEN:
        return
    try:
        ws.protocol.send_binary(data)
        ws.send_data()
    except Exception:  # noqa: BLE001 - the transport broke: its reader sees the connection close
        ws.transport.abort()


def _sim_stats(sim: VectorSim) -> Any:
    """The sim's own counters when it keeps any (``stats()``, e.g. a multi-task sim's env builds)."""
    stats = getattr(sim, "stats", None)
    try:
        return stats() if callable(stats) else None
    except Exception:  # noqa: BLE001 - counters are informational
        return None


async def _fail(ws: ServerConnection, failure: SlotFailure) -> None:
    """Send a readable error as a text frame, then close (DESIGN §4)."""
    message = str(failure)
    try:
        await ws.send(message)
        await ws.close(close_code(failure), _close_reason(message))
    except ConnectionClosed:
        pass


def _close_reason(message: str) -> str:
    """The start of ``message`` that fits a close frame: 123 bytes of UTF-8, not 123 characters."""
    return message.encode(errors="replace")[:123].decode(errors="ignore")
