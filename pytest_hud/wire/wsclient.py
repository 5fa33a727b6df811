"""A blocking WebSocket client connection with no background thread, on :mod:`pytest_hud.wire.wsstate`.

websockets' own sync client hands every message from a receiving thread to the caller, which costs
a thread switch (and GIL contention) per observation. An episode is strictly request/response, so
this connection reads and writes the socket from the calling thread: send an action, read until
the next message, done. The connection's state machine (frames, pings, the closing handshake,
protocol errors) is :class:`~pytest_hud.wire.wsstate.WsState`, the one the bridge's server runs
too, on :mod:`.websocket`'s straight-line framing; this module is its I/O. Errors are websockets'
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
from websockets.http11 import Response

from pytest_hud.wire.websocket import HandshakeError
from pytest_hud.wire.wsstate import CLOSED, OPEN, WsState

__all__ = ["BlockingWebSocket"]

#: The most one read takes from the socket (a larger frame takes several reads).
_READ_SIZE = 262144


class BlockingWebSocket:
    """``send(bytes)`` / ``recv(timeout) -> bytes | str`` over one TCP or Unix socket.

    The WebSocket itself is a client :class:`~pytest_hud.wire.wsstate.WsState` (the state machine
    the bridge's server runs too); this class is its I/O: the socket, its timeouts, the blocking
    reads, and websockets' exception types."""

    def __init__(self, url: str, max_size: int, open_timeout: float = 30.0,
                 headers: Mapping[str, str] | None = None, sock: socket.socket | None = None) -> None:
        host, port, path = _parse_url(url)
        self._ws = WsState(max_size, client=True)
        self._messages: deque[bytes | str] = deque()  # read with the one recv() returned, not yet asked for
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
        ws = self._ws
        ws.request(host, port, path, headers)
        self._write(ws.take())
        rest = None
        while rest is None:
            data = self._read_some(deadline - time.monotonic())
            if not data:
                raise InvalidHandshake("the server closed the connection during the WebSocket handshake")
            try:
                rest = ws.receive_head(data)
            except HandshakeError as exc:
                if exc.status:  # a refusal: the server's HTTP answer
                    response = Response(exc.status, exc.reason, Headers(exc.headers), exc.body)
                    raise InvalidStatus(response) from None
                raise InvalidHandshake(str(exc)) from None
        if rest:  # frames that came with the answer
            message = ws.receive(rest)
            if message is not None:
                self._messages.append(message)
            self._more()

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

    def _flush(self) -> None:
        """Write what the state machine queued (pongs, close frames); a socket that fails is lost."""
        try:
            self._write(self._ws.take())
        except OSError:  # TimeoutError included: a peer that reads nothing gets no close handshake
            self._lost()

    def _more(self) -> None:
        """The rest of what was read, after the message recv() returns: every message in it
        queued, control frames answered (a close noticed now, so that send() raises)."""
        ws, messages = self._ws, self._messages
        while ws.pending:
            message = ws.next()
            if message is not None:
                messages.append(message)
        if ws.out:
            self._flush()

    def _lost(self) -> None:
        self._ws.lost()
        self._sock.close()

    def recv(self, timeout: float) -> bytes | str:
        """The next message; raises ``TimeoutError`` or ``ConnectionClosed`` (at once after a
        protocol error: no message can follow it)."""
        messages = self._messages
        if messages:
            return messages.popleft()
        ws = self._ws
        start = time.monotonic()
        wait = timeout  # the same value call after call: SO_RCVTIMEO stays as it is
        while True:
            if ws.state == CLOSED or ws.failed:
                raise ws.closed()
            try:
                data = self._read_some(wait)
            except TimeoutError:
                raise
            except OSError:
                self._lost()
                raise ws.closed() from None
            if not data:
                self._lost()
                continue
            message = ws.receive(data)  # the hot path: one whole frame, no parser state
            if ws.out:
                self._flush()
            if message is not None:
                if ws.pending:
                    self._more()
                return message
            wait = timeout - (time.monotonic() - start)  # a message in several reads: what is left

    def send(self, data: bytes) -> None:
        ws = self._ws
        if ws.state != OPEN:
            raise ws.closed()
        try:
            self._write(ws.frame(data))
        except OSError:
            self._lost()
            raise ws.closed() from None

    def close(self) -> None:
        """Start the closing handshake if nobody has, then read until the server closes TCP
        (at most 2 s), and close the socket."""
        if self._sock.fileno() < 0:
            return
        ws = self._ws
        try:
            ws.close(1000)
            deadline = time.monotonic() + 2.0
            while True:
                if ws.out:
                    self._write(ws.take())
                if ws.state == CLOSED:
                    break
                data = self._read_some(deadline - time.monotonic())
                if not data:
                    break
                ws.receive(data)  # a close frame recorded, anything else dropped
        except (OSError, TimeoutError, ConnectionClosed):
            pass
        finally:
            self._lost()


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
