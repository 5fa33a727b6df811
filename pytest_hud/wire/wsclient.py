"""A blocking WebSocket client connection with no background thread, on :mod:`pytest_hud.wire.websocket`.

websockets' own sync client hands every message from a receiving thread to the caller, which costs
a thread switch (and GIL contention) per observation. An episode is strictly request/response, so
this connection reads and writes the socket from the calling thread: send an action, read until
the next message, done. Framing is :mod:`.wsproto`'s straight-line code; errors are websockets'
exception types (``ConnectionClosed``, ``InvalidStatus``, ``InvalidHandshake``, ``InvalidURI``), so
callers read them as they would from websockets.
"""

from __future__ import annotations

import socket
import struct
import time
from collections import deque
from collections.abc import Mapping
from urllib.parse import urlsplit

from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.frames import Close
from websockets.http11 import Response

from pytest_hud.wire.websocket import (
    MAX_HEAD, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG, OP_TEXT, FrameReader, HandshakeError, ProtocolError,
    client_request, close_payload, encode_frame, parse_response,
)

__all__ = ["BlockingWebSocket"]

_OPEN, _CLOSING, _CLOSED = range(3)


#: The most one read takes from the socket (a larger frame takes several reads).
_READ_SIZE = 262144

class BlockingWebSocket:
    """``send(bytes)`` / ``recv(timeout) -> bytes | str`` over one TCP or Unix socket."""

    def __init__(self, url: str, max_size: int, open_timeout: float = 30.0,
                 headers: Mapping[str, str] | None = None, sock: socket.socket | None = None) -> None:
        host, port, path = _parse_url(url)
        self._reader = FrameReader(max_size, masked=False)
        self._messages: deque[bytes | str] = deque()
        self._rcvd: Close | None = None  # the close frame the server sent
        self._sent: Close | None = None  # the close frame this side sent
        self._rcvd_first = False  # whether the server's close came before ours
        self._state = _OPEN
        deadline = time.monotonic() + open_timeout
        # ``sock``: a connection to the server's Unix socket (:func:`unix_connection`), else TCP
        self._sock = sock
        # One receive buffer for the connection's life: ``recv(262144)`` would allocate (mmap) and
        # free 256 KiB per read, with a page fault per 4 KiB received; ``recv_into`` here and a copy
        # of what arrived cost a quarter of that per step (``benchmarks/ws_core.py``).
        self._inbox = bytearray(_READ_SIZE)
        self._inbox_view = memoryview(self._inbox)
        self.unix = sock is not None  # connected over the Unix socket (the server is on this host)
        if self._sock is None:
            self._sock = socket.create_connection((host, port), timeout=open_timeout)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # A blocking socket whose reads time out in the kernel (SO_RCVTIMEO, set only when the
        # timeout changes): one recv() per message. A Python-level timeout, or poll() before each
        # read, costs a second system call on every observation, and reads are the hot path.
        self._recv_timeout = -1.0  # what SO_RCVTIMEO is set to (-1: not set)
        try:
            self._sock.settimeout(None)
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(_SEND_TIMEOUT))
            self._handshake(host, port, path, dict(headers or {}), deadline)
        except BaseException:
            self._sock.close()
            raise

    def _handshake(self, host: str, port: int, path: str, headers: dict[str, str], deadline: float) -> None:
        request, accept = client_request(host, port, path, headers)
        self._write(request)
        head = b""
        while (end := head.find(b"\r\n\r\n")) < 0:
            if len(head) > MAX_HEAD:
                raise InvalidHandshake(f"the server's answer to the upgrade is over {MAX_HEAD} bytes")
            data = self._read_some(deadline - time.monotonic())
            if not data:
                raise InvalidHandshake("the server closed the connection during the WebSocket handshake")
            head += data
        try:
            status, reason, fields = parse_response(head[:end], accept)
        except HandshakeError as exc:
            raise InvalidHandshake(str(exc)) from None
        if status != 101:
            raise InvalidStatus(Response(status, reason, Headers(fields), head[end + 4:]))
        rest = head[end + 4:]
        if rest:
            self._frames(rest)

    # ------------------------------------------------------------------ I/O
    def _write(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except BlockingIOError:  # SO_SNDTIMEO: the peer is not reading
            raise TimeoutError(f"the peer read nothing for {_SEND_TIMEOUT:g} s") from None

    def _read_some(self, timeout: float) -> bytes:
        """Bytes from the socket (``b""`` at EOF); raises ``TimeoutError`` after ``timeout`` s."""
        if timeout <= 0:
            raise TimeoutError("timed out")
        # Kept when it is at most 10% (+10 ms) over what is asked: the rest of a message read in
        # several pieces, or the next message with the same timeout, costs no system call.
        if not timeout <= self._recv_timeout <= timeout * 1.1 + 0.01:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(timeout))
            self._recv_timeout = timeout
        try:
            n = self._sock.recv_into(self._inbox)
            return self._inbox_view[:n].tobytes()
        except BlockingIOError:  # SO_RCVTIMEO ran out
            raise TimeoutError("timed out") from None
        except (ConnectionResetError, BrokenPipeError, TimeoutError):  # TimeoutError: ETIMEDOUT, a dead peer
            return b""

    def _frames(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        try:
            while (message := reader.next()) is not None:
                opcode, payload = message
                if opcode == OP_BINARY or opcode == OP_TEXT:
                    if self._state == _OPEN:
                        self._messages.append(payload)
                elif opcode == OP_PING:
                    if self._state == _OPEN:
                        self._write(encode_frame(OP_PONG, payload, mask=True))  # type: ignore[arg-type]
                elif opcode == OP_CLOSE:
                    self._rcvd = payload  # type: ignore[assignment]  # a Close, checked by the reader
                    self._rcvd_first = self._sent is None
                    code = payload.code  # type: ignore[union-attr]
                    if self._state == _OPEN:  # echo it; the server closes TCP
                        self._send_close(code if code != 1005 else 1000, "")
                    self._state = _CLOSING
                    return
        except ProtocolError as exc:
            if self._state == _OPEN:
                self._send_close(exc.code, exc.reason)
            self._shut()

    def _send_close(self, code: int, reason: str) -> None:
        self._sent = Close(code, reason)
        self._state = _CLOSING
        try:
            self._write(encode_frame(OP_CLOSE, close_payload(code, reason), mask=True))
        except OSError:
            self._shut()

    def _shut(self) -> None:
        self._state = _CLOSED
        self._sock.close()

    def _closed(self) -> ConnectionClosed:
        both = self._rcvd is not None and self._sent is not None
        return ConnectionClosed(self._rcvd, self._sent, self._rcvd_first if both else None)

    def recv(self, timeout: float) -> bytes | str:
        """The next message; raises ``TimeoutError`` or ``ConnectionClosed``."""
        messages = self._messages
        if messages:
            return messages.popleft()
        start = time.monotonic()
        wait = timeout  # the same value call after call: SO_RCVTIMEO stays as it is
        while not messages:
            if self._state == _CLOSED or self._sock.fileno() < 0:
                raise self._closed()
            try:
                data = self._read_some(wait)
            except TimeoutError:
                raise
            except OSError:
                self._shut()
                raise self._closed() from None
            if not data:
                self._shut()
                continue
            if self._state == _OPEN:
                payload = self._reader.whole(data)  # one whole frame: no parser state to go through
                if payload is not None:
                    return payload
            self._frames(data)
            wait = timeout - (time.monotonic() - start)  # a message in several reads: what is left
        return messages.popleft()

    def send(self, data: bytes) -> None:
        if self._state != _OPEN:
            raise self._closed()
        try:
            self._write(encode_frame(OP_BINARY, data, mask=True))
        except OSError:
            self._shut()
            raise self._closed() from None

    def close(self) -> None:
        if self._sock.fileno() < 0:
            return
        try:
            if self._state == _OPEN:
                self._send_close(1000, "")
            deadline = time.monotonic() + 2.0
            while self._state != _CLOSED and self._sock.fileno() >= 0:  # until the server closes TCP
                data = self._read_some(deadline - time.monotonic())
                if not data:
                    break
                self._frames(data)
        except (OSError, TimeoutError, ConnectionClosed):
            pass
        finally:
            self._state = _CLOSED
            self._sock.close()


_SEND_TIMEOUT = 30.0
_UNREACHABLE: set[str] = set()  # Unix socket names that were not there: not tried again


def unix_connection(name: str, timeout: float) -> socket.socket | None:
    """A connection to the Unix socket ``name`` (``@name``: Linux's abstract namespace), or None
    when it is not on this host (the caller dials TCP instead; a name that was not there is not
    tried again). ``timeout`` 0: a non-blocking socket, for an event loop."""
    if name in _UNREACHABLE or not hasattr(socket, "AF_UNIX"):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect("\0" + name[1:] if name.startswith("@") else name)
    except OSError:  # another host or network namespace, or gone: TCP says which
        sock.close()
        _UNREACHABLE.add(name)
        return None
    return sock


def _timeval(seconds: float) -> bytes:
    """A ``struct timeval`` for SO_RCVTIMEO / SO_SNDTIMEO (never 0, which means no limit)."""
    usec = max(1, round(seconds * 1e6))
    return struct.pack("@ll", usec // 1_000_000, usec % 1_000_000)


def _parse_url(url: str) -> tuple[str, int, str]:
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidURI(url, str(exc)) from None
    if parts.scheme == "wss":
        raise InvalidURI(url, "wss:// is not supported by this client; bridges and policy servers "
                              "speak plain ws:// (tunnel TLS if the link needs it)")
    if parts.scheme != "ws" or not parts.hostname:
        raise InvalidURI(url, "expected ws://HOST:PORT[/PATH]")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return parts.hostname, port or 80, path
