"""The bridge's I/O shell: the slot WebSockets and the tick, on top of the control channel's handlers.

Runs on an asyncio loop in a background thread. What happens to a slot (claims, ticks, holds,
timeouts, failures) is decided by :class:`~.engine.BridgeEngine`; this module decodes frames, asks
the engine, runs the sim calls it plans (:mod:`.simcalls`) on the main thread through
``submit(loop, fn, *args)`` (an awaitable answer; see :mod:`pytest_hud.bridge.mainthread`),
serialised by one gate (:mod:`.simgate`) so a slot's reset can never interleave with a batched
step, and sends back what the engine answers. The tick writes every acting slot's observation
itself, and one timer watches all deadlines: the per-step path has one wake-up per tick, not one
per slot. The control channel's RPC handlers (claims, grades, releases, env rebuilds) are a
:class:`~.control.ControlChannel` the server holds (``self.control``); this module keeps the
per-step path, and answers ``contract`` and ``stats`` itself.
"""

from __future__ import annotations

import asyncio
import os
import time
import traceback
from collections.abc import Callable
from typing import Any

from pytest_hud.wire.rpc import RpcServer
from pytest_hud.wire.codec import MAX_FRAME_BYTES, WireError, packb, rows_packer, unpack_action, unpackb
from pytest_hud.sim.base import VectorSim, sim_stats, stepping_hint
from pytest_hud.sim.threads import default_threads
from pytest_hud.bridge.closing import close_code, fail
from pytest_hud.bridge.control import ControlChannel
from pytest_hud.bridge.engine import (
    DEFAULT_START_WINDOW, DEFAULT_TICK_WINDOW, BridgeEngine, Handshake, Timeouts, resolve_tick,
)
from pytest_hud.bridge.exceptions import BadAction, BadClaim, SimFailed, SlotFailure
from pytest_hud.bridge.simcalls import explain, park_step_observe
from pytest_hud.bridge.simgate import SimGate
from pytest_hud.bridge.slots import Slot, SlotState
from pytest_hud.bridge.ticks import run_length, run_steps
from pytest_hud.bridge.wsserver import WsConnection, WsServer, serve_ws

__all__ = ["BridgeServer", "Timeouts", "close_code"]

PROTOCOL = "pytest-hud/control/1"


class BridgeServer:
    """One bridge's slot WebSockets, tick and control channel (see the module docstring)."""

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
        start_together: int = 0,
        start_window: float = DEFAULT_START_WINDOW,
        call: Callable[..., None],
    ) -> None:
        self.sim = sim
        self._submit = submit
        self._call_to = call  # the executor's ``call_to``: the tick's answer as a callback
        self.secret = secret
        self.host = host
        self.target = target
        self.contract = sim.contract()
        self.contract_dict = self.contract.to_dict()
        tick = resolve_tick(tick, slot_step=sim.supports_slot_step, slot_reset=sim.supports_slot_reset,
                            lane_ticks=sim.supports_lane_ticks)
        self.engine = BridgeEngine(sim.width, self.contract, sim.hold_action(), hold=hold,
                                   wave=not sim.supports_slot_reset, timeouts=timeouts,
                                   build_args=build_args, tick=tick, tick_window=tick_window,
                                   tasks=tuple(getattr(sim, "tasks", ()) or ()),
                                   instructions=getattr(sim, "instructions", None) or {},
                                   instruction=getattr(sim, "instruction", None),
                                   lanes=getattr(sim, "lanes", None), start_together=start_together,
                                   claims=sim.claim_rules,
                                   # pinning a fault on a slot needs a sim that steps a subset of slots
                                   isolates=sim.isolates_slots and sim.supports_slot_step)
        self._start_window = start_window
        self._held: list[tuple[WsConnection, _Peer]] = []  # reset, first observation held back (start together)
        self._held_timer: asyncio.TimerHandle | None = None
        self.started = time.monotonic()
        self._sim_gate = SimGate(on_free=self._maybe_tick if self.engine.tick_rules.lane_slots else None)
        self._lanes_busy: set[int] = set()  # lanes mode: lanes whose step is under way
        self._run_most = run_length(sim.observe())  # lanes mode: the most steps of a lane's run
        self._lane_step_s: float | None = None  # lanes mode: a recent lane step's seconds (moving average)
        self._deadline: tuple[float, asyncio.TimerHandle] | None = None  # (due, its timer)
        self._sockets: dict[int, WsConnection] = {}  # slot index -> its agent's socket
        self._handshakes: dict[Handshake, WsConnection] = {}  # sockets that have not claimed yet
        self._metadata = packb({"claim_required": True, "width": self.engine.width,
                                "contract": self.contract_dict})
        self._tick_task: asyncio.Task | None = None
        self._ticking = False
        self._window: asyncio.TimerHandle | None = None  # ready mode: the armed window's timer
        self.control = ControlChannel(sim, self.engine, self._sim_gate, self._sim_call, self._sockets,
                                      slot_freed=self._maybe_tick, wave_gather_s=wave_gather_s)
        self.rpc = RpcServer(
            {"contract": self._rpc_contract, "stats": self._rpc_stats, **self.control.handlers()},
            secret,
            on_close=self.control.on_control_close,
            hello_info=self._hello_info,
        )
        self.step_s = 0.0  # time in the sim's steps (ticks), and the span of the ticks
        self._step_started = self._ticked_from = self._ticked_until = 0.0
        self.control_port = 0
        self.ws_port = 0
        self.ws_unix: str | None = None  # the same WebSocket on an abstract Unix socket, for this host
        self._ws_server: WsServer | None = None

    # ------------------------------------------------------------- lifecycle
    async def start(self, control_port: int = 0, ws_port: int = 0) -> None:
        self.control_port = await self.rpc.start(self.host, control_port)
        # no pings from this side: ticks may legitimately pause for minutes (model warm-up)
        self._ws_server = await serve_ws(self, self.host, ws_port, MAX_FRAME_BYTES, unix=True)
        self.ws_port = self._ws_server.port
        self.ws_unix = self._ws_server.unix

    async def close(self) -> None:
        await self.rpc.close()
        if self._ws_server is not None:
            self._ws_server.close()

    async def _sim_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await self._submit(asyncio.get_running_loop(), fn, *args)

    async def _rpc_contract(self, conn: Any) -> dict[str, Any]:
        return self.contract_dict

    async def _rpc_stats(self, conn: Any) -> dict[str, Any]:
        engine = self.engine
        ticks = engine.tick_rules
        return {
            "width": engine.width, "pid": os.getpid(), "target": self.target, "build": engine.build_args,
            "broken": engine.broken, "ticks": ticks.ticks, "env_steps": ticks.env_steps,
            "slot_steps": ticks.slot_steps, "sim_calls": ticks.sim_calls, "episodes": engine.episodes,
            "uptime_s": time.monotonic() - self.started, "slots": engine.snapshot(),
            "wave": engine.wave, "tick": engine.tick, "start_together": engine.start_together,
            "starts_held": len(self._held), "vectorization": self.sim.vectorization,
            "tasks": list(engine.tasks), "sim": sim_stats(self.sim), "step_s": self.step_s,
            "hint": stepping_hint(self.sim, ticks.ticks, ticks.env_steps, self.step_s,
                                  self._ticked_until - self._ticked_from, default_threads(engine.width)),
            "isolates": engine.isolates, "in_service": engine.faults.in_service,
            "notes": list(engine.faults.notes),
        }

    def _hello_info(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL,
            "width": self.engine.width,
            "ws": self.ws_port,
            "ws_unix": self.ws_unix,
            "pid": os.getpid(),
            "target": self.target,
            "build": self.engine.build_args,
            "wave": self.engine.wave,
            "tick": self.engine.tick,
            "vectorization": self.sim.vectorization,
            "tasks": list(self.engine.tasks),
            "isolates": self.engine.isolates,
            "claims": self.engine.claims.to_dict(),
        }

    # ------------------------------------------------------------- websocket
    # The slot sockets are callbacks from :mod:`.wsserver`: a message is handled in the loop
    # iteration that read it, and the per-step path (an action in, the tick, the observations
    # out) runs no task and awaits nothing but the sim call itself.
    def ws_open(self, conn: WsConnection) -> None:
        conn.send(self._metadata)
        peer = _Peer(self.engine.open(time.monotonic()))
        conn.data = peer
        self._handshakes[peer.handshake] = conn
        self._arm_deadline()  # its claim clock

    def ws_message(self, conn: WsConnection, raw: bytes | str) -> None:
        peer: _Peer = conn.data
        if peer.done:
            return
        if peer.slot is None:
            self._on_claim(conn, peer, raw)
        elif peer.binding:
            peer.early.append(raw)  # sent before its first observation: read once the slot starts
        else:
            self._on_action(conn, peer, raw)

    def ws_closed(self, conn: WsConnection) -> None:
        peer: _Peer | None = conn.data
        if peer is None:
            return
        peer.closed = True
        if self._handshakes.pop(peer.handshake, None) is not None:
            self.engine.hang_up(peer.handshake)
        if peer.binding:
            return  # the slot's reset is running: _start_slot settles it
        slot = peer.slot
        if slot is not None and self._sockets.get(slot.index) is conn:
            self._sockets.pop(slot.index, None)
            self.engine.disconnect(slot, clean=conn.close_rcvd in (1000, 1001))
            self._maybe_tick()

    def _end_conn(self, conn: WsConnection, peer: _Peer, failure: SlotFailure | None = None) -> None:
        """This connection's part is over: a readable error first if there is one, then close."""
        peer.done = True
        if failure is not None:
            fail(conn, failure)
        else:
            conn.close(1000)

    def _on_claim(self, conn: WsConnection, peer: _Peer, raw: bytes | str) -> None:
        self._handshakes.pop(peer.handshake, None)
        try:
            if isinstance(raw, str):
                raise BadClaim("the claim frame must be binary msgpack {'claim': TOKEN}")
            try:
                claim = unpackb(raw)
            except WireError as exc:
                raise BadClaim(str(exc)) from None
            slot = self.engine.bind(peer.handshake, claim)
        except SlotFailure as failure:
            self._end_conn(conn, peer, failure)
            return
        peer.slot, peer.token = slot, slot.token
        self._sockets[slot.index] = conn
        if self.engine.wave:
            self._start_slot(conn, peer)
        else:  # per-slot reset, with the claim's seed, now that its agent is here
            peer.binding = True
            asyncio.ensure_future(self._reset_then_start(conn, peer))

    async def _reset_then_start(self, conn: WsConnection, peer: _Peer) -> None:
        try:
            async with self._sim_gate:
                await self.control.reset(self.engine.plan_reset([peer.slot]))  # type: ignore[list-item]
        except SimFailed as failure:
            peer.binding = False
            self._end_conn(conn, peer, failure)
            if peer.closed:
                self.ws_closed(conn)
            return
        # still ``binding`` while held: a hang-up or early frame waits for _start_slot, as during the reset
        self._held.append((conn, peer))
        waiting = sum(1 for _, p in self._held if not p.closed and p.slot is not None and p.slot.token == p.token)
        if self.engine.starts_now(waiting):
            self._start_held()
        elif self._held_timer is None:
            self._held_timer = asyncio.get_running_loop().call_later(self._start_window, self._start_held)

    def _start_held(self) -> None:
        """Start every held episode: they and the LIVE ones are enough, or the window ran out."""
        if self._held_timer is not None:
            self._held_timer.cancel()
            self._held_timer = None
        held, self._held = self._held, []
        for conn, peer in held:
            peer.binding = False
            self._start_slot(conn, peer)

    def _start_slot(self, conn: WsConnection, peer: _Peer) -> None:
        slot = peer.slot
        assert slot is not None
        if slot.token != peer.token:
            self._end_conn(conn, peer)  # released while it reset: _free has told the agent
            return
        try:
            frame = self.engine.start(slot, time.monotonic())
        except SlotFailure as failure:  # no first observation, or the bridge broke during its reset
            self._end_conn(conn, peer, failure)
            return
        if peer.closed:  # the agent hung up during its reset
            self.ws_closed(conn)
            return
        self._arm_deadline()  # its first-action clock
        conn.send(packb(frame))
        early, peer.early = peer.early, []
        for raw in early:
            self.ws_message(conn, raw)

    def _on_action(self, conn: WsConnection, peer: _Peer, raw: bytes | str) -> None:
        """One action frame, on the per-step path: queue it, and run the tick if it was the last."""
        slot = peer.slot
        engine = self.engine
        if slot.token != peer.token:  # type: ignore[union-attr]
            self._end_conn(conn, peer)  # released: _free has closed the socket
            return
        if slot.state is not SlotState.LIVE:  # type: ignore[union-attr]
            # the episode is over: tell a late frame why; a failed slot is told by whoever failed it
            self._end_conn(conn, peer, engine.late_frame(slot) if slot.failure is None else None)  # type: ignore
            return
        now = time.monotonic()
        try:
            if isinstance(raw, str):
                raise WireError("action frames must be binary msgpack, not text")
            if slot.pending_action is not None or slot.queued:  # type: ignore[union-attr]
                raise WireError("an action arrived before the observation of the previous one; "
                                "send one action per observation (or a frame of several, then "
                                "read one observation per action)")
            engine.submit_action(slot, unpack_action(raw), now)  # type: ignore[arg-type]
        except (WireError, BadAction) as exc:
            failure = exc if isinstance(exc, BadAction) else engine.refuse_action(slot, str(exc))  # type: ignore
            self._maybe_tick()
            self._end_conn(conn, peer, failure)
            return
        if engine.tick_rules.lane_slots:
            self._tick_lane(engine.lanes[slot.index])  # type: ignore[union-attr, index]
        elif not self._ticking:
            if engine.tick_rules.ready_to_step(now):
                self._tick_start()  # the last slot to act starts the tick itself
            else:
                self._arm_window()

    # -------------------------------------------------------------- deadlines
    def _arm_deadline(self) -> None:
        """Keep one timer at the earliest deadline of any LIVE slot or unclaimed socket."""
        due = min((s.deadline for s in self.engine.slots if s.deadline is not None), default=None)
        for hs in self._handshakes:
            if hs.deadline is not None and (due is None or hs.deadline < due):
                due = hs.deadline
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
            if isinstance(late, Slot):
                conn = self._sockets.get(late.index)
                if conn is not None:
                    fail(conn, failure)
            else:
                conn = self._handshakes.pop(late, None)
                if conn is not None:
                    self._end_conn(conn, conn.data, failure)
        self._maybe_tick()

    # ------------------------------------------------------------------ tick
    def _maybe_tick(self) -> None:
        if self.engine.tick_rules.lane_slots:
            for lane in self.engine.tick_rules.lane_slots:
                self._tick_lane(lane)
            return
        if self._ticking:
            return
        if self.engine.tick_rules.ready_to_step(time.monotonic()):
            self._tick_start()
        else:
            self._arm_window()

    def _arm_window(self) -> None:
        """Ready mode: wake up when the first pending action's tick window closes."""
        if self._window is not None:
            # already armed, for an action that came before any still pending (or one a tick has
            # taken since: it wakes up early, looks, and arms the next window)
            return
        due = self.engine.tick_rules.tick_due()
        if due is None:
            return
        delay = max(0.0, due - time.monotonic())
        self._window = asyncio.get_running_loop().call_later(delay, self._window_closed)

    def _window_closed(self) -> None:
        self._window = None
        self._maybe_tick()

    def _tick_start(self) -> None:
        """Plan a step and hand it to the sim's thread; :meth:`_tick_done` continues on its answer.

        The sim gate is taken synchronously when free (the common case); a reset holding it makes
        the tick wait in a task, in turn.
        """
        self._ticking = True
        if self._sim_gate.try_take():
            self._tick_planned()
        else:
            self._tick_task = asyncio.ensure_future(self._tick_when_free())

    async def _tick_when_free(self) -> None:
        try:
            await self._sim_gate.acquire()
        except BaseException:
            self._ticking = False
            raise
        self._tick_planned()

    def _tick_planned(self) -> None:
        now = time.monotonic()
        plan = self.engine.tick_rules.plan_tick(now)
        if plan is None:
            self._sim_gate.release()
            self._ticking = False
            return
        self._step_started = now
        self.engine.tick_rules.sim_calls += 1
        if not self._ticked_from:
            self._ticked_from = now
        self._call(self._tick_done, plan, park_step_observe, self.sim, plan.park, plan.actions, plan.mask,
                   plan.unread)

    def _tick_done(self, plan: Any, result: Any, error: BaseException | None) -> None:
        self._ticked_until = time.monotonic()
        self.step_s += self._ticked_until - self._step_started
        try:
            self._deliver(plan, result, error)
        finally:
            self._sim_gate.release()
            self._ticking = False
        self._tick_again(plan)

    def _deliver(self, plan: Any, result: Any, error: BaseException | None) -> None:
        """A step's outcome to its slots: each one's observation frame, or the sim's failure."""
        engine = self.engine
        if error is None and result[2] and not engine.isolates:
            error = RuntimeError("\n".join(result[2].values()))  # said it isolates slots, but cannot
        if error is not None:
            why = explain("".join(traceback.format_exception(error)))
            self.control.tell(engine.faults.step_failed(plan, why))
            return
        batch, obs, faults = result
        if faults:  # only those slots' episodes fail; the others get their frames as usual
            self.control.tell(engine.faults.faulted([(s, token) for s, token, _ in plan.acting], faults, "step", faults.intact))
            plan.acting = [entry for entry in plan.acting if entry[0].index not in faults]
            self.control.rebuild_soon()
        # packed before the gate opens: ``obs`` may be the sim's own buffers, which its next call reuses
        sockets = self._sockets
        for i, frame in self.engine.tick_rules.apply_batch(plan, batch, obs, time.monotonic(), rows_packer):
            conn = sockets.get(i)
            if conn is not None:
                conn.send(frame)

    # ------------------------------------------------------------- lanes mode
    # Each lane's steps are begun on the sim's thread (the actions go down its process's pipe), its
    # pipe is watched by the loop, and its answer is read on the sim's thread once there: steps of
    # several lanes are under way at once. A lane's slots with queued actions step them in one run
    # (one round trip, not one per step), its frames sent at its end, unless an agent reads slower
    # than the bridge writes (then one step at a time, as ``_tick_again`` holds the slot). A reset
    # takes the sim gate whole, so it waits for the steps under way and no lane starts another until
    # it is done (then ``on_free`` ticks again).
    def _tick_lane(self, lane: int) -> None:
        if lane in self._lanes_busy:
            return
        rules = self.engine.tick_rules
        plan = rules.plan_lane(lane)
        if plan is None or not self._sim_gate.try_share():
            return
        self._lanes_busy.add(lane)
        if not self._ticked_from:
            self._ticked_from = time.monotonic()
        reading = any(self._reading(s) for s, _, _ in plan.acting)
        plans = [plan] if reading else rules.plan_run(plan, run_steps(self._run_most, self._lane_step_s))
        rules.sim_calls += 1
        self._call(self._lane_sent, plans, self.sim.lane_begin, lane,  # type: ignore[attr-defined]
                   [(p.actions, p.mask, p.unread) for p in plans])

    def _lane_sent(self, plans: list[Any], result: Any, error: BaseException | None) -> None:
        if error is not None:
            self._lane_done(plans, None, error)
            return
        plans[0].started = time.monotonic()  # (the steps' time: step_s)
        fd = self.sim.lane_fileno(plans[0].lane)  # type: ignore[attr-defined]
        asyncio.get_running_loop().add_reader(fd, self._lane_readable, plans, fd)

    def _lane_readable(self, plans: list[Any], fd: int) -> None:
        asyncio.get_running_loop().remove_reader(fd)
        os.set_blocking(fd, True)  # uvloop's reader made it non-blocking; the pipe's reads and writes block
        self._call(self._lane_done, plans, self.sim.lane_end, plans[0].lane)  # type: ignore[attr-defined]

    def _lane_done(self, plans: list[Any], result: Any, error: BaseException | None) -> None:
        """A lane's run answered: each step delivered in order, as if planned after the one
        before (its slots take their next queued actions first), or the error to the first."""
        self._ticked_until = time.monotonic()
        plan = plans[0]
        took = self._ticked_until - (plan.started or self._ticked_until)
        self.step_s += took
        if error is None and result:  # a step's time, for the length of the next runs
            took /= len(result)
            self._lane_step_s = took if self._lane_step_s is None else 0.8 * self._lane_step_s + 0.2 * took
        try:
            if error is not None:
                self._deliver(plan, None, error)
            else:
                plan = self._deliver_run(plans, result)
        finally:
            self._lanes_busy.discard(plan.lane)
            self._sim_gate.release_share()
        self._tick_again(plan)

    def _deliver_run(self, plans: list[Any], steps: list[Any]) -> Any:
        """A lane's run delivered step by step, each as if planned after the one before: its slots
        take the actions it stepped from their queues first; one whose episode ended or failed
        meanwhile would not have stepped and is left out. Returns the last plan delivered."""
        plan = plans[0]
        for k, step in enumerate(steps):
            if self.engine.broken:  # (another lane's step broke it meanwhile: dropped)
                break
            if k:
                plan, now = plans[k], time.monotonic()
                plan.acting = [entry for entry in plan.acting if entry[0].acts_again(entry[1])]
                for slot, _, _ in plan.acting:
                    slot.act_from_queue(now)
            self._deliver(plan, (step.batch, step.observe(), step.faults), None)
        return plan

    def _reading(self, slot: Slot) -> bool:
        """Whether ``slot``'s agent reads slower than the bridge writes (its socket's buffer is over
        its high-water mark)."""
        conn = self._sockets.get(slot.index)
        return conn is not None and conn.paused

    def _tick_again(self, plan: Any) -> None:
        """After a step: the deadlines, and the next step if due.

        A slot with queued actions (a frame of several) acts again at once, unless its agent reads
        slower than the bridge writes (its connection's buffer is over its high-water mark): then
        it waits, with the step timeout as its deadline, until ``ws_drained``, so the bridge holds at
        most that buffer's worth of its frames. The next step starts on the loop's next turn: a
        sim stepped on the loop's thread would otherwise nest each step in the last one's stack."""
        rules = self.engine.tick_rules
        if not rules.acted_again:
            self._arm_deadline()
            self._maybe_tick()
            return
        now = time.monotonic()
        for slot, token, _ in plan.acting:
            if slot.acts_again(token):
                if self._reading(slot):
                    slot.deadline, slot.awaiting = now + rules.step_timeout, "read"
                else:
                    slot.act_from_queue(now)
        self._arm_deadline()
        asyncio.get_running_loop().call_soon(self._maybe_tick)

    def ws_drained(self, conn: WsConnection) -> None:
        """The agent has read its frames: a slot held for it takes its next queued action."""
        peer: _Peer | None = conn.data
        slot = peer.slot if peer is not None else None
        if slot is None or not slot.acts_again(peer.token):  # type: ignore[union-attr]
            return
        slot.act_from_queue(time.monotonic())
        self._arm_deadline()
        self._maybe_tick()

    def _call(self, callback: Callable[..., None], plan: Any, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the sim's thread, then ``callback(plan, result, error)`` on the loop."""
        self._call_to(asyncio.get_running_loop(), lambda result, error: callback(plan, result, error), fn, *args)


class _Peer:
    """What the bridge knows of one slot WebSocket."""

    __slots__ = ("binding", "closed", "done", "early", "handshake", "slot", "token")

    def __init__(self, handshake: Handshake) -> None:
        self.handshake = handshake
        self.slot: Slot | None = None
        self.token: str | None = None
        self.binding = False  # its slot's reset runs; frames that arrive meanwhile wait in ``early``
        self.early: list[bytes | str] = []
        self.done = False  # this connection's part is over (an error sent, or the episode ended)
        self.closed = False
