"""A blocking WebSocket client connection with no background thread, around websockets' sans-I/O ``ClientProtocol``.

websockets' own sync client hands every message from a receiving thread to the caller, which costs
a thread switch (and GIL contention) per observation. An episode is strictly request/response, so
this connection reads and writes the socket from the calling thread: send an action, read until
the next message, done. What the bytes mean (the upgrade, frames, pings, the closing handshake,
protocol errors) is websockets' ``ClientProtocol``; this module is its I/O: the socket (TCP, or the
bridge's abstract Unix socket on its host), kernel read timeouts, and a message queue. Errors are
websockets' exception types (``ConnectionClosed``, ``InvalidStatus``, ``InvalidHandshake``,
``InvalidURI``).
"""

from __future__ import annotations

import socket
import struct
import time
from collections import deque
from collections.abc import Mapping
from urllib.parse import urlsplit

from websockets.client import ClientProtocol
from websockets.exceptions import ConnectionClosed, ConnectionClosedError, ConnectionClosedOK, InvalidHandshake, InvalidURI
from websockets.frames import Frame
from websockets.protocol import State
from websockets.uri import parse_uri

from pytest_hud.wire.messages import MessageAssembly

__all__ = ["BlockingWebSocket", "unix_connection"]

#: The most one read takes from the socket (a larger frame takes several reads).
_READ_SIZE = 262144


class BlockingWebSocket:
    """``send(bytes)`` / ``recv(timeout) -> bytes | str`` over one TCP or Unix socket.

    ``sock``: a connection to the server's Unix socket (:func:`unix_connection`), else TCP to the
    URL's host. Messages read with the one ``recv`` returns wait in a queue; once the server's
    close frame or a protocol error is read, ``recv`` raises ``ConnectionClosed`` as soon as the
    queue is empty (no message can follow), and ``send`` at once."""

    def __init__(self, url: str, max_size: int, open_timeout: float = 30.0,
                 headers: Mapping[str, str] | None = None, sock: socket.socket | None = None) -> None:
        host, port, _ = _parse_url(url)
        self._ws = ClientProtocol(parse_uri(url), max_size=max_size)
        self._messages: deque[bytes | str] = deque()  # read, not yet asked for
        self._assembly = MessageAssembly()
        self._failed = False  # this side failed the connection (a text message that is not UTF-8)
        deadline = time.monotonic() + open_timeout
        self._sock = sock
        # One receive buffer for the connection's life: ``recv(262144)`` would allocate (mmap) and
        # free 256 KiB per read, with a page fault per 4 KiB received.
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
            self._handshake(dict(headers or {}), deadline)
        except BaseException:
            self._sock.close()
            raise

    def _handshake(self, headers: dict[str, str], deadline: float) -> None:
        ws = self._ws
        request = ws.connect()
        request.headers.update(headers)
        ws.send_request(request)
        self._flush()
        while True:
            data = self._read_some(deadline - time.monotonic())
            if data:
                ws.receive_data(data)
            else:
                ws.receive_eof()
            events = ws.events_received()
            if ws.handshake_exc is not None:
                raise ws.handshake_exc  # InvalidStatus (a refusal, with the server's answer) or InvalidHandshake
            if events:
                break
            if not data:
                raise InvalidHandshake("the server closed the connection during the WebSocket handshake")
        self._take(events[1:])  # frames that came with the answer
        self._flush()

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
        """Write what websockets queued (the request, pongs, close frames); its empty item, the end
        of this side of TCP, closes nothing here: the socket closes once the connection is over."""
        for data in self._ws.data_to_send():
            if data:
                self._write(data)

    def _take(self, events: list) -> None:
        """Queue the messages among ``events`` (text decoded; text that is not UTF-8 fails the
        connection with 1007)."""
        for event in events:
            if not isinstance(event, Frame):
                continue
            message = self._assembly.feed(event)
            if message is not None:
                self._queue(*message)

    def _queue(self, payload: bytes, text: bool) -> None:
        if not text:
            # websockets hands an unmasked frame's payload out as a bytearray: callers get bytes
            self._messages.append(payload if type(payload) is bytes else bytes(payload))
            return
        try:
            self._messages.append(payload.decode())
        except UnicodeDecodeError:
            self._ws.fail(1007, "text message is not valid UTF-8")
            self._failed = True

    def _over(self) -> bool:
        """No message can come any more: the server's close frame or a protocol error was read,
        or TCP is gone."""
        ws = self._ws
        return (ws.state is State.CLOSED or ws.close_rcvd is not None or ws.parser_exc is not None
                or self._failed)

    def _closed(self) -> ConnectionClosed:
        """``ConnectionClosed`` with both close frames as they are now (websockets' ``close_exc``
        waits for TCP to end; this one is raised as soon as no message can come)."""
        ws = self._ws
        rcvd, sent = ws.close_rcvd, ws.close_sent
        clean = rcvd is not None and sent is not None and rcvd.code in (1000, 1001) and sent.code in (1000, 1001)
        exc = (ConnectionClosedOK if clean else ConnectionClosedError)(rcvd, sent, ws.close_rcvd_then_sent)
        exc.__cause__ = ws.parser_exc
        return exc

    def _lost(self) -> None:
        self._ws.receive_eof()
        self._ws.state = State.CLOSED
        self._sock.close()

    def recv(self, timeout: float) -> bytes | str:
        """The next message; raises ``TimeoutError`` or ``ConnectionClosed`` (at once after the
        server's close frame or a protocol error: no message can follow them)."""
        messages = self._messages
        if messages:
            return messages.popleft()
        ws = self._ws
        start = time.monotonic()
        wait = timeout  # the same value call after call: SO_RCVTIMEO stays as it is
        while True:
            if self._over():
                raise self._closed()
            try:
                data = self._read_some(wait)
            except TimeoutError:
                raise
            except OSError:
                self._lost()
                raise self._closed() from None
            if not data:
                self._lost()
                continue
            ws.receive_data(data)
            self._take(ws.events_received())
            self._flush_or_lose()  # pongs, a close echoed or failed
            if messages:
                return messages.popleft()
            wait = timeout - (time.monotonic() - start)  # a message in several reads: what is left

    def _flush_or_lose(self) -> None:
        try:
            self._flush()
        except OSError:  # TimeoutError included: a peer that reads nothing gets no close handshake
            self._lost()

    def send(self, data: bytes) -> None:
        ws = self._ws
        if ws.state is not State.OPEN:
            raise self._closed()
        ws.send_binary(data)
        try:
            self._flush()
        except OSError:
            self._lost()
            raise self._closed() from None

    def close(self) -> None:
        """Start the closing handshake if nobody has, then read until the server closes TCP
        (at most 2 s), and close the socket."""
        if self._sock.fileno() < 0:
            return
        ws = self._ws
        try:
            if ws.state is State.OPEN:
                ws.send_close(1000)
            deadline = time.monotonic() + 2.0
            while True:
                self._flush()
                if ws.state is State.CLOSED:
                    break
                data = self._read_some(deadline - time.monotonic())
                if not data:
                    break
                ws.receive_data(data)  # a close frame recorded, anything else dropped
                ws.events_received()
        except (OSError, TimeoutError):
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
