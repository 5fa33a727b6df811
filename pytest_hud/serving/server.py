"""``python -m pytest_hud.serving.server --policy SPEC``: one model copy serving many episodes.

(Over 400 lines on purpose: the openpi protocol, the batching queue and the process entry point of one server, each small.)

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

Which contract the policy is loaded for:

- ``--contract PATH`` (a ``contract.json``): ``load_policy(spec, contract)``, exactly as a worker
  would load it, so a LeRobot checkpoint's input features are checked against it up front;
- no ``--contract``, a LeRobot checkpoint: loaded on its own; the checkpoint's input features *are*
  what clients must send (``state`` / ``observation.state`` / ...; see
  :func:`pytest_hud.agent.lerobot.lerobot_feature_name`), and a request that cannot feed it fails
  with a message listing both sides;
- no ``--contract``, a ``module:factory``: a factory that takes an argument is called with
  ``None`` (pass ``--contract`` if yours needs one), one that takes none is called without.

HTTP on the same port: ``GET /healthz`` answers ``200 OK`` (as openpi's server does) and
``GET /stats`` a JSON object counting requests, forwards and batch sizes.

A key: the server takes one from ``--api-key``, else ``PYTEST_HUD_SECRET`` (the run secret, which
pytest-hud sets only for the servers it starts, and which its workers send), else the
``PYTEST_HUD_POLICY_KEY`` environment variable (a key of your own for a server you start). With a key, every WebSocket handshake (and ``GET /stats``) must carry
``Authorization: Api-Key KEY``, the header openpi-client's ``WebsocketClientPolicy(...,
api_key=KEY)`` sends: none is answered ``401``, a wrong one ``403``; ``/healthz`` stays open for
load balancers. Bound beyond loopback (``--host 0.0.0.0``, a LAN address), the server refuses to
start without a key. The key keeps strangers from using the policy; it does not encrypt anything
(plain ``ws://``: use a private network or a TLS-terminating proxy for that). Prefer the
environment variable to ``--api-key``, which other users of the host can read in ``ps``.

Once bound, the server writes its announce file (mode 0600, atomic)
``{"ws": PORT, "pid": PID, "host": HOST, "url": "ws://HOST:PORT"}`` and exits by itself when its
parent process dies (``--parent-pid``, default: the process that started it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import http
import ipaddress
import json
import os
import signal
import sys
import time
import traceback
from collections import deque
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from websockets.asyncio.server import Request, Response, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.frames import CloseCode

from pytest_hud.launch.announce import parent_alive, write_announce
from pytest_hud.core.contract import flatten_observation
from pytest_hud.wire.codec import (
    MAX_FRAME_BYTES, NotAMapError, TextFrameError, WireError, packb, unpack_map,
)
from pytest_hud.agent.remote import API_KEY_ENV

__all__ = ["PROTOCOL", "PolicyServer", "RequestError", "is_loopback", "load_server_policy", "main"]

PROTOCOL = "pytest-hud/policy/1"
PROMPT_KEY = "prompt"  # the key openpi clients put the task instruction under
SECRET_ENV = "PYTEST_HUD_SECRET"  # the run secret the pool hands its children (the default key)
#: The batch window as a share of a recent forward's time (when longer than --batch-window-ms), and
#: its cap: waiting a tenth of a forward for a request that would otherwise need a forward of its own.
DEFAULT_WINDOW_SHARE = 0.1
MAX_WINDOW_S = 0.020


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


class RequestError(ValueError):
    """A request the server cannot serve (bad frame, or the policy raised on it)."""


@dataclass
class _Pending:
    observation: dict[str, Any]
    prompt: str | None
    future: asyncio.Future
    enqueued: float  # loop.time() when it arrived


@dataclass
class _Outcome:
    """What the worker thread hands back for one batch."""

    rows: list[np.ndarray | BaseException]
    forwards: int
    forward_s: float


def _signature(observation: Mapping[str, Any]) -> tuple:
    """Observations with equal signatures (keys, shapes, dtypes) can be stacked into one forward."""
    return tuple(
        sorted((key, np.shape(value), str(np.asarray(value).dtype))
               for key, value in observation.items())
    )


def _as_chunk(row: Any) -> np.ndarray:
    """A model's output for one observation as float32 ``[T, A]`` (``[A]`` is a chunk of one)."""
    actions = np.asarray(row, dtype=np.float32)
    if actions.ndim == 0:
        return actions.reshape(1, 1)
    if actions.ndim == 1:
        return actions[None, :]
    return np.ascontiguousarray(actions)


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
        if batch_window_s < 0:
            raise ValueError(f"batch window must be >= 0 seconds, got {batch_window_s}")
        if not 0 <= window_share <= 1:
            raise ValueError(f"batch window share must be between 0 and 1, got {window_share}")
        if max_batch < 0:
            raise ValueError(f"max batch must be >= 0 (0: no limit), got {max_batch}")
        self.model = model
        self.api_key = api_key or None
        self.batch_window_s = batch_window_s
        self.window_share = window_share
        self.max_window_s = max(max_window_s, batch_window_s)
        self._forward_s: float | None = None  # a recent forward's time (moving average)
        self.max_batch = max_batch
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
        self._predict_batch = getattr(model, "predict_batch", None)
        if not callable(self._predict_batch):
            self._predict_batch = None
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
        self._batcher: asyncio.Task | None = None
        self._server: Any = None

    # ------------------------------------------------------------- lifecycle
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Bind and start serving; returns the bound port.

        Raises ``PermissionError`` for a host beyond loopback when the server has no key.
        """
        if self.api_key is None and (refusal := key_required_error(host)):
            raise PermissionError(refusal)
        self._arrived = asyncio.Event()
        self._batcher = asyncio.create_task(self._batch_loop(), name="hud-policy-batcher")
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
        if self._batcher is not None:
            self._batcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._batcher
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
        arrived, waiting = self._arrived, self._waiting
        loop = asyncio.get_running_loop()
        while True:
            while not waiting:
                arrived.clear()
                await arrived.wait()
            # The oldest waiting request opens the window; requests that queued up while the
            # previous batch ran are already past it and go at once. A connection has at most one
            # request waiting: once every open one has, nobody else can join.
            deadline = waiting[0].enqueued + self.window_s()
            while ((not self.max_batch or len(waiting) < self.max_batch)
                   and len(waiting) < self.stats["connections"] and loop.time() < deadline):
                arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(arrived.wait(), deadline - loop.time())
            take = len(waiting) if not self.max_batch else min(self.max_batch, len(waiting))
            batch = [waiting.popleft() for _ in range(take)]
            live = [p for p in batch if not p.future.done()]  # callers that went away are skipped
            if not live:
                continue
            started = loop.time()
            try:
                outcome = await loop.run_in_executor(
                    self._executor, self._forward, [p.observation for p in live], [p.prompt for p in live]
                )
            except Exception as exc:  # noqa: BLE001 - never let the batcher die
                outcome = _Outcome([exc] * len(live), 0, 0.0)
            if outcome.forwards:
                took = outcome.forward_s / outcome.forwards
                self._forward_s = took if self._forward_s is None else 0.8 * self._forward_s + 0.2 * took
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
        """How long the oldest waiting request waits for others: ``batch_window_s``, or
        ``window_share`` of a recent forward when that is longer (up to ``max_window_s``)."""
        if not self.window_share or self._forward_s is None:
            return self.batch_window_s
        return max(self.batch_window_s, min(self.window_share * self._forward_s, self.max_window_s))

    def _count(self, size: int, forwards: int) -> None:
        self.stats["batches"] += 1
        self.stats["forwards"] += forwards
        sizes = self.stats["batch_sizes"]
        sizes[size] = sizes.get(size, 0) + 1
        self.stats["max_batch_seen"] = max(self.stats["max_batch_seen"], size)

    # ----------------------------------------------------- the worker thread
    def _batched(self, observations: list[dict[str, Any]], prompts: list[str | None]) -> list[np.ndarray]:
        assert self._predict_batch is not None
        rows = list(self._predict_batch(observations, prompts))
        if len(rows) != len(observations):
            raise RequestError(
                f"the policy's predict_batch returned {len(rows)} rows for {len(observations)} "
                "observations; it must return one action chunk per observation"
            )
        return [_as_chunk(row) for row in rows]

    def _forward(self, observations: list[dict[str, Any]], prompts: list[str | None]) -> _Outcome:
        """Runs on the worker thread: one model call per group of stackable observations."""
        t0 = time.monotonic()
        rows: list[np.ndarray | BaseException] = [RequestError("not computed")] * len(observations)
        forwards = 0
        if self._predict_batch is None:  # a plain Model: one predict per request
            for i, (observation, prompt) in enumerate(zip(observations, prompts)):
                forwards += 1
                try:
                    rows[i] = _as_chunk(self.model.predict(observation, prompt))
                except Exception as exc:  # noqa: BLE001 - fails this request only
                    rows[i] = exc
            return _Outcome(rows, forwards, time.monotonic() - t0)
        groups: dict[tuple, list[int]] = {}
        for index, observation in enumerate(observations):
            groups.setdefault(_signature(observation), []).append(index)
        for indices in groups.values():
            forwards += 1
            try:
                batch = self._batched([observations[i] for i in indices], [prompts[i] for i in indices])
                for i, row in zip(indices, batch):
                    rows[i] = row
                continue
            except Exception as exc:  # noqa: BLE001
                if len(indices) == 1:
                    rows[indices[0]] = exc
                    continue
            # The batched call raised: retry one by one, so only the request that makes the
            # policy raise fails.
            for i in indices:
                forwards += 1
                try:
                    rows[i] = self._batched([observations[i]], [prompts[i]])[0]
                except Exception as exc:  # noqa: BLE001
                    rows[i] = exc
        return _Outcome(rows, forwards, time.monotonic() - t0)


# --------------------------------------------------------------------------- loading
def load_server_policy(spec: str, contract_path: str | None = None, device: str = "cpu") -> Any:
    """The model a server ``--policy`` spec names (see the module docstring for the contract rules)."""
    from pytest_hud.core.contract import Contract
    from pytest_hud.agent.model import PolicyError, load_policy, policy_kind

    kind = policy_kind(spec)
    if kind == "openpi":
        raise PolicyError(
            f"--policy {spec!r} is a policy-server URL; the server serves a local policy "
            "(a LeRobot checkpoint directory or 'module:factory'); point --hud-policy at the URL instead"
        )
    if contract_path:
        return load_policy(spec, Contract.load(contract_path), device=device)
    if kind == "lerobot":
        try:
            from pytest_hud.agent.lerobot import LeRobotPolicy
        except ImportError as exc:
            raise PolicyError(
                f"policy {spec!r} is a LeRobot checkpoint but LeRobot is not importable ({exc}); "
                "install it with: pip install 'pytest-hud[lerobot]'"
            ) from None
        return LeRobotPolicy.from_checkpoint(spec, None, device=device)
    return load_policy(spec, None, device=device)  # type: ignore[arg-type]


def load_ahead(spec: str, device: str = "cpu") -> Any | None:
    """What a server can do for ``spec`` before its contract is known.

    A LeRobot checkpoint loads without one (the contract only checks the inputs, afterwards:
    :func:`check_contract`), so it is loaded now and returned: torch, LeRobot and the weights are
    most of a server's start. A factory may build its model from the contract, so only its module
    is imported (None is returned). Raises what the load raises; the import is best effort (it
    fails again in the real load, which reports it).
    """
    from pytest_hud.agent.model import policy_kind

    kind = policy_kind(spec)
    if kind == "lerobot":
        return load_server_policy(spec, None, device)
    if kind == "factory":
        from pytest_hud.sim.target import resolve_factory

        with contextlib.suppress(Exception):
            resolve_factory(spec)
    return None


def check_contract(model: Any, contract_path: str) -> None:
    """Raise ``ValueError`` unless ``model`` (a LeRobot checkpoint loaded ahead) can take the
    observations of the contract at ``contract_path``, as loading it for that contract would have."""
    from pytest_hud.core.contract import Contract

    model.check_observation_features(Contract.load(contract_path).observation_shapes())


def wait_for_contract(path: str, parent: int) -> bool:
    """Wait until ``path`` exists (the pool writes it atomically once a worker has the sim's contract);
    False if the parent died first."""
    while not os.path.exists(path):
        if parent > 1 and not parent_alive(parent):
            return False
        time.sleep(0.01)
    return True


# ------------------------------------------------------------------------------ CLI
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m pytest_hud.serving.server",
        description="Serve one policy to many clients over the openpi protocol, batching their requests.",
    )
    p.add_argument("--policy", required=True,
                   help="A LeRobot checkpoint directory, 'module:factory' or 'path/to/file.py:factory'")
    p.add_argument("--port", type=int, default=8000, help="Port to bind (0: any free port; default 8000)")
    p.add_argument("--host", default="127.0.0.1", help="Interface to bind (loopback by default)")
    contract = p.add_mutually_exclusive_group()
    contract.add_argument("--contract", default=None,
                          help="Load the policy for this contract.json (checked up front)")
    contract.add_argument("--contract-wait", default=None, metavar="PATH",
                          help="Start now: import what the policy needs, then wait for PATH (a contract.json "
                               "written later) and load the policy for it (pytest-hud's pool starts its "
                               "servers this way while the sim boots)")
    p.add_argument("--batch-window-ms", type=float, default=2.0,
                   help="How long the first waiting request waits for others to join its batch (at least)")
    p.add_argument("--batch-window-share", type=float, default=DEFAULT_WINDOW_SHARE,
                   help="Wait up to this share of a recent forward's time instead, when that is longer "
                        f"(at most {MAX_WINDOW_S * 1000:g} ms; 0: always --batch-window-ms)")
    p.add_argument("--max-batch", type=int, default=0,
                   help="Run a batch as soon as this many requests wait (0: no limit)")
    p.add_argument("--announce", default=None, help="Write the announce JSON here (mode 0600) once serving")
    p.add_argument("--device", default="cpu", help="Torch device for LeRobot checkpoints")
    p.add_argument("--threads", type=int, default=0,
                   help="Torch intra-op threads for the model (0: torch's default, one per core)")
    p.add_argument("--parent-pid", type=int, default=None,
                   help="Exit when this process dies (default: the parent process)")
    p.add_argument("--lease", type=float, default=None,
                   help="Exit when the controller has not renewed the lease for this many seconds "
                        "(for servers on other machines; the lease secret comes from $PYTEST_HUD_SECRET)")
    p.add_argument("--api-key", default=None,
                   help=f"Require this key from clients (default: ${SECRET_ENV}, else ${API_KEY_ENV}; "
                        "required beyond loopback). Prefer the environment variable: ps shows arguments")
    return p.parse_args(argv)


async def _serve(args: argparse.Namespace, model: Any, parent: int) -> int:
    server = PolicyServer(
        model,
        batch_window_s=args.batch_window_ms / 1000.0,
        window_share=args.batch_window_share,
        max_batch=args.max_batch,
        metadata={"policy": args.policy},
        name=args.policy,
        api_key=args.api_key,
    )
    try:
        port = await server.start(args.host, args.port)
    except PermissionError as exc:
        print(f"pytest-hud policy server: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"pytest-hud policy server: cannot bind {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    payload = {"ws": port, "pid": os.getpid(), "host": args.host, "url": f"ws://{args.host}:{port}"}
    lease = None
    if args.lease is not None:
        from pytest_hud.launch.lease import Lease

        lease = Lease(args.host, args.lease_secret, args.lease)
        payload["lease"] = lease.port
    if args.announce:
        write_announce(args.announce, payload)
    print(f"pytest-hud policy server: serving {args.policy} on ws://{args.host}:{port} "
          f"(pid {os.getpid()}, {'key required' if server.api_key else 'no key'})", file=sys.stderr, flush=True)
    try:
        while not stop.is_set():
            if parent > 1 and not parent_alive(parent):
                break
            ended = lease.expired() if lease is not None else None
            if ended:
                print(f"pytest-hud policy server: exiting: {ended}", file=sys.stderr, flush=True)
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)
    finally:
        if args.announce:
            with contextlib.suppress(OSError):
                os.unlink(args.announce)
        await server.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    parent = args.parent_pid if args.parent_pid is not None else os.getppid()
    if args.lease is not None and not os.environ.get("PYTEST_HUD_SECRET"):
        print("pytest-hud policy server: --lease needs the run's secret in $PYTEST_HUD_SECRET", file=sys.stderr)
        return 2
    if args.batch_window_ms < 0 or args.max_batch < 0 or args.threads < 0 or not 0 <= args.batch_window_share <= 1:
        print("pytest-hud policy server: --batch-window-ms, --max-batch and --threads must be >= 0, "
              "--batch-window-share between 0 and 1", file=sys.stderr)
        return 2
    # The key: the flag, else the run secret a pytest-hud launcher passes (it beats a user's own key
    # that happens to be in the environment: the run's workers send the secret), else the user's.
    # Popped, so that nothing the policy starts inherits them.
    args.lease_secret = os.environ.get(SECRET_ENV, "")  # the lease is held with the run secret
    keys = [os.environ.pop(SECRET_ENV, None), os.environ.pop(API_KEY_ENV, None)]
    args.api_key = args.api_key or next((key for key in keys if key), None)
    if args.api_key is None and (refusal := key_required_error(args.host)):
        print(f"pytest-hud policy server: {refusal}", file=sys.stderr)  # before loading a model
        return 2
    from pytest_hud.agent.lerobot import offline

    offline()  # a checkpoint is a local folder; never reach out
    try:
        model = None
        if args.contract_wait:
            model = load_ahead(args.policy, args.device)  # while the sims boot
            if not wait_for_contract(args.contract_wait, parent):
                return 0  # the run ended before any worker needed this server
            args.contract = args.contract_wait
        if model is None:
            model = load_server_policy(args.policy, args.contract, args.device)
        elif args.contract:
            check_contract(model, args.contract)
    except Exception as exc:  # noqa: BLE001 - any load failure is reported the same way
        print(f"pytest-hud policy server: cannot load policy {args.policy!r}: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 2
    if args.threads and "torch" in sys.modules:
        # On a CPU shared with sims and workers, torch's one-thread-per-core default can spin-wait
        # itself to a crawl; a small model often runs best on one thread.
        sys.modules["torch"].set_num_threads(args.threads)
    return asyncio.run(_serve(args, model, parent))



def run() -> None:
    """Run :func:`main` and exit at once with its code (what ``python -m`` runs)."""
    # os._exit: a forward still running on the worker thread (or a library's non-daemon thread)
    # must not keep an orphaned server alive.
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
