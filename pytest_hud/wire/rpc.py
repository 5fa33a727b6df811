"""Newline-delimited JSON-RPC 2.0 over loopback TCP: the socket shells around :mod:`.jsonrpc`.

Used by the bridge's control channel and by the controller's pool service. One request per line,
unique ids, frames up to 16 MiB. The first call on a connection must be ``hello`` with the run's
secret; anything else before it is refused. Malformed frames get a JSON-RPC error, never a dead
handler; a line over the size limit closes the connection (the stream can no longer be framed).

What a line says is decided in :mod:`.jsonrpc`; this module only moves lines: an asyncio server,
a blocking client and an asyncio client.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from pytest_hud.wire.jsonrpc import (
    APP_ERROR, INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, MAX_FRAME_BYTES, METHOD_NOT_FOUND,
    PARSE_ERROR, UNAUTHORIZED, InvalidRequest, RpcClientProtocol, RpcError, encode_error, encode_result, parse_request,
)

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
                        encode_error(None, INVALID_REQUEST, f"frame exceeds {MAX_FRAME_BYTES} bytes; closing"),
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
            req = parse_request(line)
        except InvalidRequest as bad:
            await self._send(conn, bad.reply)
            return True
        id_, method, params = req.id, req.method, req.params
        if method == "hello":
            return await self._hello(conn, id_, params)
        if not conn.authenticated:
            await self._send(
                conn, encode_error(id_, UNAUTHORIZED, "call hello(secret) first; this connection is closed")
            )
            return False
        handler = self.methods.get(method)
        if handler is None:
            await self._send(
                conn,
                encode_error(id_, METHOD_NOT_FOUND, f"unknown method {method!r}; known: {sorted(self.methods)}"),
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
                encode_error(id_, UNAUTHORIZED, "wrong or missing secret; use the one from the announce file"),
            )
            return False
        conn.authenticated = True
        await self._send(conn, encode_result(id_, self.hello_info()))
        return True

    async def _call(self, conn: Connection, id_: Any, handler: Handler, params: dict) -> None:
        try:
            result = await handler(conn, **params)
        except TypeError as exc:
            if id_ is not None:
                await self._send(conn, encode_error(id_, INVALID_PARAMS, f"bad parameters: {exc}"))
            return
        except RpcError as exc:
            if id_ is not None:
                await self._send(conn, encode_error(id_, exc.code or APP_ERROR, exc.message, exc.data))
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure becomes an error reply
            if id_ is not None:
                await self._send(conn, encode_error(id_, INTERNAL_ERROR, f"{type(exc).__name__}: {exc}"))
            return
        if id_ is not None:
            await self._send(conn, encode_result(id_, result))


class RpcClient:
    """Blocking client; thread-safe (calls are serialised). Every call has a timeout."""

    def __init__(self, host: str, port: int, secret: str, timeout: float = 30.0, what: str = "server"):
        self.what = what
        self.timeout = timeout
        self._protocol = RpcClientProtocol(what)
        self._lock = threading.Lock()
        try:
            self._sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise RpcError(f"cannot reach {what} at {host}:{port}: {exc}", code=None) from None
        try:
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._file = self._sock.makefile("rb")
            self.hello_info = self.call("hello", secret=secret)
        except BaseException:
            self._sock.close()  # a server that accepted but did not answer: no socket left behind
            raise

    def call(self, method: str, timeout: float | None = None, **params: Any) -> Any:
        with self._lock:
            id_, data = self._protocol.request(method, params)
            self._sock.settimeout(self.timeout if timeout is None else timeout)
            try:
                self._sock.sendall(data)
                while True:
                    # calls are serialised, so the one reply receive() matches is this call's
                    matched = self._protocol.receive(self._file.readline(MAX_FRAME_BYTES + 1))
                    if matched is not None:
                        return self._protocol.outcome(matched[1])
            except TimeoutError:
                raise RpcError(
                    f"{self.what} did not answer {method}() within {self._sock.gettimeout():.0f} s",
                    code=None,
                ) from None
            except (ConnectionResetError, BrokenPipeError) as exc:  # the peer went away (killed, crashed)
                raise RpcError(f"{self.what} closed the connection during {method}() ({exc.strerror})",
                               code=None) from None
            except OSError as exc:
                raise RpcError(f"connection to {self.what} failed during {method}(): {exc}", code=None) from None
            finally:
                self._protocol.forget(id_)  # a late reply to a timed-out call is then skipped

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
        self._protocol = RpcClientProtocol(what)
        self._waiting: dict[int, asyncio.Future] = {}
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
                matched = self._protocol.receive(await reader.readline())
                if matched is not None:
                    fut = self._waiting.pop(matched[0], None)
                    if fut is not None and not fut.done():
                        fut.set_result(matched[1])
        except RpcError as exc:
            error = exc
        except (ConnectionResetError, BrokenPipeError) as exc:  # the peer went away (killed, crashed)
            error = RpcError(f"{self.what} closed the connection ({exc.strerror})", code=None)
        except (ConnectionError, asyncio.LimitOverrunError, ValueError) as exc:
            error = RpcError(f"connection to {self.what} failed: {exc}", code=None)
        finally:
            for fut in self._waiting.values():
                if not fut.done():
                    fut.set_exception(error)
            self._waiting.clear()

    async def call(self, method: str, timeout: float | None = None, **params: Any) -> Any:
        if self._writer is None or self._reader_task is None or self._reader_task.done():
            raise RpcError(f"connection to {self.what} is closed", code=None)
        id_, data = self._protocol.request(method, params)
        fut = asyncio.get_running_loop().create_future()
        self._waiting[id_] = fut
        try:
            self._writer.write(data)
            await self._writer.drain()
            reply = await asyncio.wait_for(fut, self.timeout if timeout is None else timeout)
        except asyncio.TimeoutError:
            raise RpcError(f"{self.what} did not answer {method}() in time", code=None) from None
        finally:
            self._waiting.pop(id_, None)
            self._protocol.forget(id_)
        return self._protocol.outcome(reply)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
