"""The bridge's slot WebSocket server: an asyncio protocol around websockets' sans-I/O ``ServerProtocol``.

websockets decides what the bytes mean (the upgrade, frames, pings, the closing handshake, protocol
errors and their close codes); this module is its I/O and hands the bridge each message from
``data_received``, in the loop iteration that read it: no task wakes up per message, and a reply is
written straight to the transport. The handler gets

- ``ws_open(conn)`` once the upgrade succeeded,
- ``ws_message(conn, data)`` per message (``bytes``, or ``str`` for a text frame), until either
  side starts the closing handshake,
- ``ws_closed(conn)`` once, when the connection is gone (``conn.close_rcvd`` is the peer's close
  code, if it sent one),
- ``ws_drained(conn)`` when the peer has read enough of what was written to it that the transport's
  buffer is under its low-water mark again (``conn.paused`` says it is over its high-water mark).

No extension is offered (a client asking for permessage-deflate gets none), and the server sends no
pings: ticks may legitimately pause for minutes while a model warms up.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import socket
import sys
from typing import Any, Protocol

from websockets.frames import Frame
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol

from pytest_hud.wire.messages import MessageAssembly

__all__ = ["WsConnection", "WsHandler", "WsServer", "serve_ws"]

_ids = itertools.count(1)
#: Bytes a connection's transport may hold unsent before ``pause_writing`` (asyncio's default is 64 KiB,
#: less than one camera frame of many sims); it resumes under a quarter of it.
WRITE_BUFFER_HIGH = 4 * 2**20
_OPEN = State.OPEN


class WsHandler(Protocol):
    def ws_open(self, conn: WsConnection) -> None: ...
    def ws_message(self, conn: WsConnection, data: bytes | str) -> None: ...
    def ws_closed(self, conn: WsConnection) -> None: ...
    def ws_drained(self, conn: WsConnection) -> None: ...  # optional


class WsConnection(asyncio.Protocol):
    """One server-side WebSocket connection; ``protocol`` is its websockets ``ServerProtocol``."""

    def __init__(self, handler: WsHandler, max_size: int, close_timeout: float = 2.0,
                 connections: set[WsConnection] | None = None, open_timeout: float = 10.0) -> None:
        self.id = next(_ids)
        self.handler = handler
        self.protocol = ServerProtocol(max_size=max_size)
        self.close_timeout = close_timeout
        self.open_timeout = open_timeout
        self.transport: asyncio.Transport | None = None
        self.data: Any = None  # the handler's per-connection state
        self._connections = connections
        self._timer: asyncio.TimerHandle | None = None  # the open timeout, then the close timeout
        self._opened = False  # the upgrade succeeded: ws_closed is owed
        self._closing = False  # this side started the closing handshake: no message is handed out
        self._assembly = MessageAssembly()
        #: the transport holds more than its high-water mark of unsent bytes: the peer reads slower
        #: than this side writes (``ws_drained`` when it is under the low-water mark again)
        self.paused = False

    @property
    def state(self) -> State:
        return self.protocol.state

    @property
    def close_rcvd(self) -> int | None:
        """The close code the peer sent (1005: a close frame without one), if it sent one."""
        rcvd = self.protocol.close_rcvd
        return None if rcvd is None else rcvd.code

    # ------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        # a few frames may wait unread (a slot stepping a frame of several actions is held past
        # this: :meth:`pause_writing`), so that stepping and the peer's reading overlap
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        if self._connections is not None:
            self._connections.add(self)
        # a socket that never completes its upgrade request is dropped, like websockets' open_timeout
        self._timer = asyncio.get_running_loop().call_later(self.open_timeout, self._open_expired)

    def _open_expired(self) -> None:
        if not self._opened:
            self.abort()

    def data_received(self, data: bytes) -> None:
        protocol = self.protocol
        protocol.receive_data(data)
        events = protocol.events_received()
        if not self._opened:
            if not self._upgrade(events):
                return
            events = events[1:]
        for event in events:
            # messages before the peer's close frame are handed out; none after this side's close
            if self._closing or not isinstance(event, Frame):
                continue
            message = self._assembly.feed(event)
            if message is not None:
                self._message(*message)
        self._flush()  # pongs, a close echoed or failed, the end of TCP

    def _message(self, payload: bytes, text: bool) -> None:
        if not text:
            self.handler.ws_message(self, payload)
            return
        try:
            message = payload.decode()
        except UnicodeDecodeError:
            self.protocol.fail(1007, "text message is not valid UTF-8")
            self._closing = True
            return
        self.handler.ws_message(self, message)

    def _upgrade(self, events: list) -> bool:
        """The upgrade request answered once it is all there; whether the connection is open."""
        protocol = self.protocol
        if not events:  # not all there yet, or malformed (websockets then queued the end of TCP)
            self._flush()
            return False
        request: Request = events[0]
        protocol.send_response(protocol.accept(request))  # 101, or a refusal (426 for plain HTTP)
        self._flush()
        if protocol.state is not _OPEN:
            return False
        self._cancel_timer()
        self._opened = True
        self.handler.ws_open(self)
        return True

    def eof_received(self) -> bool | None:
        self.protocol.receive_eof()
        self._flush()
        return None  # asyncio closes the transport; connection_lost follows

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        drained = getattr(self.handler, "ws_drained", None)  # (a handler that never holds a reader has none)
        if self._opened and drained is not None:
            drained(self)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._cancel_timer()
        if self._connections is not None:
            self._connections.discard(self)
        if self._opened:
            self._opened = False
            self._closing = True
            self.handler.ws_closed(self)

    # -------------------------------------------------------------------- sending
    def send(self, data: bytes | str) -> None:
        """Write one message now (binary for ``bytes``, text for ``str``); nothing once closing."""
        protocol = self.protocol
        if protocol.state is not _OPEN or self._closing:
            return
        if isinstance(data, str):
            protocol.send_text(data.encode())
        else:
            protocol.send_binary(data)
        self.transport.writelines(protocol.data_to_send())  # type: ignore[union-attr]

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Start the closing handshake; the transport closes when the peer answers (or after
        ``close_timeout``)."""
        if not self._opened:
            self.abort()
            return
        if self.protocol.state is _OPEN:
            self._closing = True
            self.protocol.send_close(code, reason)
            self._flush()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # -------------------------------------------------------------------- internals
    def _flush(self) -> None:
        """Write what websockets queued; its empty item ends TCP (RFC 6455 §7.1.1: the server
        does, after the closing handshake, a failure or a refused upgrade); once a close is under
        way the peer has ``close_timeout`` to finish it."""
        protocol = self.protocol
        transport = self.transport
        for data in protocol.data_to_send():
            if data:
                transport.write(data)  # type: ignore[union-attr]
            elif protocol.close_rcvd is not None and protocol.parser_exc is None:
                transport.close()  # type: ignore[union-attr]  # the closing handshake is over
            else:  # a failure or a refusal: EOF only, the peer's bytes read and dropped until it
                # closes (or close_timeout), so that our close frame or answer is not lost to a reset
                try:
                    transport.write_eof()  # type: ignore[union-attr]
                except (OSError, RuntimeError):
                    self.abort()
        if protocol.close_expected() and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.close_timeout, self.abort)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


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
