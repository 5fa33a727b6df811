"""The policy server's batcher: which waiting requests go to the model together, and the forward.

Pure on purpose: no sockets, no event loop, no threads. The server (:mod:`pytest_hud.serving.server`)
keeps the queue and the connections and asks this module three questions: how long the oldest
waiting request waits for others (:meth:`Batcher.window_s`), whether a batch keeps gathering
(:meth:`Batcher.waits`) and how many requests it takes (:meth:`Batcher.take`); then it runs
:meth:`Batcher.forward` on its worker thread. So the rules that decide which requests share a
forward, and which request a failure is pinned on, can be tested with a fake model.

The rules:

- Observations with different keys, shapes or dtypes never share a forward: each group of equal
  signatures is one ``predict_batch(observations, prompts)`` call (one ``predict`` per request for
  a model without ``predict_batch``).
- When a batched call raises, its requests are retried one by one, so only the request that makes
  the policy raise fails; every other caller gets its row.
- The window is ``batch_window_s``, or ``window_share`` of a recent forward's time when that is
  longer, up to ``max_window_s``: a request that joins saves a whole forward, so a slow model waits
  a little longer for requests sent a few milliseconds apart.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["DEFAULT_WINDOW_SHARE", "MAX_WINDOW_S", "Batcher", "Outcome", "RequestError"]

#: The batch window as a share of a recent forward's time (when longer than --batch-window-ms), and
#: its cap: waiting a tenth of a forward for a request that would otherwise need a forward of its own.
DEFAULT_WINDOW_SHARE = 0.1
MAX_WINDOW_S = 0.020


class RequestError(ValueError):
    """A request the server cannot serve (bad frame, or the policy raised on it)."""


@dataclass
class Outcome:
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


class Batcher:
    """The batching rules and the forward for ``model`` (see the module docstring).

    ::

        batcher = Batcher(model, batch_window_s=0.002)
        deadline = oldest_enqueued + batcher.window_s()
        while batcher.waits(len(waiting), connections, now(), deadline): ...
        outcome = batcher.forward(observations, prompts)   # on the worker thread
        batcher.timed(outcome)
    """

    def __init__(
        self,
        model: Any,
        *,
        batch_window_s: float = 0.002,
        max_batch: int = 0,
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
        self.batch_window_s = batch_window_s
        self.window_share = window_share
        self.max_window_s = max(max_window_s, batch_window_s)
        self.forward_s: float | None = None  # a recent forward's time (moving average)
        self.max_batch = max_batch
        self._predict_batch = getattr(model, "predict_batch", None)
        if not callable(self._predict_batch):
            self._predict_batch = None

    # ------------------------------------------------------------- decisions
    def window_s(self) -> float:
        """How long the oldest waiting request waits for others: ``batch_window_s``, or
        ``window_share`` of a recent forward when that is longer (up to ``max_window_s``)."""
        if not self.window_share or self.forward_s is None:
            return self.batch_window_s
        return max(self.batch_window_s, min(self.window_share * self.forward_s, self.max_window_s))

    def waits(self, waiting: int, connections: int, now: float, deadline: float) -> bool:
        """Whether a batch of ``waiting`` requests keeps gathering: it goes early once ``max_batch``
        wait or every open connection has a request waiting (a connection has at most one, so
        nobody else can join), and at ``deadline`` otherwise."""
        return ((not self.max_batch or waiting < self.max_batch)
                and waiting < connections and now < deadline)

    def take(self, waiting: int) -> int:
        """How many of the ``waiting`` requests (oldest first) the next batch takes."""
        return waiting if not self.max_batch else min(self.max_batch, waiting)

    def timed(self, outcome: Outcome) -> None:
        """Fold a batch's forward time into the recent forward time :meth:`window_s` scales with."""
        if outcome.forwards:
            took = outcome.forward_s / outcome.forwards
            self.forward_s = took if self.forward_s is None else 0.8 * self.forward_s + 0.2 * took

    # --------------------------------------------------------------- forward
    def _batched(self, observations: list[dict[str, Any]], prompts: list[str | None]) -> list[np.ndarray]:
        assert self._predict_batch is not None
        rows = list(self._predict_batch(observations, prompts))
        if len(rows) != len(observations):
            raise RequestError(
                f"the policy's predict_batch returned {len(rows)} rows for {len(observations)} "
                "observations; it must return one action chunk per observation"
            )
        return [_as_chunk(row) for row in rows]

    def forward(self, observations: list[dict[str, Any]], prompts: list[str | None]) -> Outcome:
        """Runs on the worker thread: one model call per group of stackable observations.

        Each request's row is its action chunk, or the exception that fails that request alone.
        """
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
            return Outcome(rows, forwards, time.monotonic() - t0)
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
        return Outcome(rows, forwards, time.monotonic() - t0)
