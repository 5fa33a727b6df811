"""Sub-envs stepped on threads: ``--hud-vectorization=threads``.

For sims whose step spends its time in C code that releases the GIL (physics engines such as
MuJoCo or Chipmunk/pymunk, image resizing), stepping a bridge's independent envs on several threads
uses several cores from one bridge process, with no process per env and no copies between
processes. Each env has one owner thread for its whole life (built, reset, stepped and closed
there), since some libraries tie state to the thread that made it (a GL context current on one
thread cannot be made current on another until released). Env ``i`` lives on thread
``i % threads``; a call runs each thread's envs in slot order, and returns when all are done.

The result of every env call is what the same call returns on the bridge's thread, provided the
env is safe to run on several threads at once: only which core runs it changes, so episodes are
identical whatever the vectorization (tests prove it for gymnasium's state envs). Not every env is:
gymnasium's classic-control rendering (pygame) was seen to differ in a few pixels now and then
when several instances render at once. :func:`pytest_hud.sim.threadcheck.check_threads` (``python -m pytest_hud.bridge
TARGET --check-threads``) compares a seeded run on threads with one on a single thread.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["EnvThreads", "default_threads"]

T = TypeVar("T")


def default_threads(width: int) -> int:
    """One thread per core the process may use, never more than the bridge's slots."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(width, cores))


class EnvThreads:
    """``threads`` owner threads for envs ``0 .. width-1`` (env ``i`` on thread ``i % threads``)."""

    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        self.threads = threads
        self._owners = [ThreadPoolExecutor(1, thread_name_prefix=f"hud-env-{k}") for k in range(threads)]
        self._closed = False

    def map(self, fn: Callable[[int], T], indices: Sequence[int]) -> list[T]:
        """``[fn(i) for i in indices]``, each call on env ``i``'s owner thread; in ``indices`` order.

        Every owner finishes its share before this returns; if any call raised, the first error
        (in slot order) is raised then, so no env is still running when the caller handles it.
        """
        if self._closed:
            raise RuntimeError("the env threads are closed")
        groups: dict[int, list[int]] = {}
        for i in indices:
            groups.setdefault(i % self.threads, []).append(i)

        def run(share: list[int]) -> list[tuple[int, Any, BaseException | None]]:
            out = []
            for i in share:
                try:
                    out.append((i, fn(i), None))
                except BaseException as exc:  # noqa: BLE001 - raised below, after every owner is done
                    out.append((i, None, exc))
            return out

        futures: list[Future] = [self._owners[k].submit(run, share) for k, share in groups.items()]
        results: dict[int, Any] = {}
        errors: dict[int, BaseException] = {}
        for future in futures:
            for i, value, error in future.result():
                if error is not None:
                    errors[i] = error
                else:
                    results[i] = value
        if errors:
            raise errors[min(errors)]
        return [results[i] for i in indices]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for owner in self._owners:
            owner.shutdown(wait=True)
