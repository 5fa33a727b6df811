"""A blocking WebSocket client connection with no background thread.

websockets' own sync client hands every message from a receiving thread to the caller, which costs
a thread switch (and GIL contention) per observation. An episode is strictly request/response, so
this connection drives websockets' sans-I/O :class:`~websockets.client.ClientProtocol` from the
calling thread: send an action, read the socket until the next message, done.
"""

from __future__ import annotations

import select
import socket
import time
from collections import deque
from collections.abc import Mapping

from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.frames import Opcode
from websockets.http11 import Response
from websockets.protocol import State
from websockets.uri import parse_uri

__all__ = ["BlockingWebSocket"]


class BlockingWebSocket:
    """``send(bytes)`` / ``recv(timeout) -> bytes | str`` over one TCP socket."""

    def __init__(self, url: str, max_size: int, open_timeout: float = 30.0,
                 headers: Mapping[str, str] | None = None) -> None:
        uri = parse_uri(url)
        if uri.secure:
            raise InvalidURI(url, "wss:// is not supported by the slot client; bridges are plain loopback")
        self._protocol = ClientProtocol(uri, max_size=max_size)
        self._messages: deque[bytes | str] = deque()
        self._fragments: list[bytes] = []
        self._fragment_text = False
        deadline = time.monotonic() + open_timeout
        self._sock = socket.create_connection((uri.host, uri.port), timeout=open_timeout)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Non-blocking, waited on with poll(): settimeout() per read would cost an extra system
        # call on every message, and reads are the hot path (one per observation).
        self._sock.setblocking(False)
        self._poll = select.poll()
        self._poll.register(self._sock, select.POLLIN)
        try:
            request = self._protocol.connect()
            for name, value in (headers or {}).items():  # e.g. a policy server's Authorization
                request.headers[name] = value
            self._protocol.send_request(request)
            self._flush()
            while self._protocol.state is State.CONNECTING and self._protocol.handshake_exc is None:
                self._read(max(0.0, deadline - time.monotonic()))
            if isinstance(self._protocol.handshake_exc, InvalidStatus):
                raise self._protocol.handshake_exc  # the caller can read the HTTP status (401, 403, ...)
            if self._protocol.state is not State.OPEN:
                raise InvalidHandshake(f"handshake with {url} failed: {self._protocol.handshake_exc}")
        except BaseException:
            self._sock.close()
            raise

    # ------------------------------------------------------------------ I/O
    def _flush(self) -> None:
        data = self._protocol.data_to_send()
        if not data:
            return
        view = memoryview(b"".join(data) if len(data) > 1 else data[0])
        while view:
            try:
                view = view[self._sock.send(view):]
            except BlockingIOError:  # the peer is not reading: wait until it does
                if not select.select([], [self._sock], [], 30.0)[1]:
                    raise TimeoutError("the bridge read nothing for 30 s") from None

    def _read(self, timeout: float) -> None:
        if timeout <= 0:
            raise TimeoutError("timed out")
        if not self._poll.poll(timeout * 1000.0):  # readable, closed or failed: recv() tells which
            raise TimeoutError("timed out")
        try:
            data = self._sock.recv(262144)
        except BlockingIOError:
            return  # woken without data (spurious): the caller loops until its deadline
        except (ConnectionResetError, BrokenPipeError):
            data = b""
        if data:
            self._protocol.receive_data(data)
        else:
            self._protocol.receive_eof()
        for event in self._protocol.events_received():
            if isinstance(event, Response):
                continue  # the handshake response: state moves to OPEN (or CLOSED)
            opcode = event.opcode
            if opcode in (Opcode.TEXT, Opcode.BINARY):
                self._fragment_text = opcode is Opcode.TEXT
                self._fragments = [event.data]
            elif opcode is Opcode.CONT:
                self._fragments.append(event.data)
            else:
                continue  # ping/pong/close are answered by the protocol itself
            if event.fin:
                payload = b"".join(self._fragments)
                self._messages.append(payload.decode() if self._fragment_text else payload)
                self._fragments = []
        self._flush()  # pongs and the closing handshake
        if not data:
            self._sock.close()

    def recv(self, timeout: float) -> bytes | str:
        """The next message; raises ``TimeoutError`` or ``ConnectionClosed``."""
        deadline = time.monotonic() + timeout
        while not self._messages:
            if self._protocol.state is State.CLOSED or self._sock.fileno() < 0:
                raise self._protocol.close_exc
            try:
                self._read(deadline - time.monotonic())
            except TimeoutError:
                raise
            except OSError:
                self._protocol.receive_eof()
                raise self._protocol.close_exc from None
        return self._messages.popleft()

    def send(self, data: bytes) -> None:
        if self._protocol.state is not State.OPEN:
            raise self._protocol.close_exc
        self._protocol.send_binary(data)
        try:
            self._flush()
        except OSError:
            self._protocol.receive_eof()
            raise self._protocol.close_exc from None

    def close(self) -> None:
        if self._sock.fileno() < 0:
            return
        try:
            if self._protocol.state is State.OPEN:
                self._protocol.send_close(1000)
                self._flush()
                deadline = time.monotonic() + 2.0
                while self._protocol.state is not State.CLOSED and self._sock.fileno() >= 0:
                    self._read(deadline - time.monotonic())
        except (OSError, TimeoutError, ConnectionClosed):
            pass
        finally:
            self._sock.close()
