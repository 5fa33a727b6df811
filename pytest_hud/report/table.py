"""The plain-text per-task table the terminal summary prints, and the cell formatting every report shares.

    summary_lines(results.tasks(), width=100) gives

    task                                         n  succ    rate        95% CI  err  mean ret    ep/h
    -------------------------------------------------------------------------------------------------
    evals/sim/test_cartpole.py::test_balance    50    40   80.0%  [67.0, 88.8]    0     474.5    1800

Pure formatting: no pytest, no I/O. The markdown, SVG and HTML reports use the same helpers
(:func:`short_task`, :func:`format_rate`, :func:`format_interval`, :func:`verdict_dict`) so that a
number reads the same wherever it is shown.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pytest_hud.core.results import TaskSummary

__all__ = [
    "gate_lines",
    "format_interval",
    "format_number",
    "format_rate",
    "gate_verdicts",
    "short_task",
    "summary_lines",
    "verdict_cell",
    "verdict_dict",
]

_ELLIPSIS = "…"


# --------------------------------------------------------------------------------------------------
# cell formatting shared by every report
# --------------------------------------------------------------------------------------------------


def short_task(task: str, width: int) -> str:
    """Shorten a task id to at most ``width`` characters, dropping the least telling parts first.

    Task ids are pytest node ids (``evals/sim/test_cartpole.py::test_balance[policy-a]``). The
    directories go first, then the start of the file name; the test function and its parameters, which
    tell tasks apart, are kept as long as possible.

        >>> short_task("evals/sim/test_cartpole.py::test_balance", 30)
        'test_cartpole.py::test_balance'
        >>> short_task("evals/sim/test_cartpole.py::test_balance", 20)
        '…le.py::test_balance'
    """
    width = max(1, int(width))
    if len(task) <= width:
        return task
    path, sep, rest = task.partition("::")
    if sep:
        base = path.rsplit("/", 1)[-1]
        if len(base) + len(sep) + len(rest) <= width:
            return base + sep + rest
        keep = width - 1 - len(sep) - len(rest)
        if keep >= 3:  # a few characters of the file still say which module this is
            return _ELLIPSIS + base[-keep:] + sep + rest
    return _ELLIPSIS + task[-(width - 1):] if width > 1 else _ELLIPSIS


def format_rate(rate: float | None, digits: int = 1) -> str:
    """A success rate in percent (``"82.0%"``), or ``"-"`` when there is none (no graded episodes)."""
    if rate is None or not math.isfinite(rate):
        return "-"
    return f"{100.0 * rate:.{digits}f}%"


def format_interval(low: float | None, high: float | None, n: int = 1, digits: int = 1) -> str:
    """A Wilson interval in percent points (``"[69.2, 90.2]"``); ``"-"`` when ``n == 0``.

    With no graded episodes the interval is the whole [0, 100] and says nothing, so it is not shown.
    """
    if not n or low is None or high is None:
        return "-"
    return f"[{100.0 * low:.{digits}f}, {100.0 * high:.{digits}f}]"


def format_number(value: float | None, digits: int = 1) -> str:
    """A plain number for returns and throughput; ``"-"`` for missing or non-finite values.

    Large magnitudes switch to 4 significant digits so the column stays narrow.
    """
    if value is None or not math.isfinite(value):
        return "-"
    if abs(value) >= 1e6:
        return f"{value:.4g}"
    return f"{value:.{digits}f}"


def verdict_dict(verdict: Any) -> dict[str, Any] | None:
    """Normalise a gate verdict to a dict: a ``Verdict`` (``to_dict()``), a dict, or a bare string.

    The reports accept all three because the verdicts reach them from different places: live
    ``Verdict`` objects in the plugin, dicts read back from a results file, strings in quick scripts.
    """
    if verdict is None:
        return None
    if isinstance(verdict, Mapping):
        return dict(verdict)
    to_dict = getattr(verdict, "to_dict", None)
    if callable(to_dict):
        return dict(to_dict())
    return {"verdict": str(verdict)}


def gate_verdicts(gate: Any) -> dict[str, dict[str, Any]]:
    """Verdicts keyed by task from what a results file's summary holds under ``"gate"``.

    Accepts a list of verdicts, ``{"verdicts": [...]}``, or a mapping task → verdict.
    """
    if not gate:
        return {}
    if isinstance(gate, Mapping) and "verdicts" in gate:
        gate = gate["verdicts"]
    def usable(v: Any) -> bool:  # skip flags such as {"passed": true} next to the verdicts
        return isinstance(v, (Mapping, str)) or callable(getattr(v, "to_dict", None))

    if isinstance(gate, Mapping):
        items = [(str(task), verdict_dict(v)) for task, v in gate.items() if usable(v)]
    elif isinstance(gate, (list, tuple)):
        items = [(str((verdict_dict(v) or {}).get("task")), verdict_dict(v)) for v in gate if usable(v)]
    else:
        return {}
    return {task: v for task, v in items if v and v.get("verdict")}


def verdict_cell(verdict: Any) -> str:
    """A short verdict for a table cell: the verdict, plus the number that backs it.

        >>> verdict_cell({"verdict": "regression", "adjusted_p": 0.0031})
        'regression (p=0.0031)'
        >>> verdict_cell({"verdict": "inconclusive", "more_episodes_needed": 40})
        'inconclusive (+40 ep)'
    """
    v = verdict_dict(verdict)
    if not v or not v.get("verdict"):
        return "-"
    word = str(v["verdict"])
    p = v.get("adjusted_p", v.get("p_value"))
    if word == "regression" and isinstance(p, (int, float)) and math.isfinite(p):
        return f"{word} (p={p:.2g})"
    more = v.get("more_episodes_needed")
    if word == "inconclusive" and isinstance(more, int) and more > 0:
        return f"{word} (+{more} ep)"
    return word


# --------------------------------------------------------------------------------------------------
# the terminal table
# --------------------------------------------------------------------------------------------------

# (header, width) of the fixed numeric columns, right-aligned.
_NUMERIC = (("n", 5), ("succ", 5), ("rate", 7), ("95% CI", 13), ("err", 4), ("mean ret", 9), ("ep/h", 7))
_MIN_TASK = 12


def gate_lines(verdicts: list[Any], *, strict: bool = False, reasons: bool = True) -> list[tuple[str, bool]]:
    """The gate's lines for people, as ``(text, fails)``: every verdict other than pass with its
    reason, the policies compared, and why nothing was compared. The terminal summary and
    ``python -m pytest_hud report --compare`` print the same lines (``reasons=False``: all but the
    verdicts' own, for a report that lists every verdict itself)."""
    from pytest_hud.gate import gate_passed, nothing_compared

    lines: list[tuple[str, bool]] = []
    shown = [v for v in verdicts if reasons and v.verdict != "pass"]
    # Many tasks that pass the gate without a baseline for one reason (a robustness suite's levels,
    # a suite with no floor) are one line, by test function, not a screenful.
    quiet: dict[str, list[Any]] = {}
    for v in shown:
        if v.verdict == "no baseline" and not strict:  # (strict: each fails the gate, so each is named)
            quiet.setdefault(v.reason, []).append(v)
    for v in shown:
        group = quiet.get(v.reason, ()) if v.verdict == "no baseline" else ()
        if len(group) > 3 and any(v is g for g in group):
            if v is group[0]:
                lines.append((f"gate: NO BASELINE for {len(group)} tasks ({v.reason}): {_by_function(group)}", False))
            continue
        lines.append((f"gate: {v.verdict.upper()} {v.task}: {v.reason}", not gate_passed([v], strict=strict)))
    pairs = sorted({(v.policy, v.baseline_policy) for v in verdicts if v.baseline_policy},
                   key=lambda pair: (str(pair[0]), str(pair[1])))
    if len(pairs) == 1:
        ours, theirs = pairs[0]
        if ours != theirs:
            lines.append((f"gate: policy {ours or '(unknown)'} against the baseline's {theirs or '(unknown)'}", False))
        else:
            lines.append((f"gate: policy {ours} on both sides", False))
    elif pairs:
        for v in verdicts:
            if v.baseline_policy and v.policy != v.baseline_policy:
                lines.append((f"gate: {v.task}: policy {v.policy or '(none)'} against the baseline's"
                              f" {v.baseline_policy or '(none)'}", False))
    nothing = nothing_compared(verdicts)
    if nothing:
        lines.append((f"gate: {nothing}", True))
    return lines


def _by_function(verdicts: list[Any]) -> str:
    """``a.py::test_x (14 tasks), b.py::test_y``: the tasks' test functions, in order of appearance."""
    counts: dict[str, int] = {}
    for v in verdicts:
        function = v.task.split("[", 1)[0]
        counts[function] = counts.get(function, 0) + 1
    return ", ".join(f"{f} ({n} tasks)" if n > 1 else f for f, n in counts.items())


def sim_success_notes(tasks: Mapping[str, TaskSummary]) -> list[str]:
    """One warning per task whose tests passed although the sim graded no success.

    The summary and the gate count the test's outcome; a test that asserts nothing passes whatever
    the sim said. Each episode's record keeps the sim's own success (``sim_success``) beside it.

        >>> s = TaskSummary("t.py::test_push", 16, 16, 0, 0, 16, 1.0, 0.8, 1.0, None, None, None,
        ...                 sim_checked=16, sim_successes=0)
        >>> sim_success_notes({s.task: s})[0]
        't.py::test_push: 16 passed, the sim reported success in 0 of 16: does the test assert `result.success`?'
    """
    return [f"{task}: {s.sim_checked} passed, the sim reported success in {s.sim_successes} of {s.sim_checked}:"
            " does the test assert `result.success`?"
            for task, s in tasks.items() if getattr(s, "sim_successes", 0) < getattr(s, "sim_checked", 0)]


def _labels(tasks: list[str], width: int) -> list[str]:
    """Shortened labels; if shortening made two tasks look alike, fall back to plain tails."""
    labels = [short_task(t, width) for t in tasks]
    if len(set(labels)) < len(set(tasks)):
        labels = [t if len(t) <= width else _ELLIPSIS + t[-(width - 1):] for t in tasks]
    return labels


def summary_lines(
    tasks: Mapping[str, TaskSummary],
    verdicts: Mapping[str, Any] | None = None,
    width: int = 110,
) -> list[str]:
    """The per-task table as lines of at most ``width`` characters (a header, a rule, one row per task).

    Columns: task, n (graded episodes), succ, rate, 95% CI (Wilson, in percent), err (errored
    episodes, not counted in n), mean ret, ep/h; plus the gate verdict when ``verdicts`` is given
    (keyed by task; ``Verdict`` objects, dicts or strings). Long task ids are shortened with
    :func:`short_task` so that the numbers always fit.
    """
    names = list(tasks)
    verdict_cells = [verdict_cell((verdicts or {}).get(t)) for t in names] if verdicts is not None else []
    verdict_w = max([len("verdict")] + [len(c) for c in verdict_cells]) if verdicts is not None else 0
    fixed = sum(w + 1 for _, w in _NUMERIC) + (verdict_w + 2 if verdicts is not None else 0)
    longest = max((len(t) for t in names), default=len("task"))
    task_w = max(_MIN_TASK, min(longest, width - fixed))
    labels = _labels(names, task_w)

    head = f"{'task':<{task_w}}" + "".join(f" {h:>{w}}" for h, w in _NUMERIC)
    if verdicts is not None:
        head += f"  {'verdict':<{verdict_w}}"
    lines = [head.rstrip(), "-" * len(head.rstrip())]
    for i, (task, label) in enumerate(zip(names, labels, strict=True)):
        s = tasks[task]
        cells = (
            str(s.n),
            str(s.successes),
            format_rate(s.success_rate),
            format_interval(s.ci_low, s.ci_high, s.n),
            str(s.errors),
            format_number(s.mean_return),
            format_number(s.episodes_per_hour, 0),
        )
        row = f"{label:<{task_w}}" + "".join(f" {c:>{w}}" for c, (_, w) in zip(cells, _NUMERIC, strict=True))
        if verdicts is not None:
            row += f"  {verdict_cells[i]:<{verdict_w}}"
        lines.append(row.rstrip())
    if not names:
        lines.append("(no tasks)")
    return lines
