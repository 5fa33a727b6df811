"""Where a run's first seconds went: pytest's start, the workers, collection, each service, the
first episode, as seconds since the pytest process started.

The controller marks what it sees (:class:`StartupClock`); the summary prints one ``startup:`` line
and the results file's summary record carries the same figures (``startup``), so a slow start can
be told apart from slow episodes, and what sits on the critical path (what the first episode waited
for) is visible.
"""

from __future__ import annotations

import os
import time
from typing import Any

__all__ = ["StartupClock", "process_start"]


def process_start() -> float:
    """When this process started, on :func:`time.monotonic`'s clock (Linux: from ``/proc``; else now)."""
    try:
        with open("/proc/self/stat") as fh:
            fields = fh.read().rpartition(")")[2].split()
        started_ticks = int(fields[19])  # field 22 of stat(5): start time, clock ticks after boot
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
        age = uptime - started_ticks / os.sysconf("SC_CLK_TCK")
        return time.monotonic() - max(0.0, age)
    except (OSError, ValueError, IndexError):
        return time.monotonic()


class StartupClock:
    """Marks of a run's start, in seconds since ``origin`` (the pytest process's start).

    >>> clock = StartupClock(origin=100.0)
    >>> clock.mark("workers_up", 101.5); clock.mark("workers_up", 102.0)  # the last worker counts
    >>> clock.first("first_episode_started", 104.0); clock.first("first_episode_started", 109.0)
    >>> clock.to_dict(launches=[("bridge for 'CartPole-v1'", 101.0, 103.25)])["first_episode_started_s"]
    4.0
    >>> clock.line(launches=[("bridge for 'CartPole-v1'", 101.0, 103.25)])
    "workers up 2.0 s · bridge for 'CartPole-v1' 1.0→3.2 s · first episode 4.0 s"
    """

    ORDER = (("workers_up", "workers up"), ("collected", "collected"),
             ("first_episode_started", "first episode"), ("first_result", "first result"))

    def __init__(self, origin: float | None = None) -> None:
        self.origin = process_start() if origin is None else origin
        self.marks: dict[str, float] = {}

    def mark(self, name: str, at: float | None = None) -> None:
        """``name`` happened (again) at ``at``: the latest time counts (e.g. the last worker up)."""
        self.marks[name] = time.monotonic() if at is None else at

    def first(self, name: str, at: float | None = None) -> None:
        """``name`` happened at ``at`` unless it already had: the first time counts."""
        self.marks.setdefault(name, time.monotonic() if at is None else at)

    def to_dict(self, launches: list[tuple[str, float, float]] = ()) -> dict[str, Any]:
        """The marks and every service's ``[started, ready]`` (seconds since the process started)."""
        out: dict[str, Any] = {f"{name}_s": round(self.marks[name] - self.origin, 3)
                               for name, _ in self.ORDER if name in self.marks}
        if launches:
            out["services"] = [{"what": what, "started_s": round(a - self.origin, 3),
                                "ready_s": round(b - self.origin, 3)} for what, a, b in launches]
        return out

    def line(self, launches: list[tuple[str, float, float]] = ()) -> str:
        """One summary line: the marks in order, each service as ``started→ready``."""
        parts = [f"{label} {self.marks[name] - self.origin:.1f} s"
                 for name, label in self.ORDER[:2] if name in self.marks]
        parts += [f"{what} {a - self.origin:.1f}→{b - self.origin:.1f} s" for what, a, b in launches]
        parts += [f"{label} {self.marks[name] - self.origin:.1f} s"
                  for name, label in self.ORDER[2:] if name in self.marks]
        return " · ".join(parts)
