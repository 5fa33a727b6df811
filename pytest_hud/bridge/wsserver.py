"""The bridge's slot WebSocket server: an asyncio protocol on :mod:`pytest_hud.wire.websocket`, with callbacks.

A message is handed to the bridge from ``data_received``, in the same loop iteration that read it:
no task wakes up per message, and a reply is written straight to the transport. The handler gets

- ``ws_open(conn)`` once the upgrade succeeded,
- ``ws_message(conn, data)`` per message (``bytes``, or ``str`` for a text frame),
- ``ws_closed(conn)`` once, when the connection is gone (``conn.close_rcvd`` is the peer's close
  code, if it sent one).

Pings are answered, a peer's close is echoed, and a protocol violation closes with its code.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import secrets
import socket
import sys
from typing import Any, Protocol

from websockets.frames import Close

from pytest_hud.wire.websocket import (
    MAX_HEAD, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG, OP_TEXT, FrameReader, HandshakeError, ProtocolError,
    close_payload, encode_frame, frame_header, http_error, parse_request, switching_protocols,
)

__all__ = ["WsConnection", "WsHandler", "serve_ws"]

CONNECTING, OPEN, CLOSING, CLOSED = range(4)
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
        self.state = CONNECTING
        self.close_rcvd: int | None = None  # the close code the peer sent, if it sent one
        self.close_timeout = close_timeout
        self.transport: asyncio.Transport | None = None
        self._reader = FrameReader(max_size, masked=True)
        self._head = b""
        self._failed = False
        self._closer: asyncio.TimerHandle | None = None
        self.open_timeout = open_timeout
        self._connections = connections
        self.data: Any = None  # the handler's per-connection state

    # ------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        if self._connections is not None:
            self._connections.add(self)
        # a socket that never completes its upgrade request is dropped, like websockets' open_timeout
        self._closer = asyncio.get_running_loop().call_later(self.open_timeout, self._open_expired)

    def _open_expired(self) -> None:
        if self.state == CONNECTING:
            self.abort()

    def data_received(self, data: bytes) -> None:
        if self.state == CONNECTING:
            data = self._handshake(data)
            if not data:
                return
        if self.state == CLOSED or self._failed:
            return  # after a protocol error everything the peer sends is discarded
        reader = self._reader
        if self.state == OPEN:
            payload = reader.whole(data)  # one whole frame (an action, most often): no parser state
            if payload is not None:
                self.handler.ws_message(self, payload)
                return
        reader.feed(data)
        try:
            while True:
                message = reader.next()
                if message is None:
                    return
                opcode, payload = message
                if opcode == OP_BINARY or opcode == OP_TEXT:
                    if self.state == OPEN:
                        self.handler.ws_message(self, payload)
                elif opcode == OP_PING:
                    if self.state == OPEN:
                        self.transport.write(frame_header(OP_PONG, len(payload)) + payload)  # type: ignore[union-attr]
                elif opcode == OP_CLOSE:
                    self._close_received(payload)  # type: ignore[arg-type]  # a Close
                    return
                if self.state == CLOSED:
                    return
        except ProtocolError as exc:
            self._fail_protocol(exc)

    def _fail_protocol(self, exc: ProtocolError) -> None:
        """Fail the connection (RFC 6455 §7.1.7): a close frame with the code, then end our side of
        TCP while the peer's remaining bytes (a frame over the size limit, say) are read and dropped."""
        self._failed = True
        if self.state == OPEN:
            self.close(exc.code, exc.reason)
        try:
            if self.transport is not None and self.transport.can_write_eof():
                self.transport.write_eof()
        except (OSError, RuntimeError):
            self.abort()

    def eof_received(self) -> bool | None:
        return None  # asyncio closes the transport; connection_lost follows

    def connection_lost(self, exc: BaseException | None) -> None:
        was_open = self.state in (OPEN, CLOSING)
        self.state = CLOSED
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
        if self.state != OPEN:
            return
        if isinstance(data, str):
            payload, opcode = data.encode(), OP_TEXT
        else:
            payload, opcode = data, OP_BINARY
        transport = self.transport
        if len(payload) < 4096:
            transport.write(frame_header(opcode, len(payload)) + payload)  # type: ignore[union-attr]
        else:  # no copy of a large payload to prepend the header
            transport.writelines((frame_header(opcode, len(payload)), payload))  # type: ignore[union-attr]

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Start the closing handshake; the transport closes when the peer answers (or after
        ``close_timeout``)."""
        if self.state == CONNECTING:
            self.abort()
            return
        if self.state != OPEN:
            return
        self.state = CLOSING
        self.transport.write(encode_frame(OP_CLOSE, close_payload(code, reason)))  # type: ignore[union-attr]
        loop = asyncio.get_running_loop()
        self._closer = loop.call_later(self.close_timeout, self.abort)

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # -------------------------------------------------------------------- internals
    def _close_received(self, close: Close) -> None:
        """``close``: the peer's close frame, already checked by the reader."""
        self.close_rcvd = close.code
        if self.state == OPEN:  # echo the peer's close, then the server closes TCP (RFC 6455 §7.1.1)
            self.state = CLOSING
            echo = close_payload(close.code) if close.code != 1005 else b""
            self.transport.write(encode_frame(OP_CLOSE, echo))  # type: ignore[union-attr]
        self.transport.close()  # type: ignore[union-attr]

    def _handshake(self, data: bytes) -> bytes:
        """Buffer the upgrade request, answer it; returns the bytes that follow it (frames)."""
        head = self._head + data
        end = head.find(b"\r\n\r\n")
        if end < 0:
            if len(head) > MAX_HEAD:
                self._refuse(HandshakeError(431, f"upgrade request over {MAX_HEAD} bytes"))
            else:
                self._head = head
            return b""
        self._head = b""
        try:
            _, _, accept = parse_request(head[:end])
        except HandshakeError as exc:
            self._refuse(exc)
            return b""
        self.transport.write(switching_protocols(accept))  # type: ignore[union-attr]
        self.state = OPEN
        if self._closer is not None:
            self._closer.cancel()
            self._closer = None
        self.handler.ws_open(self)
        return head[end + 4:]

    def _refuse(self, error: HandshakeError) -> None:
        self.state = CLOSED
        self.transport.write(http_error(error))  # type: ignore[union-attr]
        self.transport.close()  # type: ignore[union-attr]


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
