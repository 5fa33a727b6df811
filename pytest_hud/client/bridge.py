"""Worker side of a bridge: the control client and the slot WebSocket clients (sync and asyncio).

Only numpy, msgpack and websockets are needed here: workers stay thin. What the frames and replies
mean is decided once in :mod:`.bridge_protocol`; the classes here only move them.

    >>> bridge = BridgeAddress.from_announce("/tmp/bridge.json")
    >>> control = ControlClient(bridge)
    >>> claim = control.claim(seed=3)
    >>> with SlotClient(bridge, claim.token) as slot:
    ...     obs = slot.first_observation
    ...     obs = slot.step(np.zeros(1, np.float32))
    >>> control.result(claim.token)
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Sequence
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from pytest_hud.client.address import BridgeAddress
from pytest_hud.client.protocol import (
    BridgeError, Claim, action_frame, actions_frame, claim_frame, closed_error, control_error, frames_to_end,
    read_claim, read_contract, ObservationReader, read_frame, send_error, unrendered_action_frame,
)
from pytest_hud.core.contract import Contract
from pytest_hud.wire.rpc import AsyncRpcClient, RpcClient, RpcError
from pytest_hud.wire.codec import MAX_FRAME_BYTES

__all__ = [
    "BridgeAddress",
    "BridgeError",
    "Claim",
    "ControlClient",
    "AsyncControlClient",
    "SlotClient",
    "AsyncSlotClient",
]


class ControlClient:
    """Blocking control-channel client. Claims made here are released if this client closes."""

    def __init__(self, address: BridgeAddress, timeout: float = 30.0) -> None:
        self.address = address
        self.timeout = timeout
        try:
            self._rpc = RpcClient(address.host, address.control, address.secret, timeout, "bridge")
        except RpcError as exc:
            raise control_error(exc) from None
        self.info = self._rpc.hello_info

    def _call(self, method: str, timeout: float | None = None, **params: Any) -> Any:
        try:
            return self._rpc.call(method, timeout=timeout, **params)
        except RpcError as exc:
            if exc.code is None:  # the connection itself ended: say so when the bridge has exited
                raise _exited(control_error(exc), _local_pid(self.address)) from None
            raise control_error(exc) from None

    def contract(self) -> Contract:
        return read_contract(self._call("contract"))

    def round_trip_s(self, calls: int = 7) -> float:
        """The fastest of ``calls`` round trips on this channel (seconds): what one exchange with the
        bridge costs at least, the machine's load aside."""
        best = float("inf")
        for _ in range(calls):
            t0 = time.perf_counter()
            self._call("contract")
            best = min(best, time.perf_counter() - t0)
        return best

    def claim(self, wait: float = 660.0, **task: Any) -> Claim:
        """Claim a slot for an episode (``seed``, ``options``, ``prompt``, ``build``, ...).

        Nothing is reset yet: the slot is reset with the claim's seed when its agent binds it on
        the slot WebSocket, so hold-steps before that cannot leak into the episode. Waits up to
        ``wait`` seconds for a free slot."""
        return read_claim(self._call("claim", timeout=wait, **task))

    reset = claim  # the control call's first name (DESIGN's ``reset(**task)``)

    def result(self, token: str) -> dict[str, Any]:
        """Grade the episode and free its slot."""
        return self._call("result", token=token)

    def release(self, token: str) -> None:
        """Abandon the episode without grading and free its slot."""
        self._call("release", token=token)

    def stats(self) -> dict[str, Any]:
        return self._call("stats")

    def close(self) -> None:
        self._rpc.close()

    def __enter__(self) -> ControlClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncControlClient:
    """asyncio control-channel client (same calls as :class:`ControlClient`)."""

    def __init__(self, rpc: AsyncRpcClient, address: BridgeAddress) -> None:
        self._rpc = rpc
        self.address = address
        self.info = rpc.hello_info

    @classmethod
    async def connect(cls, address: BridgeAddress, timeout: float = 30.0) -> AsyncControlClient:
        try:
            rpc = await AsyncRpcClient.connect(address.host, address.control, address.secret, timeout, "bridge")
        except RpcError as exc:
            raise control_error(exc) from None
        return cls(rpc, address)

    async def _call(self, method: str, timeout: float | None = None, **params: Any) -> Any:
        try:
            return await self._rpc.call(method, timeout=timeout, **params)
        except RpcError as exc:
            if exc.code is None:  # the connection itself ended: say so when the bridge has exited
                raise await _aexited(control_error(exc), _local_pid(self.address)) from None
            raise control_error(exc) from None

    async def contract(self) -> Contract:
        return read_contract(await self._call("contract"))

    async def claim(self, wait: float = 660.0, **task: Any) -> Claim:
        """See :meth:`ControlClient.claim`."""
        return read_claim(await self._call("claim", timeout=wait, **task))

    reset = claim  # the control call's first name

    async def result(self, token: str) -> dict[str, Any]:
        return await self._call("result", token=token)

    async def release(self, token: str) -> None:
        await self._call("release", token=token)

    async def stats(self) -> dict[str, Any]:
        return await self._call("stats")

    async def close(self) -> None:
        await self._rpc.close()


def _local_pid(address: BridgeAddress) -> int | None:
    """The bridge's pid when it runs on this host (its control channel on loopback), else None."""
    if address.node is None and address.host in ("127.0.0.1", "::1", "localhost"):
        return address.pid
    return None


def _exited(error: BridgeError, pid: int | None) -> BridgeError:
    """``error`` (a slot or control connection that closed without an error), saying so when the
    bridge process on this host has exited: the usual cause, and one the connection cannot tell."""
    deadline = time.monotonic() + 0.5  # its sockets close before it is a zombie: give it a moment
    while (verdict := _exit_verdict(error, pid, deadline)) is None:
        time.sleep(0.02)
    return verdict


async def _aexited(error: BridgeError, pid: int | None) -> BridgeError:
    """:func:`_exited` for the asyncio client."""
    deadline = time.monotonic() + 0.5
    while (verdict := _exit_verdict(error, pid, deadline)) is None:
        await asyncio.sleep(0.02)
    return verdict


def _exit_verdict(error: BridgeError, pid: int | None, deadline: float) -> BridgeError | None:
    """One look at ``/proc/PID``: the error to raise, or None to look again in a moment."""
    if pid is None or not sys.platform.startswith("linux"):
        return error
    try:
        with open(f"/proc/{pid}/stat") as stat:
            state = stat.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        state = "X"
    except (OSError, IndexError):
        return error
    if state in ("Z", "X"):
        return BridgeError(f"{error}: the bridge process (pid {pid}) has exited")
    return error if time.monotonic() > deadline else None


def _unreachable(where: str, exc: BaseException) -> str:
    why = " (nothing listens there: has the bridge exited?)" if isinstance(exc, ConnectionRefusedError) else ""
    return f"cannot reach the bridge's slot WebSocket at {where}: {exc}{why}"


class SlotClient:
    """Blocking WebSocket client for one claimed slot (no background thread: :mod:`pytest_hud.wire.wsclient`).

    ``recv_timeout`` bounds every wait for an observation (peers may hold a tick while their model
    warms up, so it defaults to the bridge's first-action timeout plus a margin).
    """

    def __init__(self, address: BridgeAddress | str, token: str | None, *,
                 connect_timeout: float = 30.0, recv_timeout: float = 360.0) -> None:
        from pytest_hud.wire.wsclient import BlockingWebSocket, unix_connection

        url, unix = (address.ws_url, address.ws_unix) if isinstance(address, BridgeAddress) else (address, None)
        self.recv_timeout = recv_timeout
        self._read = ObservationReader()
        # the bridge's Unix socket when it is on this host, else TCP: an error names the one dialled
        sock = unix_connection(unix, connect_timeout) if unix else None
        try:
            self._ws = BlockingWebSocket(url, MAX_FRAME_BYTES, connect_timeout, sock=sock)
        except (OSError, InvalidHandshake, InvalidURI, TimeoutError, ConnectionClosed) as exc:
            raise BridgeError(_unreachable(unix if sock is not None else url, exc)) from None  # type: ignore[arg-type]
        # on the Unix socket, the bridge runs on this host: its pid says whether it has exited
        self._pid = address.pid if isinstance(address, BridgeAddress) and self._ws.unix else None
        try:
            self.metadata = read_frame(self._recv(connect_timeout), "metadata")
            self._send(claim_frame(token))
            # the bridge resets (maybe builds) the slot's env before it answers: an observation's wait
            self.first_observation = read_frame(self._recv(recv_timeout), "first observation")
        except BaseException:
            self.close()
            raise

    def _recv(self, timeout: float) -> Any:
        try:
            return self._ws.recv(timeout)
        except TimeoutError:
            raise BridgeError(f"bridge sent nothing for {timeout:g} s") from None
        except ConnectionClosed as exc:
            raise _exited(closed_error(exc), self._pid) from None

    def _send(self, data: bytes) -> None:
        try:
            self._ws.send(data)
        except ConnectionClosed as exc:
            try:
                late: bytes | str | None = self._ws.recv(0.5)  # the bridge's error frame, if buffered
            except (ConnectionClosed, TimeoutError):
                late = None
            raise (send_error(exc, late) if late is not None else _exited(closed_error(exc), self._pid)) from None

    def step(self, action: Any, render: bool = True) -> dict[str, Any]:
        """Send one action (``[A]``), return the next observation frame (``render=False``: its
        images go unread, and may be the last rendered ones: :mod:`pytest_hud.sim.renders`)."""
        self._send(action_frame(action) if render else unrendered_action_frame(action))
        return self._read(self._recv(self.recv_timeout))

    def step_many(self, actions: Any, render: Sequence[bool] | None = None) -> list[dict[str, Any]]:
        """Send several actions (``[T, *action]``) in one frame, return the observation frame of
        each: ``T`` of them, or fewer when the episode ends first (the last one says so). One
        message instead of ``T`` round trips: the bridge steps the slot again as soon as it has sent
        a frame, without waiting for this agent (:func:`actions_frame`). ``render``: per action,
        whether its observation's images are read (None: every one is rendered)."""
        self._send(actions_frame(actions, render))
        return frames_to_end(lambda: self._read(self._recv(self.recv_timeout)), len(actions))

    def close(self) -> None:
        self._ws.close()

    def __enter__(self) -> SlotClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncSlotClient:
    """asyncio WebSocket client for one claimed slot (same frames as :class:`SlotClient`)."""

    def __init__(self, ws: Any, recv_timeout: float, pid: int | None = None) -> None:
        self._ws = ws
        self.recv_timeout = recv_timeout
        self._pid = pid  # the bridge's, when connected over its Unix socket (it runs on this host)
        self._read = ObservationReader()
        self.metadata: dict[str, Any] = {}
        self.first_observation: dict[str, Any] = {}

    @classmethod
    async def connect(cls, address: BridgeAddress | str, token: str | None, *,
                      connect_timeout: float = 30.0, recv_timeout: float = 360.0) -> AsyncSlotClient:
        from websockets.asyncio.client import connect, unix_connect

        from pytest_hud.wire.wsclient import unix_connection

        url, name = (address.ws_url, address.ws_unix) if isinstance(address, BridgeAddress) else (address, None)
        options = dict(compression=None, max_size=MAX_FRAME_BYTES, open_timeout=connect_timeout,
                       close_timeout=2, ping_interval=None)
        ws = None
        # the bridge's Unix socket, when it is on this host: connected here (at once, or refused),
        # so that only "not here" falls back to TCP, and a slow handshake is an error as on TCP
        sock = unix_connection(name, 0.0) if name else None
        if sock is not None:
            try:
                ws = await unix_connect(sock=sock, uri=url, **options)
            except (OSError, InvalidHandshake, InvalidURI, ConnectionClosed) as exc:
                sock.close()
                raise BridgeError(_unreachable(name, exc)) from None  # type: ignore[arg-type]
        if ws is None:
            try:
                ws = await connect(url, **options)
            except (OSError, InvalidHandshake, InvalidURI, TimeoutError, ConnectionClosed) as exc:
                raise BridgeError(_unreachable(url, exc)) from None
        self = cls(ws, recv_timeout, address.pid if sock is not None else None)  # type: ignore[union-attr]  # a Unix name comes from a BridgeAddress
        try:
            self.metadata = read_frame(await self._recv(connect_timeout), "metadata")
            await self._send(claim_frame(token))
            # the bridge resets (maybe builds) the slot's env before it answers: an observation's wait
            self.first_observation = read_frame(await self._recv(recv_timeout), "first observation")
        except BaseException:
            await self.close()
            raise
        return self

    async def _recv(self, timeout: float) -> Any:
        try:
            async with asyncio.timeout(timeout):
                return await self._ws.recv()
        except TimeoutError:
            raise BridgeError(f"bridge sent nothing for {timeout:g} s") from None
        except ConnectionClosed as exc:
            raise await _aexited(closed_error(exc), self._pid) from None

    async def _send(self, data: bytes) -> None:
        try:
            await self._ws.send(data)
        except ConnectionClosed as exc:
            try:
                async with asyncio.timeout(0.001):  # already buffered, if the bridge sent it
                    late: bytes | str | None = await self._ws.recv()
            except (ConnectionClosed, TimeoutError):
                late = None
            raise (send_error(exc, late) if late is not None
                   else await _aexited(closed_error(exc), self._pid)) from None

    async def step(self, action: Any, render: bool = True) -> dict[str, Any]:
        """Send one action (``[A]``), return the next observation frame (``render``: see :class:`SlotClient`)."""
        await self._send(action_frame(action) if render else unrendered_action_frame(action))
        return self._read(await self._recv(self.recv_timeout))

    async def step_many(self, actions: Any, render: Sequence[bool] | None = None) -> list[dict[str, Any]]:
        """Several actions in one frame, their observation frames (:meth:`SlotClient.step_many`)."""
        await self._send(actions_frame(actions, render))
        frames = []
        for _ in range(len(actions)):
            frame = self._read(await self._recv(self.recv_timeout))
            frames.append(frame)
            if frame["terminated"]:
                break
        return frames

    async def close(self) -> None:
        try:
            await self._ws.close()
        except Exception:  # noqa: BLE001
            pass
