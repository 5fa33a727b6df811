"""The bridge's slot WebSocket server: an asyncio protocol on :mod:`pytest_hud.wire.wsstate`, with callbacks.

A message is handed to the bridge from ``data_received``, in the same loop iteration that read it:
no task wakes up per message, and a reply is written straight to the transport. The handler gets

- ``ws_open(conn)`` once the upgrade succeeded,
- ``ws_message(conn, data)`` per message (``bytes``, or ``str`` for a text frame),
- ``ws_closed(conn)`` once, when the connection is gone (``conn.close_rcvd`` is the peer's close
  code, if it sent one).

The connection's state machine is a server :class:`~pytest_hud.wire.wsstate.WsState`, the one a
worker's blocking client runs too: pings answered, a peer's close echoed, a protocol violation
closing with its code, by the same rules on both ends. This module is its I/O: the transport,
the open and close timers, the registry of connections and the handler's callbacks.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import socket
import sys
from typing import Any, Protocol

from pytest_hud.wire.websocket import OP_BINARY, OP_TEXT, HandshakeError, frame_header
from pytest_hud.wire.wsstate import CLOSED, CLOSING, CONNECTING, OPEN, WsState

__all__ = ["CLOSED", "CLOSING", "CONNECTING", "OPEN", "WsConnection", "WsHandler", "serve_ws"]

_ids = itertools.count(1)


class WsHandler(Protocol):
    def ws_open(self, conn: WsConnection) -> None: ...
    def ws_message(self, conn: WsConnection, data: bytes | str) -> None: ...
    def ws_closed(self, conn: WsConnection) -> None: ...


class WsConnection(asyncio.Protocol):
    """One server-side WebSocket connection. ``state`` is CONNECTING, OPEN, CLOSING or CLOSED."""

    def __init__(self, handler: WsHandler, max_size: int, close_timeout: float = 2.0,
                 connections: set[WsConnection] | None = None, open_timeout: float = 10.0) -> None:
        self.id = next(_ids)
        self.handler = handler
        self.ws = WsState(max_size, client=False)
        self.close_timeout = close_timeout
        self.transport: asyncio.Transport | None = None
        self._closer: asyncio.TimerHandle | None = None
        self.open_timeout = open_timeout
        self._connections = connections
        self.data: Any = None  # the handler's per-connection state

    @property
    def state(self) -> int:
        return self.ws.state

    @property
    def close_rcvd(self) -> int | None:
        """The close code the peer sent (1005: a close frame without one), if it sent one."""
        rcvd = self.ws.rcvd
        return None if rcvd is None else rcvd.code

    # ------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        if self._connections is not None:
            self._connections.add(self)
        # a socket that never completes its upgrade request is dropped, like websockets' open_timeout
        self._closer = asyncio.get_running_loop().call_later(self.open_timeout, self._open_expired)

    def _open_expired(self) -> None:
        if self.ws.state == CONNECTING:
            self.abort()

    def data_received(self, data: bytes) -> None:
        ws = self.ws
        if ws.state == CONNECTING:
            data = self._upgrade(data)
            if not data:
                return
        message = ws.receive(data)  # the hot path: one whole frame (an action, most often)
        if ws.out:  # pongs, a close echoed or failed, the end of TCP
            self._flush()
        while message is not None:
            self.handler.ws_message(self, message)
            if not ws.pending:
                return
            message = ws.next()  # the next frame only now: the handler may have closed meanwhile
            if ws.out:
                self._flush()

    def eof_received(self) -> bool | None:
        return None  # asyncio closes the transport; connection_lost follows

    def connection_lost(self, exc: BaseException | None) -> None:
        was_open = self.ws.lost()
        if self._closer is not None:
            self._closer.cancel()
            self._closer = None
        if self._connections is not None:
            self._connections.discard(self)
        if was_open:
            self.handler.ws_closed(self)

    # -------------------------------------------------------------------- sending
    def send(self, data: bytes | str) -> None:
        """Write one message now (binary for ``bytes``, text for ``str``); nothing once closing."""
        ws = self.ws
        if ws.state != OPEN:
            return
        if isinstance(data, str):
            payload, opcode = data.encode(), OP_TEXT
        else:
            payload, opcode = data, OP_BINARY
        if len(payload) < 4096:
            self.transport.write(ws.frame(payload, opcode))  # type: ignore[union-attr]
        else:  # a server's frames are not masked: no copy of a large payload to prepend the header
            transport = self.transport
            transport.writelines((frame_header(opcode, len(payload)), payload))  # type: ignore[union-attr]

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Start the closing handshake; the transport closes when the peer answers (or after
        ``close_timeout``)."""
        if self.ws.state == CONNECTING:
            self.abort()
            return
        if self.ws.close(code, reason):
            self._flush()
            self._arm_closer()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # -------------------------------------------------------------------- internals
    def _flush(self) -> None:
        """Write what the state machine queued; end TCP where it says so."""
        ws = self.ws
        data = ws.take()
        if data:
            self.transport.write(data)  # type: ignore[union-attr]
        if ws.eof:
            self._end()

    def _end(self) -> None:
        """The server ends TCP (RFC 6455 §7.1.1): at once after the closing handshake or a refused
        upgrade; after a protocol error by EOF only, the peer's remaining bytes (a frame over the
        size limit, say) read and dropped until it closes, or ``close_timeout`` runs out."""
        transport = self.transport
        if not self.ws.failed:
            transport.close()  # type: ignore[union-attr]
            return
        self._arm_closer()
        try:
            if transport.can_write_eof():  # type: ignore[union-attr]
                transport.write_eof()  # type: ignore[union-attr]
        except (OSError, RuntimeError):
            self.abort()

    def _arm_closer(self) -> None:
        if self._closer is None:
            self._closer = asyncio.get_running_loop().call_later(self.close_timeout, self.abort)

    def _upgrade(self, data: bytes) -> bytes:
        """The upgrade request, answered once complete; returns the bytes that follow it (frames)."""
        ws = self.ws
        try:
            rest = ws.receive_head(data)
        except HandshakeError:
            self._flush()  # the refusal, then the end of the connection
            return b""
        if rest is None:
            return b""
        self._flush()  # the 101
        if self._closer is not None:
            self._closer.cancel()
            self._closer = None
        self.handler.ws_open(self)
        return rest


class WsServer:
    """The listening sockets of :class:`WsConnection`; ``close`` closes every connection with 1001.

    ``unix`` is the name of its abstract Unix socket (``@name``), or None: the same WebSocket for
    clients on this host, without the TCP stack (about half the system time per message).
    """

    def __init__(self, servers: list[asyncio.AbstractServer], connections: set[WsConnection],
                 unix: str | None = None) -> None:
        self.servers = servers
        self.connections = connections
        self.unix = unix

    @property
    def port(self) -> int:
        return self.servers[0].sockets[0].getsockname()[1]

    def close(self, code: int = 1001, reason: str = "bridge shutting down") -> None:
        for server in self.servers:
            server.close()
        for conn in list(self.connections):
            conn.close(code, reason)


async def serve_ws(handler: WsHandler, host: str, port: int, max_size: int, unix: bool = False) -> WsServer:
    """Listen on ``host:port``, and with ``unix`` also on an abstract Unix socket where the OS has them."""
    loop = asyncio.get_running_loop()
    connections: set[WsConnection] = set()

    def factory() -> WsConnection:
        return WsConnection(handler, max_size, connections=connections)

    servers = [await loop.create_server(factory, host, port)]
    name = None
    if unix:
        sock = _abstract_unix_listener("pytest-hud-ws")
        if sock is not None:
            servers.append(await loop.create_unix_server(factory, sock=sock))
            name = "@" + sock.getsockname()[1:].decode()
    return WsServer(servers, connections, name)


def _abstract_unix_listener(prefix: str) -> socket.socket | None:
    """A listening socket in Linux's abstract namespace (no file to clean up, gone with the process);
    None elsewhere, or where it cannot be bound."""
    if not sys.platform.startswith("linux"):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(f"\0{prefix}-{os.getpid()}-{secrets.token_hex(8)}")
        sock.listen(256)
        sock.setblocking(False)
    except OSError:
        sock.close()
        return None
    return sock
