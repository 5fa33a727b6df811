"""The control channel's JSON-RPC 2.0 protocol without I/O: what goes on a line, and what a line means.

Both ends live here as plain functions and one small state object, so the socket code in
:mod:`pytest_hud.wire.rpc` (an asyncio server, a blocking client and an asyncio client) only moves
bytes. One message per line, ``\\n``-terminated; the first call on a connection is
``hello(secret)``.

    >>> calls = RpcClientProtocol("bridge")
    >>> calls.request("hello", {"secret": "s"})
    (1, b'{"jsonrpc": "2.0", "id": 1, "method": "hello", "params": {"secret": "s"}}\\n')
    >>> id_, reply = calls.receive(b'{"jsonrpc": "2.0", "id": 1, "result": {}}\\n')
    >>> calls.outcome(reply)
    {}
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

#: Largest frame either side accepts (WebSocket message or control-channel line).
MAX_FRAME_BYTES = 16 * 1024 * 1024

__all__ = [
    "RpcError",
    "InvalidRequest",
    "Request",
    "RpcClientProtocol",
    "encode_request",
    "encode_result",
    "encode_error",
    "parse_request",
    "parse_reply",
    "PARSE_ERROR",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "INVALID_PARAMS",
    "INTERNAL_ERROR",
    "UNAUTHORIZED",
    "APP_ERROR",
]

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
UNAUTHORIZED = -32001
APP_ERROR = -32000


class RpcError(Exception):
    """An error answered by the other side (or a broken connection, code ``None``)."""

    def __init__(self, message: str, code: int | None = APP_ERROR, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.data = data

    @property
    def message(self) -> str:
        return str(self.args[0])


# ------------------------------------------------------------------ encoding
def encode_request(id_: int, method: str, params: dict[str, Any]) -> bytes:
    return (json.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params}) + "\n").encode()


def encode_error(id_: Any, code: int, message: str, data: Any = None) -> bytes:
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return (json.dumps({"jsonrpc": "2.0", "id": id_, "error": err}) + "\n").encode()


def encode_result(id_: Any, result: Any) -> bytes:
    """The reply line for ``result``; an error reply when ``result`` is not JSON."""
    try:
        return (json.dumps({"jsonrpc": "2.0", "id": id_, "result": result}) + "\n").encode()
    except (TypeError, ValueError, RecursionError) as exc:
        return encode_error(id_, INTERNAL_ERROR, f"result is not JSON-serializable: {exc}")


# ---------------------------------------------------------------- server side
@dataclass(frozen=True)
class Request:
    """One well-formed request (``id`` is None for a notification, which gets no reply)."""

    id: int | str | None
    method: str
    params: dict[str, Any]


class InvalidRequest(Exception):
    """A line that is not a usable request; ``reply`` is the error line to answer with.

    The connection stays open: one bad frame must not kill a handler that serves other calls.
    """

    def __init__(self, reply: bytes) -> None:
        super().__init__(reply.decode(errors="replace").strip())
        self.reply = reply


def parse_request(line: bytes) -> Request:
    """Read one request line; raises :class:`InvalidRequest` with the error reply to send."""
    try:
        req = json.loads(line)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nesting too deep
        raise InvalidRequest(encode_error(None, PARSE_ERROR, f"frame is not JSON: {exc}")) from None
    if not isinstance(req, dict) or req.get("jsonrpc") != "2.0" or not isinstance(req.get("method"), str):
        raise InvalidRequest(encode_error(
            req.get("id") if isinstance(req, dict) else None,
            INVALID_REQUEST,
            'a request is {"jsonrpc": "2.0", "id": N, "method": "...", "params": {...}}',
        ))
    id_ = req.get("id")
    if not isinstance(id_, (int, str)) and id_ is not None or isinstance(id_, bool):
        raise InvalidRequest(encode_error(None, INVALID_REQUEST, "id must be a number or a string"))
    params = req.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise InvalidRequest(encode_error(id_, INVALID_PARAMS, "params must be an object"))
    return Request(id_, req["method"], params)


# ---------------------------------------------------------------- client side
def parse_reply(line: bytes, what: str = "server") -> dict[str, Any]:
    """Read one reply line; an empty line is the end of the stream. Raises :class:`RpcError`."""
    if not line:
        raise RpcError(f"{what} closed the connection", code=None)
    try:
        reply = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise RpcError(f"{what} sent a frame that is not JSON: {exc}", code=None) from None
    if not isinstance(reply, dict):
        raise RpcError(f"{what} sent a {type(reply).__name__} where a JSON-RPC reply object was due",
                       code=None)
    return reply


class RpcClientProtocol:
    """The client half of one connection: numbers requests, matches replies, reads outcomes.

    A shell sends what :meth:`request` returns, feeds every line it reads to :meth:`receive`
    (which pairs it with a pending request), hands the reply to :meth:`outcome`, and calls
    :meth:`forget` for a request it stops waiting for. Ids are unique per connection.
    """

    def __init__(self, what: str = "server") -> None:
        self.what = what  # how error messages name the other side ("bridge", "pool")
        self._ids = itertools.count(1)
        self.pending: set[int] = set()
        self._greeted = False

    def request(self, method: str, params: dict[str, Any]) -> tuple[int, bytes]:
        """A new request's id and its line. The first one must be ``hello``."""
        if not self._greeted and method != "hello":
            # the server would refuse it and close the connection; say why before that happens
            raise RpcError(f"call hello(secret) before {method}() on a connection to {self.what}",
                           code=None)
        id_ = next(self._ids)
        data = encode_request(id_, method, params)  # before marking it pending: params may not be JSON
        self._greeted = True
        self.pending.add(id_)
        return id_, data

    def receive(self, line: bytes) -> tuple[int, dict[str, Any]] | None:
        """``(id, reply)`` for the pending request ``line`` answers, or None if it answers none.

        None means a late reply to a request already given up on. A reply without an id (the
        server could not read the request, so it could not echo one) answers the pending request
        when there is exactly one. Raises :class:`RpcError` at end of stream or on a bad line.
        """
        reply = parse_reply(line, self.what)
        id_ = reply.get("id")
        if id_ is None and len(self.pending) == 1:
            id_ = next(iter(self.pending))
        if not isinstance(id_, int) or isinstance(id_, bool) or id_ not in self.pending:
            return None
        self.pending.discard(id_)
        return id_, reply

    def forget(self, id_: int) -> None:
        """Stop waiting for ``id_`` (it timed out, or its connection failed)."""
        self.pending.discard(id_)

    def outcome(self, reply: dict[str, Any]) -> Any:
        """The reply's result; raises :class:`RpcError` with the server's error."""
        if "error" in reply:
            err = reply["error"] or {}
            if not isinstance(err, dict):
                raise RpcError(f"{self.what} sent a malformed error: {err!r}", code=None)
            raise RpcError(str(err.get("message")), err.get("code"), err.get("data"))
        return reply.get("result")
