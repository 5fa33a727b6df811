"""A worker's blocking slot WebSocket client (pytest_hud.wire.wsclient): what it reads, raises and sends.

Its peers: the bridge's own server (tests/wirepeers.py's echo), websockets' server (pings,
fragments, close codes, a refusal by HTTP status), and a raw server written here that breaks the
protocol on purpose.
"""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
from typing import Any

import pytest
from websockets.asyncio.server import serve
from websockets.exceptions import ConnectionClosed, InvalidStatus, InvalidURI
from websockets.frames import Close, Opcode

from pytest_hud.wire.wsclient import BlockingWebSocket, unix_connection
from wirepeers import accept_raw, start_echo_server

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def echo_server():
    url, handler, stop = start_echo_server()
    yield url, handler
    stop()


def test_it_talks_to_the_bridges_server_at_every_frame_size(echo_server):
    url, handler = echo_server
    ws = BlockingWebSocket(url, 1 << 20)
    assert ws.recv(5) == b"hello"
    for n in (0, 1, 125, 126, 65535, 65536, 300_000):  # each length encoding; one read and many
        ws.send(bytes(n))
        got = ws.recv(5)
        assert got == bytes(n) and type(got) is bytes
    ws.close()
    assert handler.closed == [1000]  # close() completes the closing handshake before it returns


def test_a_read_times_out_and_the_connection_stays_usable(echo_server):
    url, handler = echo_server
    ws = BlockingWebSocket(url, 1 << 20)
    assert ws.recv(5) == b"hello"
    for wait in (0.2, 0.4, 0.2):  # the kernel's read timeout follows each call's own
        with pytest.raises(TimeoutError):
            ws.recv(wait)
        ws.send(b"still here")
        assert ws.recv(5) == b"still here"
    ws.close()
    assert handler.closed == [1000]


def test_the_bridges_error_frame_is_read_before_its_close_is_raised(echo_server):
    url, _ = echo_server
    ws = BlockingWebSocket(url, 1 << 20)
    ws.recv(5)
    ws._ws.send_text(b"oops")  # a text frame, which the bridge refuses
    ws._flush()
    assert ws.recv(5) == "no text please: oops"
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(5)
    assert closed.value.rcvd == Close(1008, "text refused")
    with pytest.raises(ConnectionClosed):
        ws.send(b"late")
    ws.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract Unix sockets are Linux's")
def test_on_the_servers_host_it_takes_the_unix_socket_and_falls_back_to_tcp(echo_server):
    url, handler = echo_server
    ws = BlockingWebSocket(url, 1 << 20, sock=unix_connection(handler.unix, 5))
    assert ws.unix and ws._sock.family == socket.AF_UNIX
    assert ws.recv(5) == b"hello"
    for n in (3, 70_000, 300_000):
        ws.send(bytes(n))
        assert ws.recv(5) == bytes(n)
    ws.close()
    # a name that is not on this host (another machine, or a bridge that is gone): TCP
    ws = BlockingWebSocket(url, 1 << 20, sock=unix_connection("@pytest-hud-ws-0-not-here", 5))
    assert not ws.unix and ws._sock.family == socket.AF_INET
    assert ws.recv(5) == b"hello"
    ws.close()
    assert handler.closed == [1000, 1000]


# ------------------------------------------------------------- against websockets' server
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
    assert started.wait(10)
    yield f"ws://127.0.0.1:{box['server'].sockets[0].getsockname()[1]}"
    loop.call_soon_threadsafe(box["stop"].set_result, None)
    thread.join(10)


def test_it_answers_pings_joins_fragments_and_reads_the_close_code(websockets_server):
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


def test_a_refused_upgrade_raises_invalid_status_and_headers_are_sent(websockets_server):
    with pytest.raises(InvalidStatus) as refused:
        BlockingWebSocket(websockets_server + "/secret", 1 << 20)
    assert refused.value.response.status_code == 401
    ws = BlockingWebSocket(websockets_server + "/secret", 1 << 20, headers={"Authorization": "Api-Key k"})
    assert ws.recv(5) == b"abc"
    ws.close()


@pytest.mark.parametrize("url", ["wss://127.0.0.1:1", "http://127.0.0.1:1", "ws://"])
def test_urls_it_cannot_dial_are_refused(url):
    with pytest.raises(InvalidURI):
        BlockingWebSocket(url, 1 << 20)


# ------------------------------------------------------------- against a raw server
@pytest.fixture
def raw_server():
    """``connect() -> (BlockingWebSocket, RawPeer)``: our client, upgraded by a raw server end."""
    listener = socket.create_server(("127.0.0.1", 0))
    peers: list[Any] = []

    def connect():
        box: dict[str, Any] = {}
        thread = threading.Thread(target=lambda: box.setdefault("peer", accept_raw(listener)), daemon=True)
        thread.start()
        ws = BlockingWebSocket(f"ws://127.0.0.1:{listener.getsockname()[1]}", 1 << 20)
        thread.join(5)
        peers.append(box["peer"])
        return ws, box["peer"]

    yield connect
    for peer in peers:
        peer.sock.close()
    listener.close()


def test_its_frames_are_masked_and_a_ping_is_answered_with_its_payload(raw_server):
    ws, peer = raw_server()
    peer.send(Opcode.PING, b"you there?")
    peer.send(Opcode.BINARY, b"obs")
    assert ws.recv(5) == b"obs"
    ws.send(b"act")  # the raw server's parser refuses unmasked frames: these are masked
    assert peer.frame() == (Opcode.PONG, b"you there?")
    assert peer.frame() == (Opcode.BINARY, b"act")
    ws.close()


def test_a_close_right_behind_a_message_fails_the_next_send(raw_server):
    """The message is read; the close that came with it is noticed at once, so the episode's next
    action raises instead of going nowhere."""
    ws, peer = raw_server()
    peer.sock.sendall(peer.raw(Opcode.BINARY, b"last obs") + peer.raw(Opcode.CLOSE, Close(1011, "sim failed").serialize()))
    assert ws.recv(5) == b"last obs"
    with pytest.raises(ConnectionClosed) as closed:
        ws.send(b"next action")
    assert closed.value.rcvd == Close(1011, "sim failed")
    assert peer.frame() == (Opcode.CLOSE, Close(1011, "sim failed"))  # echoed


def test_a_protocol_error_raises_at_once_instead_of_waiting_for_the_timeout(raw_server):
    """A masked frame from a server breaks RFC 6455: the client fails the connection with 1002 and
    ``recv`` raises ConnectionClosed, not the TimeoutError of a client that kept reading."""
    ws, peer = raw_server()
    peer.send(Opcode.BINARY, b"masked", mask=True)
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(30)
    assert closed.value.sent.code == 1002 and closed.value.rcvd is None
    opcode, close = peer.frame()
    assert opcode is Opcode.CLOSE and close.code == 1002
    with pytest.raises(ConnectionClosed):
        ws.send(b"late")
    peer.sock.shutdown(socket.SHUT_WR)  # the server ends TCP...
    ws.close()  # ...so close() returns once it has read that far
    assert ws._sock.fileno() < 0 and peer.eof(5)


def test_text_that_is_not_utf8_fails_the_connection_with_1007(raw_server):
    ws, peer = raw_server()
    peer.send(Opcode.TEXT, b"\xff\xfe")
    with pytest.raises(ConnectionClosed) as closed:
        ws.recv(30)
    assert closed.value.sent.code == 1007
    opcode, close = peer.frame()
    assert opcode is Opcode.CLOSE and close.code == 1007
    ws.close()
