"""Run sim calls on the process's main thread, on behalf of the serving thread.

Thread-affine sims (Isaac/Omniverse, MuJoCo GL contexts) must be touched from the thread that
created them; the bridge keeps the main thread for the sim and queues every call to it.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

__all__ = ["MainThreadExecutor"]


class MainThreadExecutor:
    """A queue of calls that :meth:`run` executes, in order, on the thread that calls it."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[..., Any], tuple, Future] | None] = queue.SimpleQueue()
        self._stopped = threading.Event()

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        fut: Future = Future()
        if self._stopped.is_set():
            fut.set_exception(RuntimeError("the bridge is shutting down"))
        else:
            self._queue.put((fn, args, fut))
        return fut

    def stop(self) -> None:
        self._stopped.set()
        self._queue.put(None)

    def run(self, poll: Callable[[], None] | None = None, poll_every: float = 0.5) -> None:
        """Execute calls until :meth:`stop`; ``poll`` runs between calls at least every ``poll_every`` s."""
        last_poll = time.monotonic()
        while not self._stopped.is_set():
            try:
                item = self._queue.get(timeout=poll_every)
            except queue.Empty:
                item = None
            if poll is not None and time.monotonic() - last_poll >= poll_every:
                last_poll = time.monotonic()
                poll()
            if item is None:
                continue
            fn, args, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001 - delivered to the caller
                fut.set_exception(exc)
        # fail whatever is still queued so no caller waits forever
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[2].set_exception(RuntimeError("the bridge is shutting down"))
