"""A policy behind an openpi-compatible WebSocket server, as a pytest-hud model.

``--hud-policy ws://host:port`` makes each worker forward its observations to a policy server:
pytest-hud's own (``python -m pytest_hud.serving``, which batches all workers' requests into
shared forwards) or openpi's ``WebsocketPolicyServer``. On the wire it behaves as openpi's
``WebsocketClientPolicy``: read the server's metadata frame, send a msgpack map of the observation
(plus ``"prompt"`` when there is one), read back a map holding ``"actions"``; a text frame is the
server's error. Unlike that client it never waits forever: connecting, and every reply, are
bounded by ``timeout``. ::

    policy = RemotePolicy("ws://127.0.0.1:8000")
    chunk = policy.predict({"state": state}, prompt="reach the goal")  # [T, A]
    policy.close()

A server bound beyond loopback requires a key (see :mod:`pytest_hud.serving.server`). The client
sends it as openpi-client's ``WebsocketClientPolicy(..., api_key=KEY)`` does, in an
``Authorization: Api-Key KEY`` header of the WebSocket handshake; ``api_key`` defaults to the
``PYTEST_HUD_POLICY_KEY`` environment variable. ::

    policy = RemotePolicy("ws://gpu-box:8000", api_key=os.environ["MY_KEY"])

One connection per process, opened on first use (and again in a forked child, or after the server
closed the previous one, e.g. following an error that failed one episode).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from pytest_hud.wire.codec import (
    MAX_FRAME_BYTES, NotAMapError, TextFrameError, WireError, packb, unpack_map,
)
from pytest_hud.wire.wsclient import BlockingWebSocket

__all__ = ["API_KEY_ENV", "RemotePolicy", "RemotePolicyError", "api_key_header"]

API_KEY_ENV = "PYTEST_HUD_POLICY_KEY"  # the policy server's key, for the server and its clients


def api_key_header(key: str) -> dict[str, str]:
    """The handshake header that carries ``key``, exactly as openpi-client sends it."""
    return {"Authorization": f"Api-Key {key}"}


class RemotePolicyError(RuntimeError):
    """The policy server refused a request, failed on it, went away or did not answer in time."""


class RemotePolicy:
    """A :class:`~pytest_hud.agent.model.Model` that asks an openpi-compatible server for actions."""

    def __init__(self, url: str, timeout: float = 30.0, api_key: str | None = None) -> None:
        if not url.startswith("ws://"):
            raise RemotePolicyError(
                f"policy server URL {url!r} must start with ws:// (wss:// is not supported)"
            )
        if timeout <= 0:
            raise ValueError(f"timeout must be positive seconds, got {timeout}")
        self.url = url
        self.timeout = float(timeout)
        self.api_key = api_key if api_key is not None else (os.environ.get(API_KEY_ENV) or None)
        self.metadata: dict[str, Any] | None = None  # the server's metadata frame, once connected
        self.last_reply: dict[str, Any] | None = None  # the whole last reply (server_timing, ...)
        self._ws: BlockingWebSocket | None = None
        self._pid: int | None = None

    # ------------------------------------------------------------ connection
    def connect(self) -> dict[str, Any]:
        """Open the connection now (it opens on first use otherwise); returns the server's metadata."""
        self._connection()
        assert self.metadata is not None
        return self.metadata

    def _connection(self) -> BlockingWebSocket:
        if self._ws is not None and self._pid == os.getpid():
            return self._ws
        # A connection inherited through fork belongs to the parent: leave its socket alone.
        self._ws = None
        try:
            ws = BlockingWebSocket(self.url, max_size=MAX_FRAME_BYTES, open_timeout=self.timeout,
                                   headers=api_key_header(self.api_key) if self.api_key else None)
        except InvalidStatus as exc:
            raise RemotePolicyError(self._refused(exc)) from None
        except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
            raise RemotePolicyError(
                f"cannot connect to the policy server at {self.url}: {type(exc).__name__}: {exc}; "
                "is it running, and is this its address?"
            ) from None
        try:
            metadata = self._decode(self._recv(ws, "its metadata frame"), "metadata frame")
        except BaseException:
            ws.close()
            raise
        self._ws, self._pid, self.metadata = ws, os.getpid(), metadata
        return ws

    def _refused(self, exc: InvalidStatus) -> str:
        status = exc.response.status_code
        if status in (401, 403):
            have = "sent no key" if not self.api_key else "sent a key the server does not accept"
            return (
                f"the policy server at {self.url} refused the connection (HTTP {status}): this client "
                f"{have}; pass the server's key as RemotePolicy(api_key=...) or in the "
                f"{API_KEY_ENV} environment variable"
            )
        return f"the policy server at {self.url} refused the WebSocket handshake (HTTP {status})"

    def _recv(self, ws: BlockingWebSocket, what: str) -> bytes | str:
        try:
            return ws.recv(self.timeout)
        except TimeoutError:
            raise RemotePolicyError(
                f"the policy server at {self.url} did not send {what} within {self.timeout:g} s; "
                "if its model is that slow, give RemotePolicy a larger timeout"
            ) from None
        except ConnectionClosed as exc:
            raise RemotePolicyError(
                f"the policy server at {self.url} closed the connection without an error frame "
                f"while we waited for {what} ({_close_text(exc)})"
            ) from None

    def _decode(self, raw: bytes | str, what: str) -> dict[str, Any]:
        try:
            return unpack_map(raw)
        except TextFrameError as exc:
            raise RemotePolicyError(f"the policy server at {self.url} reported an error:\n{exc.text}") from None
        except NotAMapError as exc:
            raise RemotePolicyError(
                f"the policy server at {self.url} sent a {exc.got} as its {what}, expected a map"
            ) from None
        except WireError as exc:
            raise RemotePolicyError(
                f"the policy server at {self.url} sent an undecodable {what}: {exc}"
            ) from None

    # ----------------------------------------------------------------- model
    def predict(self, observation: Mapping[str, Any], prompt: str | None = None) -> np.ndarray:
        """The server's ``actions`` for one observation (``[T, A]`` from chunking policies)."""
        request = dict(observation)
        if prompt is not None:
            request["prompt"] = prompt
        try:
            data = packb(request)
        except WireError as exc:
            raise RemotePolicyError(f"cannot send this observation to {self.url}: {exc}") from None
        ws = self._connection()
        try:
            try:
                ws.send(data)
            except (ConnectionClosed, OSError) as exc:
                raise RemotePolicyError(
                    f"the policy server at {self.url} closed the connection before the request was sent "
                    f"({_close_text(exc)})"
                ) from None
            reply = self._decode(self._recv(ws, "the actions"), "reply")
        except RemotePolicyError:
            # The server closes after an error frame; a stale or half-read connection must not be
            # reused, so the next episode starts on a fresh one.
            self._drop()
            raise
        if "actions" not in reply:
            raise RemotePolicyError(
                f"the policy server at {self.url} answered without 'actions' (keys: {sorted(reply)})"
            )
        self.last_reply = reply
        return np.asarray(reply["actions"])

    def reset(self) -> None:
        """Nothing to clear: the server is stateless per request (as openpi's client)."""

    def _drop(self) -> None:
        ws, self._ws = self._ws, None
        if ws is not None and self._pid == os.getpid():
            ws.close()

    def close(self) -> None:
        """Close this process's connection (a later ``predict`` opens a new one)."""
        self._drop()

    def __enter__(self) -> RemotePolicy:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemotePolicy({self.url!r}, timeout={self.timeout:g})"


def _close_text(exc: BaseException) -> str:
    if isinstance(exc, ConnectionClosed):
        frame = exc.rcvd
        if frame is None:
            return "no close frame: the connection dropped"
        return f"close code {int(frame.code)}" + (f": {frame.reason}" if frame.reason else "")
    return f"{type(exc).__name__}: {exc}"
