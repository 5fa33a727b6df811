"""Run sim calls on the process's main thread, on behalf of the serving thread.

Thread-affine sims (Isaac/Omniverse, MuJoCo GL contexts) must be touched from the thread that
created them; the bridge keeps the main thread for the sim and queues every call to it.
"""

from __future__ import annotations

import asyncio
import functools
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

__all__ = ["InlineExecutor", "MainThreadExecutor"]


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

    def submit_to(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> asyncio.Future:
        """:meth:`submit` for a caller on ``loop``: the answer comes back as one of its futures.

        One ``call_soon_threadsafe`` per call, instead of a ``concurrent.futures.Future`` chained
        to an asyncio one (two more locks and a callback chain on every tick).
        """
        reply = _LoopReply(loop)
        if self._stopped.is_set():
            reply.set_exception(RuntimeError("the bridge is shutting down"))
        else:
            self._queue.put((fn, args, reply))  # type: ignore[arg-type]
        return reply.future

    def call_to(self, loop: asyncio.AbstractEventLoop, callback: Callable[[Any, BaseException | None], None],
                fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` here, then ``callback(result, exception)`` on ``loop``: no future at all,
        for the tick, whose continuation is a plain function."""
        reply = _LoopCallback(loop, callback)
        if self._stopped.is_set():
            reply.set_exception(RuntimeError("the bridge is shutting down"))
        else:
            self._queue.put((fn, args, reply))  # type: ignore[arg-type]

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


class InlineExecutor:
    """:class:`MainThreadExecutor`'s two entry points for a loop that runs on the sim's own thread:
    the call runs right away, in the caller's stack (no queue, no wake-up, no GIL transfer)."""

    def submit_to(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> asyncio.Future:
        future: asyncio.Future = loop.create_future()
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - delivered to the caller
            future.set_exception(exc)
        return future

    def call_to(self, loop: asyncio.AbstractEventLoop, callback: Callable[[Any, BaseException | None], None],
                fn: Callable[..., Any], *args: Any) -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - delivered to the callback
            callback(None, exc)
            return
        callback(result, None)


class _LoopCallback:
    """The :class:`~concurrent.futures.Future` methods :meth:`MainThreadExecutor.run` calls,
    delivering ``callback(value, exc)`` on ``loop``."""

    __slots__ = ("callback", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[Any, BaseException | None], None]) -> None:
        self.loop = loop
        self.callback = callback

    def set_running_or_notify_cancel(self) -> bool:
        return True

    def set_result(self, value: Any) -> None:
        self._deliver(value, None)

    def set_exception(self, exc: BaseException) -> None:
        self._deliver(None, exc)

    def _deliver(self, value: Any, exc: BaseException | None) -> None:
        try:
            self.loop.call_soon_threadsafe(self.callback, value, exc)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass


class _LoopReply(_LoopCallback):
    """A :class:`_LoopCallback` that settles an asyncio future of ``loop``."""

    __slots__ = ("future",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.future: asyncio.Future = loop.create_future()
        super().__init__(loop, functools.partial(_settle, self.future))

    def set_running_or_notify_cancel(self) -> bool:
        return not self.future.cancelled()


def _settle(future: asyncio.Future, value: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(value)
