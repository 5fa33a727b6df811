"""The bridge's sim gate: one sequence of sim calls at a time, in arrival order, or lane steps side by side.

The sim runs on one thread, and a slot's reset must never interleave with a batched step: every
sim call sequence of :mod:`.server` (a tick, a reset, a rebuild) holds this gate. It is its own
class rather than an ``asyncio.Lock`` because the tick takes it synchronously when free, on the
per-step path, and because lanes mode lets several lanes' steps share it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

__all__ = ["SimGate"]


class SimGate:
    """One sim call sequence at a time, in arrival order (what ``asyncio.Lock`` does), plus
    :meth:`try_take` for the tick's synchronous path.

    Lanes mode: lane steps *share* the gate (:meth:`try_share`, :meth:`release_share`), any number
    at once, while nobody holds it or waits for it whole; a holder waits until the shares are
    back. ``on_free`` is called when the gate becomes free after a whole hold, so that lanes whose
    actions came in meanwhile start.
    """

    def __init__(self, on_free: Callable[[], None] | None = None) -> None:
        self._busy = False
        self._shares = 0
        self._waiters: deque[asyncio.Future] = deque()
        self._on_free = on_free

    def try_take(self) -> bool:
        if self._busy or self._shares:
            return False
        self._busy = True
        return True

    def try_share(self) -> bool:
        if self._busy or self._waiters:
            return False
        self._shares += 1
        return True

    def release_share(self) -> None:
        self._shares -= 1
        if not self._shares:
            self._hand_over()

    async def acquire(self) -> None:
        if self.try_take():
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # it was handed over just as this caller gave up: pass it on
            raise

    def release(self) -> None:
        self._busy = False
        self._hand_over()
        if not self._busy and self._on_free is not None:
            self._on_free()

    def _hand_over(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._busy = True
                waiter.set_result(None)  # busy again: handed to that waiter
                return

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()
