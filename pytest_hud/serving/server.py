"""The policy server: one model copy serving many episodes over openpi's WebSocket protocol.

``python -m pytest_hud.serving --policy SPEC`` runs one (:mod:`pytest_hud.serving.cli`; the first
name, ``python -m pytest_hud.serving.server``, still works). This module is the protocol side:
connections, frames, keys, HTTP and the queue of waiting requests; which requests share a forward,
and the forward itself, are :mod:`pytest_hud.serving.batcher`'s; the model comes from
:mod:`pytest_hud.serving.loading`.

An openpi-compatible policy server that batches. Every connection gets a metadata frame first (the
policy's own ``metadata`` dict, if it has one, plus ``{"server": "pytest-hud/policy/1",
"batching": true, ...}``); then each binary msgpack observation frame (a map of feature arrays,
optionally with a ``"prompt"`` string, as openpi clients send) is answered with
``{"actions": float32 [T, A], "server_timing": {"infer_ms", "prev_total_ms", ...}}``.

Requests from all connections are coalesced: the first waiting request opens a short window and
everything that arrives within it goes to the model in one ``predict_batch(observations, prompts)``
call (a loop over ``predict`` for models without one). The batch goes early when every open
connection has a request waiting (nobody else can join) or ``--max-batch`` requests wait. The
window is ``--batch-window-ms`` (default 2), or ``--batch-window-share`` (default 0.1) of a
recent forward's time when that is longer, up to 20 ms: a request that joins saves a whole forward,
so a slow model waits a little longer for requests sent a few milliseconds apart (clients on a busy
machine) instead of running them in two forwards one after the other. The model runs on one worker
thread, one batch at a time, and the next batch gathers while it runs. Each caller gets its own
row. ``--threads N`` sets torch's intra-op threads (on a CPU shared with sims, one thread often
beats torch's one per core).

A request that fails fails only its caller: it gets a text frame with the error (and the
traceback, as openpi's server sends) and its connection closes. When a batched call raises, the
batch's requests are retried one by one so only the culprit fails. Observations with different
keys or shapes never share a forward.

HTTP on the same port: ``GET /healthz`` answers ``200 OK`` (as openpi's server does) and
``GET /stats`` a JSON object counting requests, forwards and batch sizes.

A key: with one (see :mod:`pytest_hud.serving.cli` for where the command line takes it from), every
WebSocket handshake (and ``GET /stats``) must carry ``Authorization: Api-Key KEY``, the header
openpi-client's ``WebsocketClientPolicy(..., api_key=KEY)`` sends: none is answered ``401``, a
wrong one ``403``; ``/healthz`` stays open for load balancers. Bound beyond loopback (``--host
0.0.0.0``, a LAN address), the server refuses to start without a key. The key keeps strangers from
using the policy; it does not encrypt anything (plain ``ws://``: use a private network or a
TLS-terminating proxy for that).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import http
import ipaddress
import json
import os
import time
import traceback
from collections import deque
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from websockets.asyncio.server import Request, Response, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode

from pytest_hud.core.contract import flatten_observation
from pytest_hud.wire.codec import (
    MAX_FRAME_BYTES, NotAMapError, TextFrameError, WireError, packb, unpack_map,
)
from pytest_hud.agent.remote import API_KEY_ENV
from pytest_hud.serving.batcher import DEFAULT_WINDOW_SHARE, MAX_WINDOW_S, Batcher, Outcome, RequestError

__all__ = ["PROTOCOL", "PolicyServer", "RequestError", "is_loopback", "key_required_error"]

PROTOCOL = "pytest-hud/policy/1"
PROMPT_KEY = "prompt"  # the key openpi clients put the task instruction under


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server on this machine (``""`` and ``0.0.0.0`` do not)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name other than localhost: it may resolve to any interface


def key_required_error(host: str) -> str | None:
    """Why a server without a key must not bind ``host``, or None when it may."""
    if is_loopback(host):
        return None
    return (
        f"refusing to serve on {host!r} without a key: a policy server reachable beyond this machine "
        f"must authenticate its clients. Set {API_KEY_ENV}=KEY in the server's environment (or pass "
        "--api-key KEY); clients send it as 'Authorization: Api-Key KEY' (pytest-hud: the same "
        f"{API_KEY_ENV} variable or RemotePolicy(api_key=KEY); openpi-client: "
        "WebsocketClientPolicy(host, port, api_key=KEY)). Or bind 127.0.0.1"
    )


@dataclass
class _Pending:
    observation: dict[str, Any]
    prompt: str | None
    future: asyncio.Future
    enqueued: float  # loop.time() when it arrived


def _error_text(what: str, exc: BaseException) -> str:
    # A readable first line, then the traceback (openpi's server sends the traceback as the text
    # frame so that remote debugging needs no access to the server's logs).
    body = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f"{what}: {type(exc).__name__}: {exc}\n\n{body}"


class PolicyServer:
    """Serves ``model`` over the openpi protocol, batching concurrent requests.

    ::

        server = PolicyServer(model, batch_window_s=0.002)
        port = await server.start("127.0.0.1", 0)
        ...
        await server.close()
    """

    def __init__(
        self,
        model: Any,
        *,
        batch_window_s: float = 0.002,
        max_batch: int = 0,
        metadata: Mapping[str, Any] | None = None,
        name: str = "policy",
        api_key: str | None = None,
        window_share: float = DEFAULT_WINDOW_SHARE,
        max_window_s: float = MAX_WINDOW_S,
    ) -> None:
        # The batching rules and the forward (and their argument checks); this class keeps the queue.
        self.batcher = Batcher(model, batch_window_s=batch_window_s, max_batch=max_batch,
                               window_share=window_share, max_window_s=max_window_s)
        self.model = model
        self.api_key = api_key or None
        self.name = name
        policy_metadata = getattr(model, "metadata", None)
        self.metadata: dict[str, Any] = dict(policy_metadata) if isinstance(policy_metadata, Mapping) else {}
        self.metadata.update(metadata or {})
        self.metadata.update(
            {
                "server": PROTOCOL,
                "batching": True,
                "batch_window_ms": batch_window_s * 1000.0,
                "max_batch": max_batch,
            }
        )
        packb(self.metadata)  # fail at start-up, not on the first connection
        self.started = time.monotonic()
        self.stats: dict[str, Any] = {
            "requests": 0,  # observation frames received
            "replies": 0,  # action frames sent
            "errors": 0,  # requests answered with an error frame
            "batches": 0,  # batches handed to the worker thread
            "forwards": 0,  # model calls (predict_batch, or predict for models without it)
            "batch_sizes": {},  # batch size -> how many batches had it
            "max_batch_seen": 0,
            "connections": 0,  # open now
            "connections_total": 0,
            "refused": 0,  # handshakes without the right key
        }
        self.port = 0
        self._waiting: deque[_Pending] = deque()
        self._arrived: asyncio.Event | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hud-policy")
        self._batch_task: asyncio.Task | None = None
        self._server: Any = None

    # ------------------------------------------------------------- lifecycle
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Bind and start serving; returns the bound port.

        Raises ``PermissionError`` for a host beyond loopback when the server has no key.
        """
        if self.api_key is None and (refusal := key_required_error(host)):
            raise PermissionError(refusal)
        self._arrived = asyncio.Event()
        self._batch_task = asyncio.create_task(self._batch_loop(), name="hud-policy-batcher")
        self._server = await serve(
            self._serve_connection,
            host,
            port,
            compression=None,
            max_size=MAX_FRAME_BYTES,
            ping_interval=None,  # a first forward may legitimately take minutes (warm-up, JIT)
            process_request=self._http,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def close(self) -> None:
        """Stop serving; requests still waiting are failed (a running forward is abandoned)."""
        if self._server is not None:
            self._server.close()
        if self._batch_task is not None:
            self._batch_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._batch_task
        while self._waiting:
            pending = self._waiting.popleft()
            if not pending.future.done():
                pending.future.set_exception(RequestError("the policy server is shutting down"))
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5.0)
        self._executor.shutdown(wait=False, cancel_futures=True)

    def snapshot(self) -> dict[str, Any]:
        """The stats as builtin types (what ``GET /stats`` answers)."""
        stats = dict(self.stats)
        stats["batch_sizes"] = {str(k): v for k, v in sorted(self.stats["batch_sizes"].items())}
        stats["batch_window_ms"] = self.window_s() * 1000.0  # what a batch waits now (see window_s)
        stats["uptime_s"] = round(time.monotonic() - self.started, 3)
        stats["pid"] = os.getpid()
        stats["policy"] = self.name
        return stats

    # ------------------------------------------------------------------ HTTP
    def _http(self, connection: ServerConnection, request: Request) -> Response | None:
        path = request.path.split("?", 1)[0]
        if path == "/healthz":
            return connection.respond(http.HTTPStatus.OK, "OK\n")
        if self.api_key is not None and (refused := self._check_key(connection, request)) is not None:
            return refused
        if path == "/stats":
            response = connection.respond(http.HTTPStatus.OK, json.dumps(self.snapshot()) + "\n")
            del response.headers["Content-Type"]
            response.headers["Content-Type"] = "application/json"
            return response
        return None  # the WebSocket handshake

    def _check_key(self, connection: ServerConnection, request: Request) -> Response | None:
        """None when the request carries the key; else the 401 (no key) or 403 (wrong key)."""
        assert self.api_key is not None
        header = request.headers.get("Authorization")
        if header is None:
            self.stats["refused"] += 1
            response = connection.respond(
                http.HTTPStatus.UNAUTHORIZED,
                "this policy server needs a key: send the header 'Authorization: Api-Key KEY' "
                "(openpi-client: WebsocketClientPolicy(..., api_key=KEY); pytest-hud: "
                f"{API_KEY_ENV}=KEY)\n",
            )
            response.headers["WWW-Authenticate"] = "Api-Key"
            return response
        scheme, _, given = header.strip().partition(" ")
        if scheme.lower() != "api-key" or not hmac.compare_digest(given.strip().encode(), self.api_key.encode()):
            self.stats["refused"] += 1
            return connection.respond(
                http.HTTPStatus.FORBIDDEN,
                "wrong key: the 'Authorization: Api-Key ...' header does not match this policy server's key\n",
            )
        return None

    # ------------------------------------------------------------ connection
    async def _serve_connection(self, ws: ServerConnection) -> None:
        self.stats["connections"] += 1
        self.stats["connections_total"] += 1
        try:
            await ws.send(packb(self.metadata))
            prev_total_s: float | None = None
            while True:
                # As openpi's server: a cycle runs from waiting for the request to the reply sent,
                # and is reported in the *next* reply (the send time is only known afterwards).
                start = time.monotonic()
                raw = await ws.recv()
                self.stats["requests"] += 1
                try:
                    observation, prompt = self._parse(raw)
                except RequestError as exc:
                    await self._fail(ws, f"policy server ({self.name}): {exc}", CloseCode.INVALID_DATA)
                    return
                loop = asyncio.get_running_loop()
                pending = _Pending(observation, prompt, loop.create_future(), loop.time())
                self._waiting.append(pending)
                assert self._arrived is not None
                self._arrived.set()
                try:
                    actions, timing = await pending.future
                except Exception as exc:  # noqa: BLE001 - the policy's error goes to its caller only
                    await self._fail(
                        ws,
                        _error_text(f"policy server ({self.name}): the policy failed on this request", exc),
                        CloseCode.INTERNAL_ERROR,
                    )
                    return
                if prev_total_s is not None:
                    timing["prev_total_ms"] = prev_total_s * 1000.0
                await ws.send(packb({"actions": actions, "server_timing": timing}))
                self.stats["replies"] += 1
                prev_total_s = time.monotonic() - start
        except ConnectionClosed:
            pass
        finally:
            self.stats["connections"] -= 1

    def _parse(self, raw: bytes | str) -> tuple[dict[str, Any], str | None]:
        try:
            frame = unpack_map(raw)
        except TextFrameError:
            raise RequestError("observation frames must be binary msgpack, not text") from None
        except NotAMapError as exc:
            raise RequestError(f"an observation frame must be a map, got a {exc.got}") from None
        except WireError as exc:
            raise RequestError(f"cannot decode the observation frame: {exc}") from None
        prompt = frame.pop(PROMPT_KEY, None)
        if prompt is not None and not isinstance(prompt, str):
            raise RequestError(f"'prompt' must be a string, got a {type(prompt).__name__}")
        # Nested maps (openpi examples such as {"images": {"cam_high": ...}}) become slash keys,
        # the names a contract gives them.
        observation = flatten_observation(frame) if frame else {}
        return observation, prompt

    async def _fail(self, ws: ServerConnection, text: str, code: CloseCode) -> None:
        """Send the error as a text frame, then close (as openpi's server does)."""
        self.stats["errors"] += 1
        reason = "Internal server error. Traceback included in previous frame."
        if code is not CloseCode.INTERNAL_ERROR:
            reason = "Bad request. Reason included in previous frame."
        with contextlib.suppress(ConnectionClosed):
            await ws.send(text)
            await ws.close(code, reason)

    # -------------------------------------------------------------- batching
    async def _batch_loop(self) -> None:
        assert self._arrived is not None
        arrived, waiting, batcher = self._arrived, self._waiting, self.batcher
        loop = asyncio.get_running_loop()
        while True:
            while not waiting:
                arrived.clear()
                await arrived.wait()
            # The oldest waiting request opens the window; requests that queued up while the
            # previous batch ran are already past it and go at once. A connection has at most one
            # request waiting: once every open one has, nobody else can join.
            deadline = waiting[0].enqueued + batcher.window_s()
            while batcher.waits(len(waiting), self.stats["connections"], loop.time(), deadline):
                arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(arrived.wait(), deadline - loop.time())
            batch = [waiting.popleft() for _ in range(batcher.take(len(waiting)))]
            live = [p for p in batch if not p.future.done()]  # callers that went away are skipped
            if not live:
                continue
            started = loop.time()
            try:
                outcome = await loop.run_in_executor(
                    self._executor, batcher.forward, [p.observation for p in live], [p.prompt for p in live]
                )
            except Exception as exc:  # noqa: BLE001 - never let the batcher die
                outcome = Outcome([exc] * len(live), 0, 0.0)
            batcher.timed(outcome)
            self._count(len(live), outcome.forwards)
            for pending, row in zip(live, outcome.rows):
                if pending.future.done():
                    continue
                if isinstance(row, BaseException):
                    pending.future.set_exception(row)
                else:
                    pending.future.set_result(
                        (
                            row,
                            {
                                "infer_ms": outcome.forward_s * 1000.0,
                                "queue_ms": (started - pending.enqueued) * 1000.0,
                                "batch_size": len(live),
                            },
                        )
                    )

    def window_s(self) -> float:
        """How long the oldest waiting request waits for others (:meth:`Batcher.window_s`)."""
        return self.batcher.window_s()

    def _count(self, size: int, forwards: int) -> None:
        self.stats["batches"] += 1
        self.stats["forwards"] += forwards
        sizes = self.stats["batch_sizes"]
        sizes[size] = sizes.get(size, 0) + 1
        self.stats["max_batch_seen"] = max(self.stats["max_batch_seen"], size)
