"""Markdown summaries for pull-request comments and CI job pages (GitHub-flavoured tables).

    print(summary_markdown(results.tasks(), verdicts, coverage))             # one run
    print(comparison_markdown(current.tasks(), baseline.tasks(), verdicts))  # a run against its baseline

Pure formatting: no pytest, no I/O. Numbers are formatted by the same helpers as the terminal table
(:mod:`pytest_hud.report.table`), so a rate reads the same in the terminal, the HTML and the comment.
Task ids go in code spans with ``|`` escaped, and free text (gate reasons) is escaped, so ids with
table or HTML syntax in their parameters cannot break the table.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from pytest_hud.core.results import TaskSummary
from pytest_hud.report.table import format_interval, format_number, format_rate, sim_success_notes, verdict_dict

__all__ = ["VERDICT_BADGES", "comparison_markdown", "coverage_text", "md_code", "summary_markdown"]

#: How each verdict reads at a glance in a comment.
VERDICT_BADGES: dict[str, str] = {
    "pass": "✅ pass",
    "regression": "❌ regression",
    "inconclusive": "⚠️ inconclusive",
    "insufficient coverage": "⛔ insufficient coverage",
    "incomparable": "⛔ incomparable",
}

_MD_SPECIAL = re.compile(r"([\\`*_\[\]|#~])")


def _text(value: Any) -> str:
    """Free text for a table cell or a list item: markdown and HTML syntax made literal."""
    text = " ".join(str(value).split())  # a newline would end the table row
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return _MD_SPECIAL.sub(r"\\\1", text)


def md_code(value: Any) -> str:
    """A code span that survives any backticks in ``value``; ``|`` escaped for table cells."""
    text = " ".join(str(value).split()).replace("|", "\\|")
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _badge(verdict: Any) -> str:
    v = verdict_dict(verdict)
    if not v or not v.get("verdict"):
        return "-"
    return VERDICT_BADGES.get(str(v["verdict"]), _text(v["verdict"]))


def _p(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def _points(drop: Any) -> str:
    """A drop (baseline - current) as a signed change in points: a drop of 0.12 reads ``-12.0 pts``."""
    if not isinstance(drop, (int, float)) or isinstance(drop, bool):
        return "-"
    change = -100.0 * drop
    return "0.0 pts" if abs(change) < 0.05 else f"{change:+.1f} pts"


def coverage_text(coverage: Mapping[str, Any] | None) -> str:
    """One line about how many declared episodes were reported, graded, errored and missing.

    Understands the plugin's coverage dict (``declared``, ``reported``, ``graded``, ``errors``,
    ``skipped``, ``missing``); other keys are listed as they are.
    """
    if not coverage:
        return ""
    known = ("declared", "reported", "graded", "errors", "skipped", "missing")
    parts: list[str] = []
    if "reported" in coverage and "declared" in coverage:
        parts.append(f"{coverage['reported']}/{coverage['declared']} declared episodes reported")
    for key in ("graded", "errors", "skipped"):
        if key in coverage:
            parts.append(f"{coverage[key]} {key}")
    missing = coverage.get("missing")
    if missing:
        shown = ", ".join(md_code(m) for m in list(missing)[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        parts.append(f"**missing {len(missing)}**: {shown}{more}")
    for key, value in coverage.items():
        if key not in known:
            parts.append(f"{_text(key)}: {_text(value)}")
    return "Coverage: " + ", ".join(parts)


def _details(verdicts: Mapping[str, Any], tasks: list[str]) -> list[str]:
    """A collapsed list of every verdict's reason, worst first, so the table stays short."""
    order = {"incomparable": 0, "insufficient coverage": 0, "regression": 1, "inconclusive": 2, "pass": 3}
    items = []
    for task in tasks:
        v = verdict_dict(verdicts.get(task))
        if v and v.get("reason"):
            items.append((order.get(str(v.get("verdict")), 4), task, v))
    if not items:
        return []
    lines = ["", "<details><summary>Gate details</summary>", ""]
    for _, task, v in sorted(items, key=lambda item: item[0]):
        lines.append(f"- {md_code(task)}: **{_text(v.get('verdict'))}**: {_text(v['reason'])}")
    lines += ["", "</details>"]
    return lines


def summary_markdown(
    tasks: Mapping[str, TaskSummary],
    verdicts: Mapping[str, Any] | None = None,
    coverage: Mapping[str, Any] | None = None,
    title: str = "pytest-hud results",
    sensitivity: list[Any] | None = None,
) -> str:
    """One run as a markdown section: a title, the per-task table, coverage, the sensitivity tables
    (:mod:`pytest_hud.report.sensitivity`, when ``sensitivity`` has any), and the gate's reasons.

    Columns: task, n, successes, rate, 95% CI (Wilson, percent), errors, mean return, and verdict
    when ``verdicts`` is given (``-`` for a task the gate did not judge).
    """
    gated = bool(verdicts)
    verdicts = verdicts or {}
    lines = [f"### {_text(title)}", ""] if title else []
    lines += [
        "| Task | n | Successes | Rate | 95% CI | Errors | Mean return |" + (" Verdict |" if gated else ""),
        "|:-----|--:|--:|--:|:--:|--:|--:|" + (":--|" if gated else ""),
    ]
    for task, s in tasks.items():
        lines.append(
            f"| {md_code(task)} | {s.n} | {s.successes} | {format_rate(s.success_rate)} "
            f"| {format_interval(s.ci_low, s.ci_high, s.n)} | {s.errors} | {format_number(s.mean_return)} |"
            + (f" {_badge(verdicts.get(task))} |" if gated else "")
        )
    if not tasks:
        lines.append("| *(no tasks)* | | | | | | |" + (" |" if gated else ""))
    cov = coverage_text(coverage)
    if cov:
        lines += ["", cov]
    lines += [f"\n⚠️ {_text(note)}" for note in sim_success_notes(tasks)]
    if sensitivity:
        from pytest_hud.report.sensitivity import sensitivity_markdown

        lines += ["", sensitivity_markdown(sensitivity).rstrip()]
    lines += _details(verdicts, list(tasks))
    return "\n".join(lines) + "\n"


def comparison_markdown(
    current: Mapping[str, TaskSummary],
    baseline: Mapping[str, TaskSummary],
    verdicts: Mapping[str, Any] | None = None,
    title: str = "pytest-hud: current vs baseline",
    current_label: str = "current",
    baseline_label: str = "baseline",
) -> str:
    """Two runs side by side, one row per task of either run, with the gate's verdict per task.

    Columns: task, baseline rate (n), current rate (n), change in points, the test's p-value
    (Holm-adjusted where the gate adjusted it), verdict. ``verdicts`` are the gate's (typically
    ``evaluate_gate`` on the two runs); without them the table still shows the rates.
    """
    verdicts = verdicts or {}
    lines = [f"### {_text(title)}", ""] if title else []
    lines += [
        f"| Task | {_text(baseline_label)} | {_text(current_label)} | Change | p (adj.) | Verdict |",
        "|:-----|--:|--:|--:|--:|:--|",
    ]
    names = list(current) + [t for t in baseline if t not in current]

    def cell(s: TaskSummary | None) -> str:
        if s is None:
            return "—"
        return f"{format_rate(s.success_rate)} (n={s.n})"

    for task in names:
        cur, base = current.get(task), baseline.get(task)
        v = verdict_dict(verdicts.get(task)) or {}
        drop = v.get("drop")
        if drop is None and cur is not None and base is not None and cur.n and base.n:
            drop = (base.success_rate or 0.0) - (cur.success_rate or 0.0)
        p = v.get("adjusted_p", v.get("p_value"))
        lines.append(f"| {md_code(task)} | {cell(base)} | {cell(cur)} | {_points(drop)} | {_p(p)} "
                     f"| {_badge(verdicts.get(task))} |")
    if not names:
        lines.append("| *(no tasks)* | | | | | |")
    if verdicts:
        counts: dict[str, int] = {}
        for task in names:
            kind = (verdict_dict(verdicts.get(task)) or {}).get("verdict")
            if kind:
                counts[str(kind)] = counts.get(str(kind), 0) + 1
        if counts:
            lines += ["", "Gate: " + ", ".join(f"{n} {_text(k)}" for k, n in counts.items())]
    lines += _details(verdicts, names)
    return "\n".join(lines) + "\n"
