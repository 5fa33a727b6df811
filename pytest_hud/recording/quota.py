"""``--hud-video-max``: how many videos each task may still have (no numpy: the controller keeps one)."""

from __future__ import annotations

import threading

__all__ = ["VideoQuota"]


class VideoQuota:
    """At most ``limit`` videos per task (None: no limit). An episode takes one as it starts
    (:meth:`take`), then either keeps it (:meth:`keep`: its video is being made) or gives it back
    (:meth:`give_back`: it needs none). Thread-safe: the controller answers every worker's calls
    from its pool's threads.

    A take made for a ``holder`` (a worker) stays open until it is kept or given back; a worker
    that dies mid-episode settles neither, and :meth:`release` gives its open takes back, so a
    crash does not cost its task a video."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._taken: dict[str, int] = {}
        self._open: dict[str, list[str]] = {}  # holder -> the tasks of its takes not yet settled
        self._lock = threading.Lock()

    def take(self, task: str, holder: str | None = None) -> bool:
        """One of ``task``'s videos for the episode starting now; False when none is left."""
        with self._lock:
            taken = self._taken.get(task, 0)
            if self.limit is not None and taken >= self.limit:
                return False
            self._taken[task] = taken + 1
            if holder is not None:
                self._open.setdefault(holder, []).append(task)
            return True

    def give_back(self, task: str, holder: str | None = None) -> None:
        """The video an episode of ``task`` took and did not need goes to a later episode."""
        with self._lock:
            if self._settle(task, holder):
                self._return(task)

    def keep(self, task: str, holder: str | None = None) -> None:
        """The video an episode of ``task`` took is being made: it stays taken."""
        with self._lock:
            self._settle(task, holder)

    def release(self, holder: str) -> int:
        """Give back every take of ``holder`` that was neither kept nor given back (the worker died
        mid-episode); how many."""
        with self._lock:
            tasks = self._open.pop(holder, [])
            for task in tasks:
                self._return(task)
            return len(tasks)

    def _return(self, task: str) -> None:
        self._taken[task] = max(0, self._taken.get(task, 0) - 1)

    def _settle(self, task: str, holder: str | None) -> bool:
        """Close ``holder``'s take of ``task``; False where it has none open (settled already)."""
        if holder is None:
            return True
        tasks = self._open.get(holder, [])
        if task not in tasks:
            return False
        tasks.remove(task)
        return True

    def __call__(self, task: str, what: str, holder: str | None = None) -> bool:
        """``take``, ``keep`` or ``give_back`` one of ``task``'s videos (True but for a refused
        take): the ``slots`` a recorder is given."""
        if what == "take":
            return self.take(task, holder)
        if what == "keep":
            self.keep(task, holder)
        elif what == "give_back":
            self.give_back(task, holder)
        else:
            raise ValueError(f"video slot call {what!r} is not one of take, keep, give_back")
        return True
