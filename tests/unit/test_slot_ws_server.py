"""The bridge's slot WebSocket server (pytest_hud.bridge.wsserver): what a worker's socket sees of it.

websockets' own client is the well-behaved peer (fragments, pings, a large message, an offer of
compression); a raw client written here (tests/wirepeers.py) sends what no good client would and
reads exactly what comes back: close codes, echoes, the end of TCP, and which messages the
handler was handed.
"""

from __future__ import annotations

import socket
import sys
import time

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.frames import Close, Opcode
from websockets.sync.client import connect, unix_connect

from wirepeers import raw_client, start_echo_server

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def echo_server():
    url, handler, stop = start_echo_server()
    yield url, handler
    stop()


def _eventually(check, timeout: float = 10.0) -> bool:
    """A bounded wait: whether ``check()`` holds within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_websockets_client_talks_to_it_fragments_pings_and_close(echo_server):
    url, handler = echo_server
    with connect(url, compression=None, ping_interval=None) as ws:
        assert ws.recv(5) == b"hello"
        ws.send([b"frag", b"mented"])  # an iterable: websockets sends it as fragments
        assert ws.recv(5) == b"fragmented"
        ws.ping(b"hi").wait(5)  # answered with a pong
        big = bytes(200_000)
        ws.send(big)
        assert ws.recv(5) == big
    assert _eventually(lambda: handler.closed == [1000])  # the closing handshake completed


def test_an_offer_of_compression_is_declined_and_the_connection_works(echo_server):
    url, _ = echo_server
    with connect(url) as ws:  # websockets offers permessage-deflate by default
        assert ws.protocol.extensions == []
        ws.recv(5)
        ws.send(b"x" * 1000)
        assert ws.recv(5) == b"x" * 1000


def test_text_gets_a_readable_error_frame_then_a_1008_close(echo_server):
    url, _ = echo_server
    with connect(url, compression=None, ping_interval=None) as ws:
        ws.recv(5)
        ws.send("oops")
        assert ws.recv(5) == "no text please: oops"
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(5)
        assert closed.value.rcvd == Close(1008, "text refused")


def test_a_message_over_the_size_limit_closes_with_1009(echo_server):
    url, _ = echo_server
    with connect(url, compression=None, ping_interval=None, max_size=None) as ws:
        ws.recv(5)
        try:
            ws.send(bytes((1 << 20) + 1))
        except ConnectionClosed:
            pass
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(5)
        assert closed.value.rcvd.code == 1009


def test_plain_http_is_answered_with_426_naming_websocket(echo_server):
    url, _ = echo_server
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 426 ") and b"WebSocket" in answer


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract Unix sockets are Linux's")
def test_the_same_websocket_listens_on_an_abstract_unix_socket(echo_server):
    url, handler = echo_server
    assert handler.unix.startswith("@pytest-hud-ws-")
    with unix_connect("\0" + handler.unix[1:], url, compression=None, ping_interval=None) as ws:
        assert ws.recv(5) == b"hello"
        ws.send(bytes(70_000))
        assert ws.recv(5) == bytes(70_000)


def test_a_ping_is_answered_and_a_codeless_close_is_echoed_then_the_server_ends_tcp(echo_server):
    url, handler = echo_server
    peer = raw_client(url)
    peer.send(Opcode.PING, b"you there?")
    assert peer.frame() == (Opcode.PONG, b"you there?")
    peer.send(Opcode.BINARY, b"act")
    assert peer.frame() == (Opcode.BINARY, b"act")
    peer.send(Opcode.CLOSE, b"")  # a close frame without a code
    assert peer.frame() == (Opcode.CLOSE, Close(1005, ""))  # echoed as it came: empty
    assert peer.eof(5)  # the server ends TCP first (RFC 6455 §7.1.1)
    peer.sock.close()
    assert _eventually(lambda: handler.closed == [1005])


def test_a_protocol_error_closes_with_1002_then_eof_and_the_server_waits_for_the_peer(echo_server):
    url, handler = echo_server
    peer = raw_client(url)
    peer.send(Opcode.BINARY, b"not masked", mask=False)  # a client's frames must be masked
    opcode, close = peer.frame()
    assert opcode is Opcode.CLOSE and close.code == 1002
    assert peer.eof(5)  # its side of TCP ended...
    peer.sock.sendall(peer.raw(Opcode.BINARY, b"more"))  # ...while it reads and drops ours
    assert handler.closed == [] and handler.received == []  # nothing handed to the bridge
    peer.sock.close()
    assert _eventually(lambda: handler.closed == [None])


def test_text_that_is_not_utf8_closes_with_1007_unread(echo_server):
    url, handler = echo_server
    peer = raw_client(url)
    peer.send(Opcode.TEXT, b"\xff\xfe")
    opcode, close = peer.frame()
    assert opcode is Opcode.CLOSE and close.code == 1007
    assert handler.received == []


def test_messages_read_with_the_peers_close_are_handed_out_first(echo_server):
    """An action and the close behind it, in one read: the bridge still gets the action."""
    url, handler = echo_server
    peer = raw_client(url)
    peer.sock.sendall(peer.raw(Opcode.BINARY, b"last action") + peer.raw(Opcode.CLOSE, Close(1000, "").serialize()))
    assert peer.frame() == (Opcode.CLOSE, Close(1000, ""))  # no reply after the peer's close: only the echo
    assert peer.eof(5)
    peer.sock.close()
    assert _eventually(lambda: handler.closed == [1000])
    assert handler.received == [b"last action"]


def test_after_the_handler_closes_the_rest_of_the_read_is_not_handed_out(echo_server):
    """A frame that makes the bridge close (here text) and an action behind it, in one read: the
    action is dropped, never handled after the bridge ended the connection."""
    url, handler = echo_server
    peer = raw_client(url)
    peer.sock.sendall(peer.raw(Opcode.TEXT, b"bad") + peer.raw(Opcode.BINARY, b"after"))
    assert peer.frame() == (Opcode.TEXT, b"no text please: bad")
    opcode, close = peer.frame()
    assert (opcode, close) == (Opcode.CLOSE, Close(1008, "text refused"))
    assert handler.received == ["bad"]


def test_fragments_join_into_one_message_with_a_ping_between(echo_server):
    url, handler = echo_server
    peer = raw_client(url)
    peer.sock.sendall(peer.raw(Opcode.BINARY, b"frag", fin=False) + peer.raw(Opcode.PING, b"!")
                      + peer.raw(Opcode.CONT, b"ment", fin=False) + peer.raw(Opcode.CONT, b"ed"))
    assert peer.frame() == (Opcode.PONG, b"!")
    assert peer.frame() == (Opcode.BINARY, b"fragmented")
    assert handler.received == [b"fragmented"]
