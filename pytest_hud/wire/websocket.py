"""A lean, sans-I/O WebSocket (RFC 6455) layer for the per-step path: the opening handshake, frames,
fragmented messages and the closing handshake; no extensions, no subprotocols.

The bridge's slot sockets and the worker's slot client move one small message each way per step;
a general-purpose library spends most of a step's CPU there (parsers written as generators,
message assemblers, futures and a task wake-up per message). This module parses and writes
frames in straight-line code, and the caller reacts to a message in the same call that read it.
What travels is plain WebSocket: websockets, openpi-client and the HUD SDK talk to it unchanged,
and the messages inside are the same openpi/0 bytes.

    >>> reader = FrameReader(max_size=1 << 20, masked=False)
    >>> reader.feed(encode_frame(OP_BINARY, b"hi"))
    >>> reader.next()
    (2, b'hi')
"""

from __future__ import annotations

import base64
import hashlib
import os
import random
import struct

from websockets.frames import Close

try:  # websockets' C helper: XOR with a 4-byte key at memory speed
    from websockets.speedups import apply_mask as _apply_mask
except ImportError:  # pragma: no cover - websockets built without its extension
    from websockets.utils import apply_mask as _apply_mask

__all__ = [
    "OP_BINARY",
    "OP_CLOSE",
    "OP_CONT",
    "OP_PING",
    "OP_PONG",
    "OP_TEXT",
    "FrameReader",
    "HandshakeError",
    "ProtocolError",
    "accept_key",
    "client_request",
    "close_payload",
    "encode_frame",
    "parse_close",
    "parse_request",
    "parse_response",
]

OP_CONT, OP_TEXT, OP_BINARY = 0x0, 0x1, 0x2
OP_CLOSE, OP_PING, OP_PONG = 0x8, 0x9, 0xA
_DATA = (OP_CONT, OP_TEXT, OP_BINARY)
_CONTROL = (OP_CLOSE, OP_PING, OP_PONG)
_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
_U16 = struct.Struct("!H")
_U64 = struct.Struct("!Q")
MAX_HEAD = 16 * 1024  # an HTTP upgrade request or response longer than this is refused


class ProtocolError(Exception):
    """The peer broke the protocol; close the connection with ``code`` and ``reason``."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class HandshakeError(Exception):
    """An opening handshake that cannot succeed: ``status`` is the HTTP status a server answers
    with; a client's is the status of the server's answer (0: not a valid answer), with ``body``
    the bytes that followed that answer's head."""

    def __init__(self, status: int, reason: str, headers: dict[str, str] | None = None,
                 body: bytes = b"") -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.headers = headers or {}
        self.body = body


# --------------------------------------------------------------------- frames
def encode_frame(opcode: int, payload: bytes, mask: bool = False) -> bytes:
    """One final frame; a client's frames are masked with a fresh random key (RFC 6455 §5.3)."""
    n = len(payload)
    first = 0x80 | opcode
    bit = 0x80 if mask else 0
    if n < 126:
        head = bytes((first, bit | n))
    elif n < 65536:
        head = bytes((first, bit | 126)) + _U16.pack(n)
    else:
        head = bytes((first, bit | 127)) + _U64.pack(n)
    if mask:
        key = _MASK_KEYS.getrandbits(32).to_bytes(4, "big")
        return head + key + _apply_mask(payload, key)
    return head + payload


# Mask keys come from a generator seeded from the OS (and reseeded in a forked child), not from
# os.urandom per frame: that is a system call per step. A key only has to be unknown to whatever
# sits between client and server (RFC 6455 §10.3), and this generator's state never leaves the
# process; aiohttp's client draws its keys the same way.
_MASK_KEYS = random.Random()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_MASK_KEYS.seed)


def frame_header(opcode: int, n: int) -> bytes:
    """The header of an unmasked final frame of ``n`` bytes (a server writes it before the payload)."""
    if n < 126:
        return bytes((0x80 | opcode, n))
    if n < 65536:
        return bytes((0x80 | opcode, 126)) + _U16.pack(n)
    return bytes((0x80 | opcode, 127)) + _U64.pack(n)


def close_payload(code: int, reason: str = "") -> bytes:
    """A close frame's payload: the code, then at most 123 bytes of UTF-8 reason."""
    return _U16.pack(code) + reason.encode(errors="replace")[:123]


def parse_close(payload: bytes) -> tuple[int, str]:
    """``(code, reason)`` of a received close frame; 1005 when it carries no code."""
    if not payload:
        return 1005, ""
    if len(payload) == 1:
        raise ProtocolError(1002, "close frame with a one-byte payload")
    code = _U16.unpack_from(payload)[0]
    if not (1000 <= code <= 4999) or code in (1004, 1005, 1006, 1015):
        raise ProtocolError(1002, f"invalid close code {code}")
    try:
        return code, payload[2:].decode()
    except UnicodeDecodeError:
        raise ProtocolError(1007, "close reason is not UTF-8") from None


class FrameReader:
    """Incremental frame parser: :meth:`feed` bytes, then :meth:`next` until it returns ``None``.

    ``next`` returns ``(opcode, payload)``: a whole data message (``OP_TEXT`` payloads decoded to
    ``str``, fragments joined) or one control frame (a close frame's payload parsed and checked:
    a websockets ``Close``, code 1005 when it carried none). ``masked`` says whether frames must be masked
    (a server reading a client) or must not be (a client reading a server). Raises
    :class:`ProtocolError` for anything RFC 6455 forbids and for messages over ``max_size``.
    """

    __slots__ = ("_buf", "_more", "_more_len", "_part_len", "_part_op", "_parts", "_pos", "masked", "max_size")

    def __init__(self, max_size: int, masked: bool) -> None:
        self.max_size = max_size
        self.masked = masked
        self._buf = b""  # bytes being parsed, from ``_pos`` on
        self._pos = 0
        self._more: list[bytes] = []  # bytes fed after ``_buf``: joined only once a frame needs them,
        self._more_len = 0  # so a large frame arriving in many reads is copied once, not per read
        self._parts: list[bytes] = []
        self._part_op = 0
        self._part_len = 0

    def feed(self, data: bytes) -> None:
        if self._pos >= len(self._buf) and not self._more:
            self._buf, self._pos = data, 0  # the common case: nothing left over
        else:
            self._more.append(data)
            self._more_len += len(data)

    def whole(self, data: bytes) -> bytes | None:
        """The payload when nothing is buffered and ``data`` is exactly one final binary frame,
        masked as this side expects, within ``max_size`` (a message read in one piece, as an
        action or an observation usually is); else None, and ``data`` is for :meth:`feed`.
        Nothing is buffered either way."""
        if self._pos < len(self._buf) or self._more or self._parts:
            return None
        size = len(data)
        if size < 2 or data[0] != 0x82:  # FIN and OP_BINARY, no reserved bits
            return None
        b1 = data[1]
        if (b1 >= 0x80) is not self.masked or size < _length_bytes(b1):
            return None
        n, head = _length(b1, data, 0)
        if self.masked:
            head += 4
        if size != head + n or n > self.max_size:
            return None
        if self.masked:
            return _apply_mask(data[head:], data[head - 4:head])
        return data[head:]

    def _have(self, n: int) -> bool:
        """Whether ``n`` bytes from ``_pos`` are in ``_buf`` (joining what was fed after, if enough)."""
        avail = len(self._buf) - self._pos
        if avail >= n:
            return True
        if avail + self._more_len < n:
            return False
        self._buf = b"".join([self._buf[self._pos:], *self._more])
        self._pos, self._more, self._more_len = 0, [], 0
        return True

    def next(self) -> tuple[int, bytes | str | Close] | None:
        while True:
            frame = self._frame()
            if frame is None:
                return None
            fin, opcode, payload = frame
            if opcode in _CONTROL:
                if opcode == OP_CLOSE:
                    return opcode, Close(*parse_close(payload))
                return opcode, payload
            if opcode == OP_CONT:
                if not self._parts:
                    raise ProtocolError(1002, "continuation frame without a message to continue")
            elif self._parts:
                raise ProtocolError(1002, "new data frame before the fragmented message ended")
            else:
                self._part_op = opcode
                if fin:  # the common case: one frame, one message
                    return opcode, _text(payload) if opcode == OP_TEXT else payload
            self._part_len += len(payload)
            if self._part_len > self.max_size:
                raise ProtocolError(1009, f"message over {self.max_size} bytes")
            self._parts.append(payload)
            if fin:
                data = b"".join(self._parts)
                self._parts, self._part_len = [], 0
                return self._part_op, _text(data) if self._part_op == OP_TEXT else data

    def _frame(self) -> tuple[bool, int, bytes] | None:
        if not self._have(2):
            return None
        buf, pos = self._buf, self._pos
        b0, b1 = buf[pos], buf[pos + 1]
        if b0 & 0x70:
            raise ProtocolError(1002, "reserved bits set: no extension was negotiated")
        opcode = b0 & 0x0F
        if opcode not in _DATA and opcode not in _CONTROL:
            raise ProtocolError(1002, f"unknown opcode {opcode:#x}")
        fin = bool(b0 & 0x80)
        if bool(b1 & 0x80) is not self.masked:
            raise ProtocolError(1002, "client frames must be masked" if self.masked
                                else "server frames must not be masked")
        if not self._have(_length_bytes(b1)):
            return None
        n, head = _length(b1, self._buf, self._pos)
        if opcode in _CONTROL and (n > 125 or not fin):
            raise ProtocolError(1002, "control frames must be final and at most 125 bytes")
        if n > self.max_size:
            raise ProtocolError(1009, f"frame of {n} bytes over the {self.max_size}-byte limit")
        if self.masked:
            head += 4
        if not self._have(head + n):
            return None
        buf, pos = self._buf, self._pos
        end = pos + head + n
        if self.masked:
            payload = _apply_mask(buf[pos + head:end], buf[pos + head - 4:pos + head])
        else:
            payload = buf[pos + head:end]
        self._pos = end
        return fin, opcode, payload


def _length_bytes(b1: int) -> int:
    """How many bytes a frame's header takes before its mask key, given its second byte."""
    n = b1 & 0x7F
    return 4 if n == 126 else 10 if n == 127 else 2


def _length(b1: int, buf: bytes, pos: int) -> tuple[int, int]:
    """(payload length, header bytes before the mask key) of the frame at ``pos``, whose second
    byte is ``b1``; the header's first :func:`_length_bytes` bytes must be in ``buf``."""
    n = b1 & 0x7F
    if n == 126:
        return _U16.unpack_from(buf, pos + 2)[0], 4
    if n == 127:
        return _U64.unpack_from(buf, pos + 2)[0], 10
    return n, 2


def _text(payload: bytes) -> str:
    try:
        return payload.decode()
    except UnicodeDecodeError:
        raise ProtocolError(1007, "text message is not valid UTF-8") from None


# ------------------------------------------------------------------ handshake
def accept_key(key: str) -> str:
    """``Sec-WebSocket-Accept`` for a client's ``Sec-WebSocket-Key``."""
    return base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()


def _headers(lines: list[bytes]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise HandshakeError(400, f"malformed header line {line[:80]!r}")
        key = name.decode("latin-1").lower()
        value_s = value.strip().decode("latin-1")
        headers[key] = f"{headers[key]}, {value_s}" if key in headers else value_s
    return headers


def _tokens(value: str) -> set[str]:
    return {t.strip().lower() for t in value.split(",")}


def parse_request(head: bytes) -> tuple[str, dict[str, str], str]:
    """Check a client's upgrade request (without its final blank line); returns ``(path, headers,
    Sec-WebSocket-Accept)`` or raises :class:`HandshakeError` with the status to answer."""
    lines = head.split(b"\r\n")
    try:
        method, path, version = lines[0].decode("latin-1").split(" ")
    except ValueError:
        raise HandshakeError(400, "malformed HTTP request line") from None
    if version != "HTTP/1.1":
        raise HandshakeError(400, f"{version} is not HTTP/1.1")
    if method != "GET":
        raise HandshakeError(405, f"method {method} not allowed: a WebSocket opens with GET",
                             {"Allow": "GET"})
    headers = _headers(lines[1:])
    if "websocket" not in _tokens(headers.get("upgrade", "")) or \
            "upgrade" not in _tokens(headers.get("connection", "")):
        raise HandshakeError(426, "this port speaks WebSocket only: send an Upgrade: websocket request",
                             {"Upgrade": "websocket", "Connection": "Upgrade"})
    if headers.get("sec-websocket-version") != "13":
        raise HandshakeError(426, "unsupported Sec-WebSocket-Version: 13 is the one spoken here",
                             {"Sec-WebSocket-Version": "13"})
    key = headers.get("sec-websocket-key", "")
    try:
        if len(base64.b64decode(key.encode(), validate=True)) != 16:
            raise ValueError
    except ValueError:
        raise HandshakeError(400, "missing or invalid Sec-WebSocket-Key") from None
    return path, headers, accept_key(key)


def switching_protocols(accept: str) -> bytes:
    return ("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Accept: {accept}\r\n\r\n").encode()


def http_error(error: HandshakeError) -> bytes:
    """A plain-text HTTP response refusing the upgrade, which then closes the connection."""
    body = (error.reason + "\n").encode()
    reasons = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 405: "Method Not Allowed",
               426: "Upgrade Required", 431: "Request Header Fields Too Large"}
    extra = "".join(f"{k}: {v}\r\n" for k, v in error.headers.items())
    return (f"HTTP/1.1 {error.status} {reasons.get(error.status, 'Error')}\r\n{extra}"
            f"Content-Type: text/plain; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


def client_request(host: str, port: int, path: str, headers: dict[str, str] | None = None) -> tuple[bytes, str]:
    """A client's upgrade request and the ``Sec-WebSocket-Accept`` its answer must carry."""
    key = base64.b64encode(os.urandom(16)).decode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
    request = (f"GET {path or '/'} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
               f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
               f"{extra}\r\n").encode()
    return request, accept_key(key)


def parse_response(head: bytes, accept: str) -> tuple[int, str, dict[str, str]]:
    """``(status, reason, headers)`` of a server's answer; raises :class:`HandshakeError` when a
    101 answer is not a valid WebSocket upgrade."""
    lines = head.split(b"\r\n")
    parts = lines[0].decode("latin-1").split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise HandshakeError(0, f"malformed HTTP status line {lines[0][:80]!r}")
    status, reason = int(parts[1]), parts[2] if len(parts) > 2 else ""
    headers = _headers(lines[1:])
    if status == 101:
        if "websocket" not in _tokens(headers.get("upgrade", "")):
            raise HandshakeError(0, "101 answer without Upgrade: websocket")
        if headers.get("sec-websocket-accept") != accept:
            raise HandshakeError(0, "101 answer with a wrong Sec-WebSocket-Accept")
        if headers.get("sec-websocket-extensions"):
            raise HandshakeError(0, "the server accepted an extension this client did not offer")
    return status, reason, headers
