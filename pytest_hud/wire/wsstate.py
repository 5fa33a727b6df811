"""One WebSocket connection's state machine, sans I/O: the one both ends of the per-step path run.

A worker's blocking client (:class:`pytest_hud.wire.wsclient.BlockingWebSocket`) and the bridge's
asyncio server (``pytest_hud.bridge.wsserver.WsConnection``) each hold a :class:`WsState` and do
only the I/O around it: they hand it the bytes they read, write the bytes it queues in ``out``,
and end TCP when it says so. What a frame means, what is answered, when the connection is over
and how it ended are decided here, once, for both roles (``client`` True or False).

The rules (RFC 6455), the same for both roles:

- **masking** by role: the client's frames are masked with a fresh key (§5.3), the server's are
  not; a frame from the peer masked the wrong way for its role is a protocol error.
- **data** messages are handed out only while OPEN; after this side's close frame they are
  dropped (§5.5.1).
- a **ping** is answered with a pong carrying its payload, while OPEN (§5.5.2).
- **close echo**: the peer's close frame, received while OPEN, is answered with a close frame
  carrying the peer's code (1000 when the peer's frame carried none: 1005 may not be sent), and no
  reason (§5.5.1: "typically echos the status code it received"). Nothing the peer sends after
  its close frame is read. Both close frames are kept, and which came first (``rcvd_first``):
  :meth:`WsState.closed` turns them into websockets' ``ConnectionClosed``.
- **failure** (§7.1.7): a frame RFC 6455 forbids, or a message over ``max_size``, fails the
  connection: while OPEN a close frame with the error's code and reason is sent; ``failed`` is set
  and everything the peer sends after is discarded. Then TCP closes as after any close:
- **the server closes TCP** (§7.1.1): once its closing handshake is over (the peer's close frame
  received) or the connection failed, the server's ``out`` ends with :data:`END` and ``eof`` is
  set: the server's shell ends its side of TCP there (after a failure by EOF only, reading and
  dropping whatever the peer still sends, so that the close frame is not lost to a reset). The
  client never queues it: it waits for the server to close TCP (its blocking shell raises
  ``ConnectionClosed`` at once after a failure, and reads to the server's EOF in ``close()``).

Before this module the two shells each had their own copy of these rules, and two differed: a
close frame without a code was echoed as 1000 by the client but as an empty close frame by the
server, and after a protocol error the client closed its socket at once while the server sent
EOF and discarded. The rules above are what both do now (and the server, which kept only the
peer's close code, now has both frames too: ``WsConnection.close_rcvd`` is still that code).

The hot path is :meth:`WsState.receive`: one method call, which tries ``FrameReader.whole`` first
(a whole message read in one piece, as an action or an observation nearly always is) and returns
it; the shell then checks ``out`` once. Only when that fails does it feed the reader and go
through the frames one by one (:meth:`WsState.next`, the rest of what was read, one message at a
time: a callback server hands each to its handler before the next frame is looked at, so a
handler that closes the connection drops what follows, as a frame loop in the shell did; the
blocking client drains the rest into its own queue at once, so that a close right behind a
message is noticed before its next ``send``).

Measured with ``benchmarks/ws_core.py`` (in process: the WebSocket layer alone, CPU µs per step,
server and blocking client; ``before`` is e96080e, the two shells with their own state machines,
run in the same rounds), on the 2-core machine while a CI run shared it (load average 2-3):

    $ PYTHONPATH=. python benchmarks/ws_core.py --rounds 7 --inproc-steps 200000 --no-loopback \
          --before e96080e --impls before
    median over 7 rounds of the per-round ratio to core (x>1: costs more than core)
       200 B server           before x0.94    µs (core / before): 1.31 / 1.23
       200 B blocking client  before x0.98    µs (core / before): 1.75 / 1.66
      64 KiB server           before x0.98    µs (core / before): 1.24 / 1.22
      64 KiB blocking client  before x0.98    µs (core / before): 6.12 / 6.05

So 2-6% more per step here (0.02-0.09 µs). Other runs that day: 200 B server x0.94-0.96, the rest
x0.95-1.01. Most of it is :meth:`WsState.frame`, one more Python call per message written: with
the server writing ``frame_header(...) + payload`` itself, as before, its 200 B row read x0.99
(11 rounds); it is kept, so that masking by role is decided in one place. :meth:`receive` costs
about nothing over the inlined ``whole()`` (the 64 KiB server row, whose large writes do not go
through ``frame``). Over loopback (``--rounds 3 --inproc-steps 0 --modes blocking --impls
before,floor``) the blocking pair's CPU per round trip was level: both x0.98 at 200 B, x1.00 at
64 KiB.
"""

from __future__ import annotations

from websockets.exceptions import ConnectionClosed
from websockets.frames import Close

from pytest_hud.wire.websocket import (
    MAX_HEAD, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG, OP_TEXT, FrameReader, HandshakeError, ProtocolError,
    client_request, close_payload, encode_frame, http_error, parse_request, parse_response,
    switching_protocols,
)

__all__ = ["CLOSED", "CLOSING", "CONNECTING", "END", "OPEN", "WsState"]

#: ``state``: the opening handshake is under way; open; a close frame was sent or received (the
#: closing handshake is under way, or over and TCP not yet closed); TCP is closed (or the opening
#: handshake was refused).
CONNECTING, OPEN, CLOSING, CLOSED = range(4)

#: The last item of ``out`` once this side ends TCP (then ``eof`` is True), as in websockets'
#: ``data_to_send``: the bytes before it are written first.
END = b""


class WsState:
    """One connection's WebSocket state, for the ``client`` or the server role.

    The shell feeds it: :meth:`request` (client) and :meth:`receive_head` until the opening
    handshake is over, then :meth:`receive` with each read and :meth:`next` while ``pending``;
    :meth:`lost` once TCP is gone. It writes :meth:`frame` for a message, calls :meth:`close` to
    start the closing handshake, and whenever ``out`` is not empty writes :meth:`take` (and ends
    TCP when ``eof`` is set).
    """

    __slots__ = ("accept", "client", "eof", "failed", "head", "out", "pending", "rcvd", "rcvd_first",
                 "reader", "sent", "state")

    def __init__(self, max_size: int, client: bool) -> None:
        self.client = client  # the role: masks what it writes, expects what it reads unmasked
        self.state = CONNECTING
        self.reader = FrameReader(max_size, masked=not client)
        self.head = b""  # the opening handshake's head, until its blank line
        self.accept = ""  # the client's: the Sec-WebSocket-Accept the server must answer with
        self.out: list[bytes] = []  # bytes to write, in order: handshake, pongs, close frames, END
        self.eof = False  # END is queued: this side ends TCP after writing what is before it
        self.failed = False  # the peer broke the protocol: nothing more of it is read
        self.pending = False  # the reader may hold more frames after the message just handed out
        self.rcvd: Close | None = None  # the peer's close frame
        self.sent: Close | None = None  # this side's close frame
        self.rcvd_first = False  # whether the peer's close came before this side's

    # ------------------------------------------------------------------ opening handshake
    def request(self, host: str, port: int, path: str, headers: dict[str, str] | None = None) -> None:
        """The client's upgrade request, queued in ``out``."""
        request, self.accept = client_request(host, port, path, headers)
        self.out.append(request)

    def receive_head(self, data: bytes) -> bytes | None:
        """Take bytes of the opening handshake: None until its head is complete, then the bytes
        after it (frames, for :meth:`receive`), with the state OPEN (the server's 101 in ``out``).

        Raises :class:`HandshakeError` when it cannot succeed, the state then CLOSED: a server
        has its refusal (``http_error``) and END queued; a client gets the answer's status (0: an
        answer that is not a valid upgrade), headers and body."""
        head = self.head + data
        end = head.find(b"\r\n\r\n")
        if end < 0:
            if len(head) > MAX_HEAD:
                raise self._refused(
                    HandshakeError(0, f"the server's answer to the upgrade is over {MAX_HEAD} bytes")
                    if self.client else HandshakeError(431, f"upgrade request over {MAX_HEAD} bytes"))
            self.head = head
            return None
        self.head = b""
        rest = head[end + 4:]
        try:
            if self.client:
                status, reason, headers = parse_response(head[:end], self.accept)
                if status != 101:
                    raise HandshakeError(status, reason, headers, rest)
            else:
                self.out.append(switching_protocols(parse_request(head[:end])[2]))
        except HandshakeError as exc:
            raise self._refused(exc)  # noqa: B904 - the error itself, not a new one
        self.state = OPEN
        return rest

    def _refused(self, error: HandshakeError) -> HandshakeError:
        """The handshake failed with ``error`` (returned, for the caller to raise)."""
        self.state = CLOSED
        if not self.client:
            self.out.append(http_error(error))
            self._end()
        return error

    # ------------------------------------------------------------------ receiving
    def receive(self, data: bytes) -> bytes | str | None:
        """Take bytes read once the connection is open: the first whole message in them (or
        completed by them), or None. Control frames on the way are answered in ``out``; when a
        message is returned with ``pending`` set, more frames may follow: :meth:`next`."""
        if self.state == OPEN:
            message = self.reader.whole(data)  # one whole frame (an action, an observation)
            if message is not None:
                return message
        if self.failed or self.rcvd is not None or self.state == CLOSED:
            return None  # after a failure, the peer's close or the end of TCP nothing is read
        self.reader.feed(data)
        return self.next()

    def next(self) -> bytes | str | None:
        """The next message among the frames already received, or None (then ``pending`` is
        False): data dropped unless OPEN, pings answered, the peer's close echoed, a protocol
        error failing the connection."""
        if self.failed or self.rcvd is not None or self.state == CLOSED:
            self.pending = False
            return None
        reader = self.reader
        try:
            while (frame := reader.next()) is not None:
                opcode, payload = frame
                if opcode == OP_BINARY or opcode == OP_TEXT:
                    if self.state == OPEN:
                        self.pending = True
                        return payload  # type: ignore[return-value]
                elif opcode == OP_PING:
                    if self.state == OPEN:
                        self.out.append(encode_frame(OP_PONG, payload, self.client))  # type: ignore[arg-type]
                elif opcode == OP_CLOSE:
                    self._close_received(payload)  # type: ignore[arg-type]
                    break
                # OP_PONG: nothing to do (no ping is sent from here)
        except ProtocolError as exc:
            self._fail(exc)
        self.pending = False
        return None

    def _close_received(self, close: Close) -> None:
        self.rcvd = close
        if self.state == OPEN:  # the echo rule: the peer's code, 1000 when it sent none
            self.rcvd_first = True
            self._send_close(close.code if close.code != 1005 else 1000, "")
        if not self.client:  # the closing handshake is over: the server closes TCP (§7.1.1)
            self._end()

    def _fail(self, exc: ProtocolError) -> None:
        """Fail the connection (RFC 6455 §7.1.7): the close frame with the error's code, if none
        was sent yet; nothing the peer sends after is read; the server then ends TCP."""
        self.failed = True
        if self.state == OPEN:
            self._send_close(exc.code, exc.reason)
        if not self.client:
            self._end()

    # ------------------------------------------------------------------ sending
    def frame(self, payload: bytes, opcode: int = OP_BINARY) -> bytes:
        """One final data frame of ``payload``, masked when this side is the client. The caller
        checks that the state is OPEN (a client raises, a server drops the message)."""
        return encode_frame(opcode, payload, self.client)

    def close(self, code: int = 1000, reason: str = "") -> bool:
        """Start the closing handshake with ``code`` and ``reason`` (the close frame in ``out``);
        False, and nothing queued, unless the connection is OPEN."""
        if self.state != OPEN:
            return False
        self._send_close(code, reason)
        return True

    def _send_close(self, code: int, reason: str) -> None:
        self.sent = Close(code, reason)
        self.out.append(encode_frame(OP_CLOSE, close_payload(code, reason), self.client))
        self.state = CLOSING

    def _end(self) -> None:
        if not self.eof:
            self.eof = True
            self.out.append(END)

    def take(self) -> bytes:
        """What ``out`` holds, joined, and ``out`` emptied (END joins as nothing: ``eof`` says it)."""
        out = self.out
        data = out[0] if len(out) == 1 else b"".join(out)
        out.clear()
        return data

    # ------------------------------------------------------------------ the end
    def lost(self) -> bool:
        """TCP is closed (EOF, a reset, or this side closed it); whether the connection had been
        open (OPEN or CLOSING) until then."""
        was_open = self.state == OPEN or self.state == CLOSING
        self.state = CLOSED
        self.pending = False
        return was_open

    def closed(self) -> ConnectionClosed:
        """websockets' ``ConnectionClosed`` for this connection: both close frames as received and
        sent (None where there was none), and their order when there were both."""
        both = self.rcvd is not None and self.sent is not None
        return ConnectionClosed(self.rcvd, self.sent, self.rcvd_first if both else None)
