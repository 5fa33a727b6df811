"""The live progress line: how far the run is, how fast it goes, and how each task does so far.

Pure (no pytest, no I/O). One line a person reads at a glance, with nothing that could pass for
progress but the progress itself: the episodes done *of* the declared total, the rate and the time
left come first; each task's running success follows as ``successes/graded`` with its 95% Wilson
interval, after the words "success so far"::

    hud progress: 221 of 10000 episodes done, 150/min, about 1h05m left | success so far:
    test_soak 219/221 = 99% [97-100%]; test_reach 3/10 = 30% [11-60%], 2 errors

(one line in the terminal). :func:`progress_record` is the same state as one results-file record,
``{"record": "progress", "line": ..., ...}``, for tools that tail the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_hud.core.results import TaskSummary

__all__ = ["Progress", "progress_record"]


@dataclass(frozen=True)
class Progress:
    """Where a run stands: ``done`` of ``total`` episodes after ``elapsed_s`` seconds of episodes.

    ``done`` counts every reported episode (graded, errored or skipped); ``ran`` those that ran
    here (not skipped, not reused from ``--hud-resume``): the rate is theirs over ``elapsed_s``,
    the time since the first of them started.
    """

    done: int
    total: int
    ran: int
    elapsed_s: float
    tasks: Mapping[str, TaskSummary]

    @property
    def per_min(self) -> float | None:
        """Episodes run per minute (None before one has finished)."""
        if self.ran <= 0 or self.elapsed_s <= 0:
            return None
        return self.ran * 60.0 / self.elapsed_s

    @property
    def eta_s(self) -> float | None:
        """Seconds left at the current rate (0 once every declared episode is done)."""
        left = max(0, self.total - self.done)
        if left == 0:
            return 0.0
        rate = self.per_min
        return None if not rate else left * 60.0 / rate

    def line(self) -> str:
        """The one line the terminal shows."""
        head = f"{self.done} of {self.total} episodes done" if self.total else f"{self.done} episodes done"
        rate = self.per_min
        head += ", rate -" if rate is None else f", {_rate(rate)}/min"
        eta = self.eta_s
        if self.total:
            head += ", time left -" if eta is None else f", about {_duration(eta)} left"
        return f"hud progress: {head} | success so far: " + _tasks_part(self.tasks)


def progress_record(progress: Progress) -> dict[str, Any]:
    """The progress as a results-file record (builtin types only)."""
    per_min = progress.per_min
    eta = progress.eta_s
    return {
        "record": "progress",
        "line": progress.line(),
        "done": progress.done,
        "total": progress.total,
        "per_min": None if per_min is None else round(per_min, 3),
        "eta_s": None if eta is None else round(eta, 1),
        "tasks": {task: {"graded": s.n, "successes": s.successes, "errors": s.errors, "skipped": s.skipped,
                         "declared": s.declared, "success_rate": s.success_rate,
                         "ci_low": s.ci_low, "ci_high": s.ci_high}
                  for task, s in progress.tasks.items()},
    }


#: tasks a line names at most; past that it names the lowest rates so far and counts the rest
SHOWN = 4


def _tasks_part(tasks: Mapping[str, TaskSummary]) -> str:
    """Each task's success so far; with more than :data:`SHOWN` tasks, the lowest rates so far (the
    ones to watch) and a count of the rest, so the line stays one line (the record keeps them all)."""
    if len(tasks) <= SHOWN:
        parts = [_task_part(task, s) for task, s in tasks.items()]
        return "; ".join(parts) if parts else "-"
    graded = sorted((s.success_rate, task) for task, s in tasks.items() if s.n and s.success_rate is not None)
    waiting = sum(1 for s in tasks.values() if not s.n)
    parts = [_task_part(task, tasks[task]) for _, task in graded[:SHOWN - 1]]
    rest = len(graded) - len(parts)
    if parts:
        parts[0] = "lowest " + parts[0]
    if rest:
        parts.append(f"{rest} more task{'s' if rest != 1 else ''} graded")
    if waiting:
        parts.append(f"{waiting} task{'s' if waiting != 1 else ''} none graded yet")
    return "; ".join(parts)


def _task_part(task: str, s: TaskSummary) -> str:
    name = task.rsplit("::", 1)[-1]
    if s.n == 0:
        text = f"{name} none graded yet"
    else:
        text = (f"{name} {s.successes}/{s.n} = {_pct(s.success_rate)} "
                f"[{_pct(s.ci_low, sign=False)}-{_pct(s.ci_high)}]")
    if s.errors:
        text += f", {s.errors} error{'s' if s.errors != 1 else ''}"
    return text


def _pct(x: float | None, sign: bool = True) -> str:
    if x is None:
        return "-"
    return f"{100 * x:.0f}" + ("%" if sign else "")


def _rate(per_min: float) -> str:
    return f"{per_min:.0f}" if per_min >= 10 else f"{per_min:.2g}"


def _duration(seconds: float) -> str:
    """``45s``, ``12m05s``, ``3h07m``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{(s % 3600) // 60:02d}m"
