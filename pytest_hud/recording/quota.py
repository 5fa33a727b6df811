"""``--hud-video-max``: how many videos each task may still have (no numpy: the controller keeps one)."""

from __future__ import annotations

import threading

__all__ = ["VideoQuota"]


class VideoQuota:
    """At most ``limit`` videos per task (None: no limit). An episode takes one as it starts
    (:meth:`take`) and gives it back if it needs none (:meth:`give_back`). Thread-safe: the
    controller answers every worker's calls from its pool's threads."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._taken: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, task: str) -> bool:
        """One of ``task``'s videos for the episode starting now; False when none is left."""
        with self._lock:
            taken = self._taken.get(task, 0)
            if self.limit is not None and taken >= self.limit:
                return False
            self._taken[task] = taken + 1
            return True

    def give_back(self, task: str) -> None:
        """The video an episode of ``task`` took and did not need goes to a later episode."""
        with self._lock:
            self._taken[task] = max(0, self._taken.get(task, 0) - 1)

    def __call__(self, task: str, take: bool) -> bool:
        """``take(task)`` or ``give_back(task)`` (then True): the ``slots`` a recorder is given."""
        if take:
            return self.take(task)
        self.give_back(task)
        return True
