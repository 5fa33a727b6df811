"""The lean WebSocket layer against RFC 6455 and websockets: pytest_hud.wire.websocket (frames),
.wire.wsstate (the one connection state machine), .bridge.wsserver and .wire.wsclient (its I/O).

websockets is the reference peer: its client talks to our server and its server to our client,
including what the per-step path never does itself (fragments, pings, close codes, refusals).
The state machine's rules are checked on both roles twice: sans I/O, and through each shell
against a peer written here byte by byte (so that a shell with rules of its own fails them).
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI
from websockets.frames import Close, Frame, Opcode
from websockets.sync.client import connect, unix_connect

from pytest_hud.bridge.wsserver import serve_ws
from pytest_hud.wire.wsclient import BlockingWebSocket, unix_connection
from pytest_hud.wire.websocket import (
    OP_BINARY, OP_CLOSE, OP_CONT, OP_PING, OP_PONG, OP_TEXT, FrameReader, HandshakeError, ProtocolError,
    accept_key, client_request, close_payload, encode_frame, parse_request, switching_protocols,
)
from pytest_hud.wire.wsstate import CLOSED, CLOSING, END, OPEN, WsState

pytestmark = pytest.mark.timeout(60)


# ------------------------------------------------------------------ frames
def test_accept_key_is_rfc_6455s_example():
    assert accept_key("dGhlIHNhbXBsZSBub25jZQ==") == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


@settings(max_examples=200, deadline=None)
@given(payload=st.binary(max_size=70000), mask=st.booleans(), cuts=st.lists(st.integers(1, 5000), max_size=6))
def test_frames_round_trip_however_the_bytes_are_split(payload, mask, cuts):
    data = encode_frame(OP_BINARY, payload, mask=mask) + encode_frame(OP_PING, b"p", mask=mask)
    reader = FrameReader(1 << 20, masked=mask)
    got, at = [], 0
    for cut in cuts + [len(data)]:
        reader.feed(data[at:at + cut])
        at += cut
        while (message := reader.next()) is not None:
            got.append(message)
    assert got == [(OP_BINARY, payload), (OP_PING, b"p")]


@settings(max_examples=300, deadline=None)
@given(payload=st.binary(max_size=70000), mask=st.booleans(), reader_masked=st.booleans(),
       opcode=st.sampled_from([OP_BINARY, OP_TEXT, OP_PING]), fin=st.booleans(),
       cut=st.integers(-3, 3), pending=st.booleans())
def test_a_whole_frame_read_at_once_is_what_the_parser_reads(payload, mask, reader_masked, opcode, fin, cut,
                                                              pending):
    """``whole`` answers only for one complete final binary frame, masked as the side expects, with
    nothing buffered before it, and then with the parser's payload; else None, leaving the reader
    as it was (a frame cut short or followed by more bytes, a fragment, text, a control frame)."""
    if opcode == OP_PING:
        payload = payload[:125]
    frame = encode_frame(opcode, payload, mask=mask)
    if not fin:
        frame = bytes((frame[0] & 0x7F,)) + frame[1:]
    data = frame[:len(frame) + cut] if cut < 0 else frame + b"\x82\x00" * cut
    reader = FrameReader(1 << 20, masked=reader_masked)
    if pending:
        reader.feed(encode_frame(OP_BINARY, b"first", mask=reader_masked)[:3])
    got = reader.whole(data)
    takes = (not pending and cut == 0 and opcode == OP_BINARY and fin and mask == reader_masked
             and len(payload) <= 1 << 20)
    assert (got is not None) == takes
    if takes:
        assert got == payload
        assert reader.whole(encode_frame(OP_BINARY, b"next", mask=mask)) == b"next"  # nothing was kept
    elif not pending and mask == reader_masked:
        reader.feed(data)  # the parser still reads what whole() declined
        messages = []
        try:
            while (message := reader.next()) is not None:
                messages.append(message)
        except ProtocolError:
            return
        if cut >= 0 and fin:
            assert messages[0] == (opcode, payload.decode() if opcode == OP_TEXT else payload)


def test_whole_refuses_a_frame_over_the_limit_and_the_parser_names_it():
    frame = encode_frame(OP_BINARY, b"x" * 200, mask=False)
    reader = FrameReader(100, masked=False)
    assert reader.whole(frame) is None
    reader.feed(frame)
    with pytest.raises(ProtocolError) as error:
        reader.next()
    assert error.value.code == 1009


def test_our_frames_are_the_bytes_websockets_writes():
    for n in (0, 125, 126, 65535, 65536):
        payload = bytes(range(256)) * (n // 256) + bytes(n % 256)
        theirs = Frame(Opcode.BINARY, payload).serialize(mask=False, extensions=[])
        assert encode_frame(OP_BINARY, payload) == theirs


def test_fragments_join_into_one_message_and_controls_pass_between():
    reader = FrameReader(1 << 20, masked=True)
    parts = [(0x00 | OP_TEXT, "héllo ".encode()), (OP_CONT, b"wor"), (0x80 | OP_CONT, b"ld")]
    data = b""
    for first, payload in parts:
        frame = encode_frame(first & 0x0F, payload, mask=True)
        data += bytes((frame[0] & 0x7F | (first & 0x80),)) + frame[1:]
        if payload == b"wor":
            data += encode_frame(OP_PING, b"!", mask=True)
    reader.feed(data)
    assert reader.next() == (OP_PING, b"!")
    assert reader.next() == (OP_TEXT, "héllo world")
    assert reader.next() is None


@pytest.mark.parametrize("data, code", [
    (encode_frame(OP_BINARY, b"x", mask=False), 1002),  # a client frame without a mask
    (bytes((0x80 | 0x40 | OP_BINARY, 0x80)) + b"\0\0\0\0", 1002),  # a reserved bit
    (bytes((0x80 | 0x3, 0x80)) + b"\0\0\0\0", 1002),  # an unknown opcode
    (encode_frame(OP_CONT, b"x", mask=True), 1002),  # a continuation of nothing
    (bytes((OP_PING, 0x80)) + b"\0\0\0\0", 1002),  # a fragmented control frame
    (encode_frame(OP_TEXT, b"\xff\xfe", mask=True), 1007),  # text that is not UTF-8
    (encode_frame(OP_CLOSE, b"\x03\xed", mask=True), 1002),  # close code 1005 on the wire
    (bytes((0x82, 0xFF)) + (1 << 40).to_bytes(8, "big"), 1009),  # over the limit, from its header
], ids=["unmasked", "reserved-bit", "opcode", "lone-continuation", "fragmented-ping", "bad-utf8",
        "close-1005", "oversize"])
def test_protocol_violations_name_their_close_code(data, code):
    reader = FrameReader(1 << 20, masked=True)
    reader.feed(data)
    with pytest.raises(ProtocolError) as error:
        reader.next()
    assert error.value.code == code


def test_a_fragmented_message_over_the_limit_is_refused():
    reader = FrameReader(10, masked=True)
    first = encode_frame(OP_BINARY, b"123456", mask=True)
    reader.feed(bytes((first[0] & 0x7F,)) + first[1:] + encode_frame(OP_CONT, b"123456", mask=True))
    with pytest.raises(ProtocolError) as error:
        reader.next()
    assert error.value.code == 1009


@pytest.mark.parametrize("request_head, status", [
    (b"POST / HTTP/1.1\r\nHost: x", 405),
    (b"GET / HTTP/1.1\r\nHost: x", 426),  # a plain HTTP request
    ((b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 8\r\n"
     b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ=="), 426),
    ((b"GET / HTTP/1.1\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\n"
     b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: short"), 400),
    (b"GET / HTTP/1.0\r\nUpgrade: websocket", 400),
])
def test_bad_upgrade_requests_get_an_http_status(request_head, status):
    with pytest.raises(HandshakeError) as error:
        parse_request(request_head)
    assert error.value.status == status


# ------------------------------------------------------------ our server
class Echo:
    """Echoes binary messages; answers text with a text error frame and a 1008 close."""

    def __init__(self) -> None:
        self.closed: list[int | None] = []

    def ws_open(self, conn):
        conn.send(b"hello")

    def ws_message(self, conn, data):
        if isinstance(data, str):
            conn.send(f"no text please: {data}")
            conn.close(1008, "text refused")
        else:
            conn.send(data)

    def ws_closed(self, conn):
        self.closed.append(conn.close_rcvd)


@pytest.fixture
def echo_server():
    loop = asyncio.new_event_loop()
    handler = Echo()
    started = threading.Event()
    box: dict[str, Any] = {}

    def run():
        asyncio.set_event_loop(loop)
        box["server"] = loop.run_until_complete(serve_ws(handler, "127.0.0.1", 0, 1 << 20, unix=True))
        handler.unix = box["server"].unix
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait(10)
    yield f"ws://127.0.0.1:{box['server'].port}", handler
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def test_websockets_client_talks_to_our_server_fragments_pings_and_close(echo_server):
    url, handler = echo_server
    with connect(url, compression=None, ping_interval=None) as ws:
        assert ws.recv(5) == b"hello"
        ws.send([b"frag", b"mented"])  # an iterable: websockets sends it as fragments
        assert ws.recv(5) == b"fragmented"
        ws.ping(b"hi").wait(5)  # answered with a pong
        big = bytes(200_000)
        ws.send(big)
        assert ws.recv(5) == big
    assert handler.closed == [1000] or handler.closed == []  # the close handshake completed
    with connect(url, compression=None) as ws:  # a client offering permessage-deflate: declined
        ws.recv(5)
        ws.send(b"x" * 1000)
        assert ws.recv(5) == b"x" * 1000


def test_our_server_refuses_text_readably_and_oversize_with_1009(echo_server):
    url, _ = echo_server
    with connect(url, compression=None, ping_interval=None, max_size=None) as ws:
        ws.recv(5)
        ws.send("oops")
        assert ws.recv(5) == "no text please: oops"
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(5)
        assert closed.value.rcvd.code == 1008 and closed.value.rcvd.reason == "text refused"
    with connect(url, compression=None, ping_interval=None, max_size=None) as ws:
        ws.recv(5)
        try:
            ws.send(bytes((1 << 20) + 1))
        except ConnectionClosed:
            pass
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(5)
        assert closed.value.rcvd.code == 1009


def test_our_server_answers_plain_http_with_426(echo_server):
    url, _ = echo_server
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 426 ") and b"WebSocket" in answer


def test_our_client_talks_to_our_server(echo_server):
    url, handler = echo_server
    ws = BlockingWebSocket(url, 1 << 20)
    assert ws.recv(5) == b"hello"
    for n in (0, 1, 125, 126, 65536, 300_000):
        ws.send(bytes(n))
        assert ws.recv(5) == bytes(n)
    ws.close()
    assert handler.closed == [1000]


def test_our_clients_reads_time_out_and_the_connection_stays_usable(echo_server):
    url, handler = echo_server
    ws = BlockingWebSocket(url, 1 << 20)
    assert ws.recv(5) == b"hello"
    for wait in (0.2, 0.4, 0.2):  # the kernel's read timeout follows each call's own
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            ws.recv(wait)
        assert wait * 0.9 <= time.monotonic() - t0 < wait + 1.5
        ws.send(b"still here")
        assert ws.recv(5) == b"still here"
    ws.close()
    assert handler.closed == [1000]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract Unix sockets are Linux's")
def test_on_the_servers_host_our_client_takes_its_unix_socket_and_falls_back_to_tcp(echo_server):
    url, handler = echo_server
    assert handler.unix.startswith("@pytest-hud-ws-")
    ws = BlockingWebSocket(url, 1 << 20, sock=unix_connection(handler.unix, 5))
    assert ws._sock.family == socket.AF_UNIX
    assert ws.recv(5) == b"hello"
    for n in (3, 70_000, 300_000):  # one read and many
        ws.send(bytes(n))
        assert ws.recv(5) == bytes(n)
    ws.close()
    # the same plain WebSocket: websockets' own client speaks it over the Unix socket
    with unix_connect("\0" + handler.unix[1:], url, compression=None, ping_interval=None) as other:
        assert other.recv(5) == b"hello"
    # a name that is not on this host (another machine, or a bridge that is gone): TCP
    ws = BlockingWebSocket(url, 1 << 20, sock=unix_connection("@pytest-hud-ws-0-not-here", 5))
    assert ws._sock.family == socket.AF_INET
    assert ws.recv(5) == b"hello"
    ws.close()
    assert handler.closed.count(1000) == 3


# ------------------------------------------------------------- our client
@pytest.fixture
def websockets_server():
    """websockets' server: pings first, sends fragments, then closes with 4000; refuses /secret."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    box: dict[str, Any] = {}

    async def handler(ws):
        await ws.ping(b"are you there")
        await ws.send([b"a", b"b", b"c"])  # fragments
        await ws.send("text")
        msg = await ws.recv()
        await ws.send(msg)
        await ws.close(4000, "done here")

    async def refuse(connection, request):
        if request.path == "/secret" and request.headers.get("Authorization") != "Api-Key k":
            return connection.respond(401, "key please\n")
        return None

    def run():
        asyncio.set_event_loop(loop)

        async def main():
            box["stop"] = asyncio.get_running_loop().create_future()
            async with serve(handler, "127.0.0.1", 0, process_request=refuse, compression=None) as server:
                box["server"] = server
                started.set()
                await box["stop"]

        loop.run_until_complete(main())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait(10)
    yield f"ws://127.0.0.1:{box['server'].sockets[0].getsockname()[1]}"
    loop.call_soon_threadsafe(box["stop"].set_result, None)
    thread.join(10)


def test_our_client_answers_pings_joins_fragments_and_reads_the_close_code(websockets_server):
    ws = BlockingWebSocket(websockets_server, 1 << 20)
    assert ws.recv(5) == b"abc"
    assert ws.recv(5) == "text"
    ws.send(b"back")
    assert ws.recv(5) == b"back"
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(5)
    assert closed.value.rcvd == Close(4000, "done here")
    with pytest.raises(ConnectionClosed):
        ws.send(b"late")
    ws.close()


def test_our_client_raises_invalid_status_with_the_http_status(websockets_server):
    with pytest.raises(InvalidStatus) as refused:
        BlockingWebSocket(websockets_server + "/secret", 1 << 20)
    assert refused.value.response.status_code == 401
    ws = BlockingWebSocket(websockets_server + "/secret", 1 << 20, headers={"Authorization": "Api-Key k"})
    assert ws.recv(5) == b"abc"
    ws.close()


@pytest.mark.parametrize("url", ["wss://127.0.0.1:1", "http://127.0.0.1:1", "ws://"])
def test_our_client_refuses_urls_it_cannot_dial(url):
    with pytest.raises(InvalidURI):
        BlockingWebSocket(url, 1 << 20)


# ------------------------------------------- one state machine, both roles (sans I/O)
ROLES = pytest.mark.parametrize("client", [True, False], ids=["client", "server"])


def _open(client: bool, max_size: int = 1 << 20) -> WsState:
    """A WsState of the role, through its opening handshake with a peer of the other role."""
    ws, peer = WsState(max_size, client), WsState(max_size, not client)
    first, second = (ws, peer) if client else (peer, ws)
    first.request("example", 80, "/")
    assert second.receive_head(first.take()) == b""
    assert first.receive_head(second.take()) == b""
    assert ws.state == OPEN and peer.state == OPEN and not ws.out
    return ws


def _written(ws: WsState) -> list:
    """The frames ``ws`` queued, read as its peer reads them (masked iff ``ws`` is the client)."""
    reader = FrameReader(1 << 20, masked=ws.client)
    reader.feed(ws.take())
    frames = []
    while (frame := reader.next()) is not None:
        frames.append(frame)
    return frames


def _from_peer(ws: WsState, opcode: int, payload: bytes) -> bytes:
    return encode_frame(opcode, payload, mask=not ws.client)


@ROLES
def test_frames_are_masked_by_role_and_the_peers_must_be_the_other_way(client):
    ws = _open(client)
    data = ws.frame(b"step")
    assert bool(data[1] & 0x80) is client  # RFC 6455 §5.3: a client masks, a server does not
    assert FrameReader(1 << 20, masked=client).whole(data) == b"step"
    assert ws.receive(_from_peer(ws, OP_BINARY, b"obs")) == b"obs"
    assert ws.receive(encode_frame(OP_BINARY, b"obs", mask=client)) is None  # masked the wrong way
    why = "server frames must not be masked" if client else "client frames must be masked"
    assert ws.failed and _written(ws) == [(OP_CLOSE, Close(1002, why))]


@ROLES
def test_a_ping_is_answered_with_its_payload_on_both_roles(client):
    ws = _open(client)
    got = ws.receive(_from_peer(ws, OP_PING, b"you there?") + _from_peer(ws, OP_BINARY, b"obs"))
    assert got == b"obs"
    assert _written(ws) == [(OP_PONG, b"you there?")]
    ws.close()
    ws.take()
    assert ws.receive(_from_peer(ws, OP_PING, b"late")) is None and not ws.out  # not once closing


@ROLES
@pytest.mark.parametrize("rcvd, echo", [
    (Close(1005, ""), Close(1000, "")),  # a close frame without a code
    (Close(4001, "bye"), Close(4001, "")),
    (Close(1001, "going"), Close(1001, "")),
], ids=["no-code", "4001", "1001"])
def test_the_peers_close_is_echoed_with_its_code_1000_when_it_sent_none(client, rcvd, echo):
    """One echo rule for both roles (the server used to echo an empty close as empty, the client
    as 1000): the peer's code without its reason, 1000 for a close frame that carried none."""
    ws = _open(client)
    theirs = b"" if rcvd.code == 1005 else close_payload(rcvd.code, rcvd.reason)
    assert ws.receive(_from_peer(ws, OP_CLOSE, theirs) + _from_peer(ws, OP_BINARY, b"after")) is None
    assert ws.state == CLOSING and ws.rcvd == rcvd and ws.sent == echo and ws.rcvd_first
    assert ws.eof is (not client) and (ws.out[-1] == END) is (not client)  # the server closes TCP first
    assert _written(ws) == [(OP_CLOSE, echo)]
    closed = ws.closed()
    assert (closed.rcvd, closed.sent, closed.rcvd_then_sent) == (rcvd, echo, True)
    assert ws.receive(_from_peer(ws, OP_BINARY, b"more")) is None and not ws.out  # nothing after it
    assert ws.lost() and ws.state == CLOSED


@ROLES
def test_a_close_answering_ours_is_not_echoed_and_both_are_kept_in_order(client):
    ws = _open(client)
    assert ws.close(4000, "done") and not ws.close(1000)
    assert _written(ws) == [(OP_CLOSE, Close(4000, "done"))]
    assert ws.receive(_from_peer(ws, OP_BINARY, b"late data")) is None  # dropped once closing
    assert ws.receive(_from_peer(ws, OP_CLOSE, close_payload(4000))) is None
    assert ws.take() == b"" and ws.eof is (not client)
    closed = ws.closed()
    assert (closed.rcvd, closed.sent, closed.rcvd_then_sent) == (Close(4000, ""), Close(4000, "done"), False)


@ROLES
@pytest.mark.parametrize("bad, code", [(bytes((0x80 | 0x40 | OP_BINARY, 0)), 1002), ("text", 1007),
                                       ("oversize", 1009)], ids=["reserved-bit", "utf8", "size"])
def test_a_protocol_error_fails_the_connection_the_same_way_on_both_roles(client, bad, code):
    """One failure rule for both roles (the client used to close its socket at once): the close
    frame with the error's code, nothing the peer sends after read; then, as after any close,
    the server ends TCP (END) and the client waits for it to."""
    ws = _open(client, max_size=100)
    if bad == "text":
        bad = _from_peer(ws, OP_TEXT, b"\xff")
    elif bad == "oversize":
        bad = _from_peer(ws, OP_BINARY, bytes(101))
    assert ws.receive(_from_peer(ws, OP_BINARY, b"before") + bad) == b"before" and ws.pending
    assert ws.next() is None
    assert ws.failed and ws.state == CLOSING and not ws.pending
    assert ws.sent.code == code and ws.rcvd is None
    assert ws.eof is (not client) and (ws.out[-1] == END) is (not client)
    assert [frame[0] for frame in _written(ws)] == [OP_CLOSE]
    assert ws.receive(_from_peer(ws, OP_BINARY, b"after")) is None and not ws.out  # discarded
    assert ws.receive(_from_peer(ws, OP_CLOSE, close_payload(1000))) is None and ws.rcvd is None
    closed = ws.closed()
    assert closed.sent.code == code and closed.rcvd is None and closed.rcvd_then_sent is None


def test_frames_after_a_message_wait_until_the_caller_asks_for_them():
    """receive() returns the first message; the frames after it are looked at only by next(), so
    a server's handler acts on one message before the next frame (a close, say) is taken."""
    ws = _open(False)
    data = b"".join(_from_peer(ws, op, p) for op, p in
                    [(OP_BINARY, b"a"), (OP_PING, b"p"), (OP_BINARY, b"b"), (OP_CLOSE, close_payload(1000))])
    assert ws.receive(data) == b"a" and ws.pending and not ws.out
    assert ws.next() == b"b" and _written(ws) == [(OP_PONG, b"p")]
    assert ws.next() is None and not ws.pending and ws.rcvd == Close(1000, "")
    assert _written(ws) == [(OP_CLOSE, Close(1000, ""))] and ws.eof


@pytest.mark.parametrize("client", [True, False], ids=["client", "server"])
def test_a_handshake_that_cannot_succeed_closes_and_says_why(client):
    ws = WsState(1 << 20, client)
    if client:
        ws.request("example", 80, "/")
        ws.take()
        with pytest.raises(HandshakeError) as error:
            ws.receive_head(b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 4\r\n\r\nkey?")
        assert (error.value.status, error.value.body) == (401, b"key?") and not ws.out
    else:
        assert ws.receive_head(b"GET / HTTP/1.1\r\nHost: x\r\n") is None  # not all there yet
        with pytest.raises(HandshakeError) as error:
            ws.receive_head(b"\r\n")
        assert error.value.status == 426 and ws.out[-1] == END and ws.take().startswith(b"HTTP/1.1 426 ")
    assert ws.state == CLOSED and not ws.lost()


# --------------------------------------- one state machine, both roles (through each shell)
class RawPeer:
    """One end of a WebSocket written here byte by byte: frames in, frames out, EOF seen."""

    def __init__(self, sock: socket.socket, client: bool, rest: bytes = b"") -> None:
        self.sock, self.client = sock, client
        self.reader = FrameReader(1 << 20, masked=not client)  # a server's frames must not be masked
        self.reader.feed(rest)

    def send(self, opcode: int, payload: bytes, mask: bool | None = None) -> None:
        self.sock.sendall(encode_frame(opcode, payload, mask=self.client if mask is None else mask))

    def frame(self, timeout: float = 5.0):
        self.sock.settimeout(timeout)
        while (frame := self.reader.next()) is None:
            data = self.sock.recv(65536)
            assert data, "EOF before a whole frame"
            self.reader.feed(data)
        return frame

    def eof(self, timeout: float) -> bool:
        """Whether the other end ends TCP within ``timeout`` s (anything it sends first is an error)."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return False
        assert data == b"", data
        return True


def _raw_client(url: str) -> RawPeer:
    port = int(url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(client_request("127.0.0.1", port, "/")[0])
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(4096)
    answer, rest = head.split(b"\r\n\r\n", 1)
    assert answer.startswith(b"HTTP/1.1 101 ")
    peer = RawPeer(sock, client=True, rest=rest)
    assert peer.frame() == (OP_BINARY, b"hello")  # Echo's greeting, unmasked
    return peer


@pytest.fixture
def raw_server():
    """``connect() -> (BlockingWebSocket, RawPeer)``: our client, upgraded by a server written here."""
    listener = socket.create_server(("127.0.0.1", 0))
    socks: list[socket.socket] = []

    def connect():
        box: dict[str, Any] = {}

        def accept():
            sock, _ = listener.accept()
            head = b""
            while b"\r\n\r\n" not in head:
                head += sock.recv(4096)
            sock.sendall(switching_protocols(parse_request(head.split(b"\r\n\r\n")[0])[2]))
            box["sock"] = sock

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        ws = BlockingWebSocket(f"ws://127.0.0.1:{listener.getsockname()[1]}", 1 << 20)
        thread.join(5)
        socks.append(box["sock"])
        return ws, RawPeer(box["sock"], client=False)

    yield connect
    for sock in socks:
        sock.close()
    listener.close()


def _eventually(check, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_our_server_answers_a_ping_and_echoes_a_codeless_close_with_1000(echo_server):
    url, handler = echo_server
    peer = _raw_client(url)
    peer.send(OP_PING, b"you there?")
    assert peer.frame() == (OP_PONG, b"you there?")  # unmasked: the peer's reader requires it
    peer.send(OP_BINARY, b"act")
    assert peer.frame() == (OP_BINARY, b"act")
    peer.send(OP_CLOSE, b"")  # a close frame without a code
    assert peer.frame() == (OP_CLOSE, Close(1000, ""))  # the old server echoed it empty (1005 here)
    assert peer.eof(5)  # and closed TCP: the server closes first
    peer.sock.close()
    assert _eventually(lambda: handler.closed == [1005])


def test_our_server_fails_a_protocol_error_with_its_code_then_eof_and_waits_for_the_peer(echo_server):
    url, handler = echo_server
    peer = _raw_client(url)
    peer.send(OP_BINARY, b"not masked", mask=False)
    assert peer.frame() == (OP_CLOSE, Close(1002, "client frames must be masked"))
    assert peer.eof(5)  # its side of TCP ended...
    peer.sock.sendall(encode_frame(OP_BINARY, b"more", mask=True))  # ...while it reads and drops ours
    time.sleep(0.2)
    assert handler.closed == []  # the connection lasts until the peer closes (or close_timeout, 2 s)
    peer.sock.close()
    assert _eventually(lambda: handler.closed == [None])


def test_our_client_answers_a_ping_masked_and_echoes_a_codeless_close_with_1000(raw_server):
    ws, peer = raw_server()
    peer.send(OP_PING, b"you there?")
    peer.send(OP_BINARY, b"obs")
    assert ws.recv(5) == b"obs"
    assert peer.frame() == (OP_PONG, b"you there?")  # masked: the peer's reader requires it
    ws.send(b"act")
    assert peer.frame() == (OP_BINARY, b"act")
    peer.send(OP_CLOSE, b"")
    peer.sock.shutdown(socket.SHUT_WR)  # the server closes TCP
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(5)
    assert (closed.value.rcvd, closed.value.sent, closed.value.rcvd_then_sent) == \
        (Close(1005, ""), Close(1000, ""), True)
    assert peer.frame() == (OP_CLOSE, Close(1000, ""))
    ws.close()


def test_our_client_fails_a_protocol_error_with_its_code_and_waits_for_the_server_to_close(raw_server):
    ws, peer = raw_server()
    peer.send(OP_BINARY, b"masked", mask=True)  # a server's frames must not be masked
    t0 = time.monotonic()
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(30)
    assert time.monotonic() - t0 < 5  # at once: no message can follow a protocol error
    assert closed.value.sent == Close(1002, "server frames must not be masked") and closed.value.rcvd is None
    assert peer.frame() == (OP_CLOSE, Close(1002, "server frames must not be masked"))
    assert not peer.eof(0.3)  # the client waits for the server to close TCP (it used to close at once)
    with pytest.raises(ConnectionClosed):
        ws.send(b"late")
    peer.send(OP_CLOSE, close_payload(1002))
    peer.sock.shutdown(socket.SHUT_WR)
    t0 = time.monotonic()
    ws.close()  # reads to the server's EOF, dropping its echo, then closes
    assert time.monotonic() - t0 < 1.5
    assert peer.eof(5)
