"""Newline-delimited JSON-RPC 2.0 over loopback TCP: framing, a server shell and clients.

Used by the bridge's control channel and by the controller's pool service. One request per line,
unique ids, frames up to 16 MiB. The first call on a connection must be ``hello`` with the run's
secret; anything else before it is refused. Malformed frames get a JSON-RPC error, never a dead
handler; a line over the size limit closes the connection (the stream can no longer be framed).
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import json
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from .wire import MAX_FRAME_BYTES

__all__ = [
    "RpcError",
    "RpcServer",
    "RpcClient",
    "AsyncRpcClient",
    "PARSE_ERROR",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "INVALID_PARAMS",
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


def _error(id_: Any, code: int, message: str, data: Any = None) -> bytes:
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return (json.dumps({"jsonrpc": "2.0", "id": id_, "error": err}) + "\n").encode()


Handler = Callable[..., Awaitable[Any]]


class RpcServer:
    """Serves ``methods`` (name → ``async def f(conn, **params)``) on a TCP port.

    ``on_close(conn)`` runs when a connection ends for any reason; ``conn`` is a small per-connection
    object with an ``id`` (unique per server) and ``authenticated``.
    """

    class Connection:
        __slots__ = ("id", "authenticated", "writer", "peer", "tasks")

        def __init__(self, id_: int, writer: asyncio.StreamWriter) -> None:
            self.id = id_
            self.authenticated = False
            self.writer = writer
            self.peer = writer.get_extra_info("peername")
            self.tasks: set[asyncio.Task] = set()

    def __init__(
        self,
        methods: dict[str, Handler],
        secret: str,
        on_close: Callable[[Connection], Any] | None = None,
        hello_info: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.methods = methods
        self.secret = secret
        self.on_close = on_close
        self.hello_info = hello_info or (lambda: {})
        self._ids = itertools.count(1)
        self.server: asyncio.base_events.Server | None = None
        self.connections: dict[int, RpcServer.Connection] = {}

    async def start(self, host: str, port: int = 0) -> int:
        self.server = await asyncio.start_server(
            self._serve, host, port, limit=MAX_FRAME_BYTES + 1
        )
        return self.server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for conn in list(self.connections.values()):
            conn.writer.close()

    async def _send(self, conn: Connection, data: bytes) -> None:
        try:
            conn.writer.write(data)
            await conn.writer.drain()
        except (ConnectionError, RuntimeError):
            pass

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = RpcServer.Connection(next(self._ids), writer)
        self.connections[conn.id] = conn
        try:
            while True:
                try:
                    line = await reader.readuntil(b"\n")
                except asyncio.IncompleteReadError:
                    break  # peer closed (a partial last line is dropped)
                except asyncio.LimitOverrunError:
                    await self._send(
                        conn,
                        _error(None, INVALID_REQUEST, f"frame exceeds {MAX_FRAME_BYTES} bytes; closing"),
                    )
                    break
                if not line.strip():
                    continue
                if not await self._dispatch(conn, line):
                    break
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.connections.pop(conn.id, None)
            for task in list(conn.tasks):
                task.cancel()
            if self.on_close is not None:
                try:
                    result = self.on_close(conn)
                    if asyncio.iscoroutine(result):
                        await result
                except Exception:  # noqa: BLE001 - a close hook must not kill the server
                    pass
            writer.close()

    async def _dispatch(self, conn: Connection, line: bytes) -> bool:
        """Handle one frame; False closes the connection."""
        try:
            req = json.loads(line)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nesting too deep
            await self._send(conn, _error(None, PARSE_ERROR, f"frame is not JSON: {exc}"))
            return True
        if not isinstance(req, dict) or req.get("jsonrpc") != "2.0" or not isinstance(
            req.get("method"), str
        ):
            await self._send(
                conn,
                _error(
                    req.get("id") if isinstance(req, dict) else None,
                    INVALID_REQUEST,
                    'a request is {"jsonrpc": "2.0", "id": N, "method": "...", "params": {...}}',
                ),
            )
            return True
        id_ = req.get("id")
        if not isinstance(id_, (int, str)) and id_ is not None or isinstance(id_, bool):
            await self._send(conn, _error(None, INVALID_REQUEST, "id must be a number or a string"))
            return True
        method, params = req["method"], req.get("params", {})
        if params is None:
            params = {}
        if not isinstance(params, dict):
            await self._send(conn, _error(id_, INVALID_PARAMS, "params must be an object"))
            return True
        if method == "hello":
            return await self._hello(conn, id_, params)
        if not conn.authenticated:
            await self._send(
                conn, _error(id_, UNAUTHORIZED, "call hello(secret) first; this connection is closed")
            )
            return False
        handler = self.methods.get(method)
        if handler is None:
            await self._send(
                conn,
                _error(id_, METHOD_NOT_FOUND, f"unknown method {method!r}; known: {sorted(self.methods)}"),
            )
            return True
        task = asyncio.ensure_future(self._call(conn, id_, handler, params))
        conn.tasks.add(task)
        task.add_done_callback(conn.tasks.discard)
        return True

    async def _hello(self, conn: Connection, id_: Any, params: dict) -> bool:
        secret = params.get("secret")
        # surrogatepass: a JSON string may hold lone surrogates, which plain encode() raises on
        if not isinstance(secret, str) or not hmac.compare_digest(
            secret.encode(errors="surrogatepass"), self.secret.encode()
        ):
            await self._send(
                conn,
                _error(id_, UNAUTHORIZED, "wrong or missing secret; use the one from the announce file"),
            )
            return False
        conn.authenticated = True
        await self._send(conn, _result(id_, self.hello_info()))
        return True

    async def _call(self, conn: Connection, id_: Any, handler: Handler, params: dict) -> None:
        try:
            result = await handler(conn, **params)
        except TypeError as exc:
            if id_ is not None:
                await self._send(conn, _error(id_, INVALID_PARAMS, f"bad parameters: {exc}"))
            return
        except RpcError as exc:
            if id_ is not None:
                await self._send(conn, _error(id_, exc.code or APP_ERROR, exc.message, exc.data))
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure becomes an error reply
            if id_ is not None:
                await self._send(conn, _error(id_, INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"))
            return
        if id_ is not None:
            await self._send(conn, _result(id_, result))


def _result(id_: Any, result: Any) -> bytes:
    try:
        return (json.dumps({"jsonrpc": "2.0", "id": id_, "result": result}) + "\n").encode()
    except (TypeError, ValueError, RecursionError) as exc:
        return _error(id_, INTERNAL_ERROR, f"result is not JSON-serializable: {exc}")


def _parse_reply(line: bytes, what: str) -> dict:
    if not line:
        raise RpcError(f"{what} closed the connection", code=None)
    try:
        reply = json.loads(line)
    except ValueError as exc:
        raise RpcError(f"{what} sent a frame that is not JSON: {exc}", code=None) from None
    return reply


def _unwrap(reply: dict) -> Any:
    if "error" in reply:
        err = reply["error"] or {}
        raise RpcError(str(err.get("message")), err.get("code"), err.get("data"))
    return reply.get("result")


class RpcClient:
    """Blocking client; thread-safe (calls are serialised). Every call has a timeout."""

    def __init__(self, host: str, port: int, secret: str, timeout: float = 30.0, what: str = "server"):
        self.what = what
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        try:
            self._sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise RpcError(f"cannot reach {what} at {host}:{port}: {exc}", code=None) from None
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._file = self._sock.makefile("rb")
        self.hello_info = self.call("hello", secret=secret)

    def call(self, method: str, timeout: float | None = None, **params: Any) -> Any:
        with self._lock:
            id_ = next(self._ids)
            data = (json.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params}) + "\n").encode()
            self._sock.settimeout(self.timeout if timeout is None else timeout)
            try:
                self._sock.sendall(data)
                while True:
                    reply = _parse_reply(self._file.readline(MAX_FRAME_BYTES + 1), self.what)
                    if reply.get("id") == id_ or reply.get("id") is None:
                        return _unwrap(reply)
            except TimeoutError:
                raise RpcError(
                    f"{self.what} did not answer {method}() within {self._sock.gettimeout():.0f} s",
                    code=None,
                ) from None
            except OSError as exc:
                raise RpcError(f"connection to {self.what} failed during {method}(): {exc}", code=None) from None

    def close(self) -> None:
        try:
            self._file.close()
            self._sock.close()
        except OSError:
            pass

    def __enter__(self) -> RpcClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncRpcClient:
    """asyncio client: concurrent calls are matched to replies by id."""

    def __init__(self, what: str = "server", timeout: float = 30.0) -> None:
        self.what = what
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._reader_task: asyncio.Task | None = None
        self._writer: asyncio.StreamWriter | None = None
        self.hello_info: Any = None

    @classmethod
    async def connect(cls, host: str, port: int, secret: str, timeout: float = 30.0, what: str = "server"):
        self = cls(what, timeout)
        try:
            reader, self._writer = await asyncio.wait_for(
                asyncio.open_connection(host, port, limit=MAX_FRAME_BYTES + 1), timeout
            )
        except (OSError, asyncio.TimeoutError) as exc:
            raise RpcError(f"cannot reach {what} at {host}:{port}: {exc}", code=None) from None
        self._reader_task = asyncio.ensure_future(self._read(reader))
        self.hello_info = await self.call("hello", secret=secret)
        return self

    async def _read(self, reader: asyncio.StreamReader) -> None:
        error = RpcError(f"{self.what} closed the connection", code=None)
        try:
            while True:
                line = await reader.readline()
                reply = _parse_reply(line, self.what)
                fut = self._pending.pop(reply.get("id"), None)
                if fut is not None and not fut.done():
                    fut.set_result(reply)
        except RpcError as exc:
            error = exc
        except (ConnectionError, asyncio.LimitOverrunError, ValueError) as exc:
            error = RpcError(f"connection to {self.what} failed: {exc}", code=None)
        finally:
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(error)
            self._pending.clear()

    async def call(self, method: str, timeout: float | None = None, **params: Any) -> Any:
        if self._writer is None or self._reader_task is None or self._reader_task.done():
            raise RpcError(f"connection to {self.what} is closed", code=None)
        id_ = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._pending[id_] = fut
        self._writer.write(
            (json.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params}) + "\n").encode()
        )
        await self._writer.drain()
        try:
            reply = await asyncio.wait_for(fut, self.timeout if timeout is None else timeout)
        except asyncio.TimeoutError:
            self._pending.pop(id_, None)
            raise RpcError(f"{self.what} did not answer {method}() in time", code=None) from None
        return _unwrap(reply)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
