"""Peers for the slot WebSocket tests: our server on a thread, and raw ends that write frames byte by byte.

A raw peer writes frames itself (``Frame.serialize``, masked or not, whatever its role should do)
and reads what the other end sends through websockets' own sans-I/O protocol, so a test can send
what a well-behaved client or server never would and see exactly what came back.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from typing import Any

from websockets.client import ClientProtocol
from websockets.frames import Close, Frame, Opcode
from websockets.server import ServerProtocol
from websockets.uri import parse_uri

from pytest_hud.bridge.wsserver import serve_ws


class Echo:
    """Greets with ``hello``; echoes binary messages; answers text with a text error frame and a
    1008 close (what the bridge does with a frame it cannot use)."""

    def __init__(self) -> None:
        self.closed: list[int | None] = []
        self.received: list[bytes | str] = []
        self.unix: str | None = None

    def ws_open(self, conn: Any) -> None:
        conn.send(b"hello")

    def ws_message(self, conn: Any, data: bytes | str) -> None:
        self.received.append(data)
        if isinstance(data, str):
            conn.send(f"no text please: {data}")
            conn.close(1008, "text refused")
        else:
            conn.send(data)

    def ws_closed(self, conn: Any) -> None:
        self.closed.append(conn.close_rcvd)


def start_echo_server() -> tuple[str, Echo, Any]:
    """Our server with an :class:`Echo` handler on a thread of its own: ``(url, handler, stop)``."""
    loop = asyncio.new_event_loop()
    handler = Echo()
    started = threading.Event()
    box: dict[str, Any] = {}

    def run() -> None:
        asyncio.set_event_loop(loop)
        box["server"] = loop.run_until_complete(serve_ws(handler, "127.0.0.1", 0, 1 << 20, unix=True))
        handler.unix = box["server"].unix
        started.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(10)

    def stop() -> None:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)

    return f"ws://127.0.0.1:{box['server'].port}", handler, stop


class RawPeer:
    """One end of a WebSocket written here: raw frames out, the other end's frames and EOF in."""

    def __init__(self, sock: socket.socket, protocol: ClientProtocol | ServerProtocol, client: bool) -> None:
        self.sock, self.protocol, self.client = sock, protocol, client
        self.frames: list[tuple[Opcode, bytes | Close]] = []

    def send(self, opcode: Opcode, payload: bytes, mask: bool | None = None, fin: bool = True) -> None:
        self.sock.sendall(self.raw(opcode, payload, mask, fin))

    def raw(self, opcode: Opcode, payload: bytes, mask: bool | None = None, fin: bool = True) -> bytes:
        """A frame's bytes, masked as this role should (or as ``mask`` says)."""
        return Frame(opcode, payload, fin).serialize(mask=self.client if mask is None else mask, extensions=[])

    def frame(self, timeout: float = 5.0) -> tuple[Opcode, bytes | Close]:
        """The next frame the other end sent (a close frame's payload parsed)."""
        self.sock.settimeout(timeout)
        while not self.frames:
            data = self.sock.recv(65536)
            assert data, "EOF before a whole frame"
            self.protocol.receive_data(data)
            self.take(self.protocol.events_received())
        return self.frames.pop(0)

    def take(self, events: list) -> None:
        for event in events:
            if isinstance(event, Frame):
                payload = Close.parse(event.data) if event.opcode is Opcode.CLOSE else bytes(event.data)
                self.frames.append((event.opcode, payload))

    def eof(self, timeout: float) -> bool:
        """Whether the other end ends TCP within ``timeout`` s (anything it sends first is an error)."""
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(65536)
        except TimeoutError:
            return False
        assert data == b"", data
        return True


def raw_client(url: str) -> RawPeer:
    """A raw client, upgraded by the server at ``url`` and past :class:`Echo`'s greeting."""
    port = int(url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    protocol = ClientProtocol(parse_uri(url))
    protocol.send_request(protocol.connect())
    sock.sendall(b"".join(protocol.data_to_send()))
    peer = RawPeer(sock, protocol, client=True)
    while not (events := protocol.events_received()):
        protocol.receive_data(sock.recv(4096))
    assert protocol.handshake_exc is None, protocol.handshake_exc
    peer.take(events[1:])  # frames that came with the answer
    assert peer.frame() == (Opcode.BINARY, b"hello")
    return peer


def accept_raw(listener: socket.socket) -> RawPeer:
    """Accept one client on ``listener`` and upgrade it: a raw server end."""
    sock, _ = listener.accept()
    sock.settimeout(5)
    protocol = ServerProtocol()
    while not (events := protocol.events_received()):
        protocol.receive_data(sock.recv(4096))
    protocol.send_response(protocol.accept(events[0]))
    sock.sendall(b"".join(protocol.data_to_send()))
    return RawPeer(sock, protocol, client=False)
