"""The bridge's serving side: control channel, slot WebSockets and the tick loop.

Runs on an asyncio loop in a background thread. Every sim touch is queued to the main thread
through ``submit`` (see :mod:`pytest_hud.sim.mainthread`) and serialised by one lock, so a slot's
reset can never interleave with a batched step.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from ..contract import ContractError
from ..rpc import RpcError, RpcServer
from ..wire import MAX_FRAME_BYTES, WireError, packb, unpackb
from .base import VectorSim
from .slots import Slot, SlotError, SlotRegistry, SlotState

__all__ = ["Timeouts", "BridgeServer"]

PROTOCOL = "pytest-hud/control/1"


@dataclass
class Timeouts:
    """Seconds a bridge waits for each thing before failing the slot that is late."""

    claim: float = 30.0  # WebSocket connect → claim frame
    first_action: float = 300.0  # first observation → first action (model warm-up)
    step: float = 30.0  # observation → next action
    wait_slot: float = 600.0  # reset() waiting for a free slot or the next wave


class _SlotFailed(Exception):
    """Raised into a slot's waiter when its episode fails (the message goes to the agent)."""


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
    ) -> None:
        self.sim = sim
        self._submit = submit
        self.secret = secret
        self.host = host
        self.timeouts = timeouts or Timeouts()
        if hold not in ("zeros", "repeat"):
            raise ValueError(f"hold must be 'zeros' or 'repeat', got {hold!r}")
        self.hold = hold
        self.build_args = dict(build_args or {})
        self.target = target
        self.contract = sim.contract()
        self.contract_dict = self.contract.to_dict()
        self.registry = SlotRegistry(sim.width)
        self.broken: str | None = None
        self.started = time.monotonic()
        self.ticks = 0
        self.slot_steps = 0
        self.episodes = 0
        self._wave_mode = not sim.supports_slot_reset
        self._wave_gather_s = wave_gather_s
        self._sim_lock = asyncio.Lock()
        self._slot_changed = asyncio.Condition()
        self._waiters: dict[int, asyncio.Future] = {}
        self._sockets: dict[int, ServerConnection] = {}
        self._first_obs: dict[int, dict[str, np.ndarray]] = {}
        self._tick_task: asyncio.Task | None = None
        self._ticking = False
        self._wave_task: asyncio.Task | None = None
        hold_action = np.asarray(sim.hold_action())
        self._hold_action = hold_action
        self._action_batch_shape = (sim.width,) + hold_action.shape
        self._action_dtype = hold_action.dtype
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
        return await asyncio.wrap_future(self._submit(fn, *args))

    def _hello_info(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL,
            "width": self.registry.width,
            "ws": self.ws_port,
            "pid": os.getpid(),
            "target": self.target,
            "build": self.build_args,
            "wave": self._wave_mode,
        }

    # --------------------------------------------------------------- control
    async def _rpc_contract(self, conn: Any) -> dict[str, Any]:
        return self.contract_dict

    async def _rpc_stats(self, conn: Any) -> dict[str, Any]:
        return {
            "width": self.registry.width,
            "pid": os.getpid(),
            "target": self.target,
            "build": self.build_args,
            "broken": self.broken,
            "ticks": self.ticks,
            "env_steps": self.ticks * self.registry.width,
            "slot_steps": self.slot_steps,
            "episodes": self.episodes,
            "uptime_s": time.monotonic() - self.started,
            "slots": self.registry.snapshot(),
            "wave": self._wave_mode,
        }

    def _check_task(self, task: dict[str, Any]) -> None:
        build = task.pop("build", None) or {}
        if not isinstance(build, dict):
            raise RpcError("build must be an object of env-defining arguments")
        if json.dumps(build, sort_keys=True) != json.dumps(self.build_args, sort_keys=True):
            raise RpcError(
                f"this bridge was built with {self.build_args!r} but the claim asks for {build!r}; "
                "env-defining arguments must match across a bridge's slots, so claim on another "
                "bridge (the pytest plugin's pool routes such claims for you)"
            )
        seed = task.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise RpcError(f"seed must be a non-negative integer or null, got {seed!r}")
        options = task.get("options")
        if options is not None and not isinstance(options, dict):
            raise RpcError(f"options must be an object or null, got {type(options).__name__}")
        prompt = task.get("prompt")
        if prompt is not None and not isinstance(prompt, str):
            raise RpcError(f"prompt must be a string or null, got {type(prompt).__name__}")

    async def _rpc_reset(self, conn: Any, **task: Any) -> dict[str, Any]:
        self._check_task(task)
        deadline = time.monotonic() + self.timeouts.wait_slot
        async with self._slot_changed:
            while True:
                if self.broken:
                    raise RpcError(f"bridge is broken: {self.broken.splitlines()[-1]}; the pool will replace it")
                busy = any(s.state in (SlotState.LIVE, SlotState.DONE) for s in self.registry.slots)
                if self.registry.free_slots() and not (self._wave_mode and busy):
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RpcError(
                        f"no slot of {self.registry.width} became free within "
                        f"{self.timeouts.wait_slot:.0f} s; raise --hud-width or release tokens"
                    )
                try:
                    await asyncio.wait_for(self._slot_changed.wait(), remaining)
                except asyncio.TimeoutError:
                    continue
            slot = self.registry.claim(conn.id, task)
        if self._wave_mode:
            await self._join_wave(slot)
        return {"token": slot.token, "slot": slot.index, "prompt": slot.prompt}

    async def _join_wave(self, slot: Slot) -> None:
        """Wave fallback: wait for the next global reset, which gathers every pending claim."""
        if self._wave_task is None or self._wave_task.done():
            self._wave_task = asyncio.ensure_future(self._run_wave())
        await asyncio.shield(self._wave_task)
        if slot.index not in self._first_obs:
            raise RpcError(f"slot {slot.index} missed its wave reset: {slot.error}")

    async def _run_wave(self) -> None:
        await asyncio.sleep(self._wave_gather_s)
        async with self._sim_lock:
            claimed = [s for s in self.registry.slots if s.state is SlotState.CLAIMED]
            if not claimed:
                return
            await self._reset_slots(claimed)

    async def _reset_slots(self, slots: list[Slot]) -> None:
        idx = [s.index for s in slots]
        try:
            flags, rows = await self._sim_call(
                _reset_and_observe, self.sim, idx, [s.seed for s in slots], [s.options for s in slots]
            )
        except Exception:
            self._mark_broken(traceback.format_exc())
            raise RpcError(f"sim raised during reset: {self.broken.splitlines()[-1]}") from None
        for pos, (s, flag) in enumerate(zip(slots, flags)):
            s.success_at_reset = bool(flag)
            s.needs_park_reset = False
            self._first_obs[s.index] = {k: v[pos] for k, v in rows.items()}
        if self._wave_mode:
            for s in self.registry.slots:
                s.needs_park_reset = False

    def _owned(self, conn: Any, token: Any) -> Slot:
        try:
            slot = self.registry.by_token(token)
        except SlotError as exc:
            raise RpcError(str(exc)) from None
        if slot.owner != conn.id:
            raise RpcError("this token was minted on another connection; only its owner may use it")
        return slot

    async def _rpc_result(self, conn: Any, token: Any) -> dict[str, Any]:
        slot = self._owned(conn, token)
        result = slot.result()
        result["prompt"] = slot.prompt
        result["task"] = {k: v for k, v in slot.task.items() if k != "options"}
        await self._free(slot, "episode graded")
        self.episodes += 1
        return result

    async def _rpc_release(self, conn: Any, token: Any) -> dict[str, Any]:
        slot = self._owned(conn, token)
        await self._free(slot, "token released")
        return {"released": True, "slot": slot.index}

    async def _on_control_close(self, conn: Any) -> None:
        for slot in [s for s in self.registry.slots if s.owner == conn.id and s.state is not SlotState.FREE]:
            await self._free(slot, "the control connection that claimed this slot closed")

    async def _free(self, slot: Slot, why: str) -> None:
        was_live = slot.state is SlotState.LIVE
        ws = self._sockets.pop(slot.index, None)
        waiter = self._waiters.pop(slot.index, None)
        if waiter is not None and not waiter.done():
            waiter.set_exception(_SlotFailed(f"slot {slot.index} released: {why}"))
        self._first_obs.pop(slot.index, None)
        self.registry.release(slot)
        if ws is not None:
            asyncio.ensure_future(ws.close(1000, _close_reason(why)))
        async with self._slot_changed:
            self._slot_changed.notify_all()
        if was_live:
            self._maybe_tick()

    # ------------------------------------------------------------- websocket
    async def _serve_ws(self, ws: ServerConnection) -> None:
        slot: Slot | None = None
        try:
            await ws.send(packb({"claim_required": True, "width": self.registry.width,
                                 "contract": self.contract_dict}))
            try:
                async with asyncio.timeout(self.timeouts.claim):
                    raw = await ws.recv()
            except TimeoutError:
                await _fail(ws, f"no claim frame within {self.timeouts.claim:.0f} s; send {{'claim': TOKEN}}")
                return
            slot = await self._bind(ws, raw)
            if slot is None:
                return
            await self._drive(ws, slot)
        except ConnectionClosed:
            pass
        finally:
            if slot is not None and self._sockets.get(slot.index) is ws:
                self._sockets.pop(slot.index, None)
                if slot.state is SlotState.LIVE:
                    # A clean close is an agent that stopped (max_steps, should_stop); anything
                    # else (a killed worker, a dropped socket) is an error.
                    rcvd = ws.protocol.close_rcvd
                    clean = rcvd is not None and rcvd.code in (1000, 1001)
                    self._end_slot(slot, error=None if clean else
                                   f"slot {slot.index}: agent disconnected mid-episode")
                    self._maybe_tick()

    async def _bind(self, ws: ServerConnection, raw: Any) -> Slot | None:
        if isinstance(raw, str):
            await _fail(ws, "the claim frame must be binary msgpack {'claim': TOKEN}")
            return None
        try:
            msg = unpackb(raw)
            if not isinstance(msg, dict) or "claim" not in msg:
                raise WireError("the first frame must be {'claim': TOKEN}")
            slot = self.registry.resolve_claim(msg["claim"])
        except (WireError, SlotError) as exc:
            await _fail(ws, str(exc))
            return None
        if self.broken:
            await _fail(ws, f"bridge is broken: {self.broken.splitlines()[-1]}")
            return None
        slot.connected = True
        self._sockets[slot.index] = ws
        if not self._wave_mode:
            async with self._sim_lock:
                try:
                    await self._reset_slots([slot])
                except RpcError as exc:
                    self._end_slot(slot, error=exc.message)
                    await _fail(ws, exc.message)
                    return None
        obs = self._first_obs.pop(slot.index, None)
        if obs is None:
            await _fail(ws, f"slot {slot.index} has no first observation (its reset failed)")
            return None
        slot.state = SlotState.LIVE
        await ws.send(self._frame(obs, reward=0.0, done=False, truncated=False, success=False))
        return slot

    async def _drive(self, ws: ServerConnection, slot: Slot) -> None:
        loop = asyncio.get_running_loop()
        timeout = self.timeouts.first_action
        what = "first action"
        while slot.state is SlotState.LIVE:
            try:
                async with asyncio.timeout(timeout):
                    raw = await ws.recv()
            except TimeoutError:
                message = (
                    f"slot {slot.index} sent no {what} within {timeout:g} s "
                    f"({'--hud-first-action-timeout' if what == 'first action' else '--hud-step-timeout'}); "
                    "its peers continue"
                )
                self._end_slot(slot, error=message)
                self._maybe_tick()
                await _fail(ws, message)
                return
            if slot.state is not SlotState.LIVE:
                break
            try:
                action = self._parse_action(raw)
            except (WireError, ContractError) as exc:
                message = f"slot {slot.index}: {exc}"
                self._end_slot(slot, error=message)
                self._maybe_tick()
                await _fail(ws, message)
                return
            waiter = loop.create_future()
            self._waiters[slot.index] = waiter
            slot.pending_action = action
            if not self._ticking and self.registry.ready_to_step():
                await self._tick()  # the last slot to act runs the tick itself: no extra task
            try:
                frame = await waiter
            except _SlotFailed as exc:
                await _fail(ws, str(exc))
                return
            await ws.send(frame)
            timeout, what = self.timeouts.step, "action"
        # Episode over: stay connected until the agent hangs up or the slot is released.
        async for raw in ws:
            await _fail(ws, f"slot {slot.index}: the episode is over; call result(token)")
            return

    def _parse_action(self, raw: Any) -> np.ndarray:
        if isinstance(raw, str):
            raise WireError("action frames must be binary msgpack, not text")
        msg = unpackb(raw)
        if not isinstance(msg, dict) or "actions" not in msg:
            raise WireError(f"an action frame is {{'actions': array}}, got {_describe(msg)}")
        try:
            return self.contract.coerce_action(msg["actions"])
        except ContractError:
            raise
        except Exception as exc:  # noqa: BLE001 - numpy refuses some values (ragged lists): the agent's error
            raise WireError(f"the action is not an array of numbers ({type(exc).__name__}: {exc})") from None

    def _end_slot(self, slot: Slot, error: str | None = None) -> None:
        if slot.state is SlotState.LIVE or slot.state is SlotState.CLAIMED:
            slot.state = SlotState.DONE
        if error and not slot.error:
            slot.error = error
        slot.pending_action = None

    # ------------------------------------------------------------------ tick
    def _maybe_tick(self) -> None:
        if not self._ticking and self.registry.ready_to_step():
            self._tick_task = asyncio.ensure_future(self._tick())

    async def _tick(self) -> None:
        self._ticking = True
        try:
            async with self._sim_lock:
                if not self.registry.ready_to_step() or self.broken:
                    return
                if self._wave_mode and any(
                    s.state is SlotState.CLAIMED for s in self.registry.slots
                ):
                    return  # a reset slot whose agent has not dialed yet must not be stepped
                await self._step_once()
        finally:
            self._ticking = False
        self._maybe_tick()

    async def _step_once(self) -> None:
        slots = self.registry.slots
        park = [s.index for s in slots if s.needs_park_reset and s.state is not SlotState.LIVE]
        actions = np.empty(self._action_batch_shape, self._action_dtype)
        acting: list[Slot] = []
        for s in slots:
            if s.state is SlotState.LIVE and s.pending_action is not None:
                actions[s.index] = s.pending_action
                acting.append(s)
            elif self.hold == "repeat" and s.last_action is not None:
                actions[s.index] = s.last_action
            else:
                actions[s.index] = self._hold_action
        try:
            batch, obs = await self._sim_call(_park_step_observe, self.sim, park, actions)
        except Exception:
            self._mark_broken(traceback.format_exc())
            # the exception's own line first: it is what a summary line or a report shows
            why = f"sim raised during step: {self.broken.splitlines()[-1]}\n{self.broken}"
            for s in acting:
                self._end_slot(s, error=why)
                waiter = self._waiters.pop(s.index, None)
                if waiter is not None and not waiter.done():
                    waiter.set_exception(_SlotFailed(f"slot {s.index}: {why}"))
            return
        for i in park:
            slots[i].needs_park_reset = False
        self.ticks += 1
        self.slot_steps += len(acting)
        ended = batch.terminated | batch.truncated
        for s in slots:
            if ended[s.index]:
                s.needs_park_reset = True
        for s in acting:
            i = s.index
            s.steps += 1
            s.total_reward += float(batch.rewards[i])
            if batch.success[i]:
                s.success = True
            if batch.score is not None and not np.isnan(batch.score[i]):
                s.score = float(batch.score[i])
            s.last_action, s.pending_action = s.pending_action, None
            done = bool(ended[i])
            if done:
                s.terminated, s.truncated = bool(batch.terminated[i]), bool(batch.truncated[i])
                s.state = SlotState.DONE
            frame = self._frame(
                {k: v[i] for k, v in obs.items()},
                reward=float(batch.rewards[i]),
                done=done,
                truncated=bool(batch.truncated[i]),
                success=s.success,
            )
            waiter = self._waiters.pop(i, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(frame)

    def _frame(self, obs: dict[str, np.ndarray], *, reward: float, done: bool, truncated: bool,
               success: bool) -> bytes:
        out: dict[str, Any] = dict(obs)
        out["reward"] = np.float32(reward)
        out["terminated"] = done
        out["truncated"] = truncated
        out["success"] = success
        return packb(out)

    def _mark_broken(self, tb: str) -> None:
        if not self.broken:
            self.broken = tb.strip()


# ----------------------------------------------------------- main-thread work
def _reset_and_observe(sim: VectorSim, idx, seeds, options):
    if len({json.dumps(o, sort_keys=True, default=str) for o in options}) > 1:
        # options differ: one reset call per slot keeps each slot's options its own
        flags = np.concatenate([sim.reset_slots([i], [s], [o]) for i, s, o in zip(idx, seeds, options)])
    else:
        flags = sim.reset_slots(idx, seeds, options)
    return flags, {k: v[idx] for k, v in sim.observe().items()}  # fancy indexing copies the rows


def _park_step_observe(sim: VectorSim, park: list[int], actions: np.ndarray):
    if park:
        sim.reset_slots(park, [None] * len(park), [None] * len(park))
    batch = sim.step(actions)
    return batch, sim.observe()


async def _fail(ws: ServerConnection, message: str) -> None:
    """Send a readable error as a text frame, then close (DESIGN §4)."""
    try:
        await ws.send(message)
        await ws.close(1011 if "sim raised" in message else 1008, _close_reason(message))
    except ConnectionClosed:
        pass


def _close_reason(message: str) -> str:
    """The start of ``message`` that fits a close frame: 123 bytes of UTF-8, not 123 characters."""
    return message.encode(errors="replace")[:123].decode(errors="ignore")


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return f"a map with keys {sorted(map(str, value))[:8]}"
    return type(value).__name__

