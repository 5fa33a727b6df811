"""The sensitivity table in every format: terminal lines, a markdown section, an HTML section.

    sensitivity_lines(tables) gives, per axis,

    robustness: perturbation (reference none; pooled over 2 tasks; one-sided exact tests, Holm over 3 levels, alpha 0.05)
    level                n  err  succ    rate         95% CI     diff  test       p   p(Holm)
    ---------------------------------------------------------------------------------------------
    none                20    0    20  100.0%  [83.9, 100.0]        -  ref
    obs_noise_0.05      20    0     6   30.0%   [14.5, 51.9]   -70.0  paired   6.1e-05  0.00018  WORSE

Pure formatting of :class:`~pytest_hud.core.sensitivity.SensitivityTable`: no pytest, no I/O. Rates
and intervals use the per-task table's helpers (:mod:`pytest_hud.report.table`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from html import escape
from typing import Any

from pytest_hud.core.sensitivity import LevelRow, SensitivityTable
from pytest_hud.report.table import format_interval, format_rate

__all__ = ["sensitivity_html", "sensitivity_lines", "sensitivity_markdown"]

_COLUMNS = (("n", 5), ("err", 4), ("succ", 5), ("rate", 7), ("95% CI", 14), ("diff", 7), ("test", 10), ("p", 8),
            ("p(Holm)", 8))


def _p(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.2g}"


def _diff(value: float | None) -> str:
    return "-" if value is None else f"{round(100.0 * value, 1) + 0.0:+.1f}"  # + 0.0: never "-0.0"


def _test(row: LevelRow) -> str:
    if row.is_reference:
        return "ref"
    return {"paired-mcnemar": "paired", "unpaired-boschloo": "unpaired", "unpaired-stratified": "stratified",
            "paired-signed-rank": "paired", "unpaired-rank-sum": "unpaired",
            "unpaired-stratified-rank-sum": "stratified"}.get(row.test or "", "-")


def _columns(table: SensitivityTable) -> tuple[tuple[str, int], ...]:
    """The text columns: a table on the score metric has the levels' mean score after the rate's interval."""
    return _COLUMNS if table.metric != "score" else _COLUMNS[:5] + (("score", 6),) + _COLUMNS[5:]


def _cells(row: LevelRow, table: SensitivityTable) -> tuple[str, ...]:
    cells = (str(row.n), str(row.errors), str(row.successes), format_rate(row.rate),
             format_interval(row.ci_low, row.ci_high, row.n), _diff(row.difference), _test(row), _p(row.p_value),
             _p(row.adjusted_p))
    if table.metric != "score":
        return cells
    return cells[:5] + ("-" if row.mean_score is None else f"{row.mean_score:.3f}",) + cells[5:]


def _flag(table: SensitivityTable, row: LevelRow) -> str:
    """``WORSE``, ``LOW COVERAGE`` (a level, or a reference, under the coverage rule) or nothing."""
    if row.significantly_worse:
        return "WORSE (exploratory)" if table.exploratory else "WORSE"
    return "LOW COVERAGE" if row.low_coverage or row.status(table.reference_low) == "low coverage" else ""


def verdict_lines(table: SensitivityTable) -> list[str]:
    """What the table says, in words: the problem, the worse levels, the levels not judged."""
    if table.problem:
        return [table.problem]
    out = []
    if table.worse:
        out.append(f"{table.axis}: significantly worse than {table.reference}: " + ", ".join(table.worse)
                   + (f" (exploratory, in {table.scope} alone: not corrected across tasks)" if table.exploratory else ""))
    low = [r for r in table.rows if r.low_coverage]
    if low:
        shown = ", ".join(f"{r.level} ({r.n}/{r.n + r.errors} graded)" for r in low)
        judged = ("so no level is called not worse" if table.reference_low
                  else "not judged: never called not worse")
        out.append(f"{table.axis}: under the {table.min_coverage:.0%} coverage rule (errors are dropped from "
                   f"the test, which hides an error that replaced a failure): {shown}; {judged}")
    judged = [r for r in table.rows if r.status(table.reference_low) == "not worse"]
    if not table.worse and judged:
        other = " other" if low else ""
        out.append(f"{table.axis}: no{other} level significantly worse than {table.reference}")
    return out


def heading(table: SensitivityTable) -> str:
    """What the table is: the axis, its reference, its scope and the test family."""
    tested = sum(1 for r in table.rows if r.p_value is not None)
    levels = f"{tested} level{'s' if tested != 1 else ''}"
    tests = ("the score: one-sided exact rank tests, diff in score points" if table.metric == "score"
             else "one-sided exact tests")
    if table.exploratory:
        return (f"{table.axis} (reference {table.reference}; {table.scope}; exploratory: {tests}, "
                f"Holm over this task's {levels} only, alpha {table.alpha:g}; the pooled table is the verdict)")
    tasks = f"{len(table.tasks)} task{'s' if len(table.tasks) != 1 else ''}"
    return (f"{table.axis} (reference {table.reference}; pooled over {tasks}; one-sided exact tests, "
            f"Holm over {levels}, alpha {table.alpha:g})").replace("one-sided exact tests", tests)


def sensitivity_lines(tables: Iterable[SensitivityTable], width: int = 110) -> list[str]:
    """Each table as plain text: a heading, the column header, a rule, one row per level, the verdict."""
    lines: list[str] = []
    for table in tables:
        level_w = max([len("level")] + [len(r.level) for r in table.rows])
        columns = _columns(table)
        level_w = min(level_w, max(12, width - sum(w + 1 for _, w in columns) - 7))
        head = f"{'level':<{level_w}}" + "".join(f" {h:>{w}}" for h, w in columns)
        lines += [f"robustness: {heading(table)}", head, "-" * len(head)]
        for row in table.rows:
            label = row.level if len(row.level) <= level_w else "…" + row.level[-(level_w - 1):]
            text = f"{label:<{level_w}}" + "".join(f" {c:>{w}}" for c, (_, w) in zip(_cells(row, table), columns, strict=True))
            lines.append((text + "  " + _flag(table, row)).rstrip())
        lines += [f"robustness: {line}" for line in verdict_lines(table)]
    return lines


def _md(value: Any) -> str:
    return escape(" ".join(str(value).split())).replace("|", "\\|").replace("`", "\\`")


def sensitivity_markdown(tables: Iterable[SensitivityTable]) -> str:
    """The tables as markdown sections (GitHub-flavoured), ``""`` when there are none."""
    out: list[str] = []
    for table in tables:
        score = table.metric == "score"
        out += [f"#### Robustness: {_md(heading(table))}", "",
                "| Level | n | Errors | Successes | Rate | 95% CI |" + (" Mean score |" if score else "")
                + " Diff (pts) | Test | p | p (Holm) | |",
                "|:--|--:|--:|--:|--:|:--:|" + ("--:|" if score else "") + "--:|:--|--:|--:|:--|"]
        for row in table.rows:
            c = _cells(row, table)
            flag = {"WORSE": "❌ worse", "WORSE (exploratory)": "❔ worse (exploratory)",
                    "LOW COVERAGE": "⚠️ low coverage", "": ""}[_flag(table, row)]
            out.append(f"| `{_md(row.level)}` | " + " | ".join(c) + f" | {flag} |")
        out += [""] + [f"{'⚠️ ' if table.problem or 'coverage rule' in line else ''}{_md(line)}"
                       for line in verdict_lines(table)]
        out.append("")
    return "\n".join(out)


def sensitivity_html(tables: Iterable[SensitivityTable]) -> str:
    """The tables as a ``<div class="hud-sensitivity">`` (inside the summary section), ``""`` without any."""
    parts: list[str] = []
    for table in tables:
        heads = ["Level", "n", "Errors", "Successes", "Rate", "95% CI"] + (
            ["Mean score"] if table.metric == "score" else []) + ["Diff (pts)", "Test", "p", "p (Holm)", ""]
        parts.append(f"<h3>Robustness: {escape(heading(table))}</h3>")
        parts.append('<table class="hud-table hud-sensitivity-table"><thead><tr>'
                     + "".join(f'<th class="hud-task">{h}</th>' if h == "Level" else f"<th>{h}</th>" for h in heads)
                     + "</tr></thead><tbody>")
        for row in table.rows:
            flag = {"WORSE": '<td style="color:#c62828;font-weight:bold">worse</td>',
                    "WORSE (exploratory)": '<td style="color:#c62828">worse (exploratory)</td>',
                    "LOW COVERAGE": '<td style="color:#b26a00;font-weight:bold">low coverage</td>',
                    "": "<td></td>"}[_flag(table, row)]
            parts.append(f'<tr data-level="{escape(row.level)}"><td class="hud-task">{escape(row.level)}</td>'
                         + "".join(f"<td>{escape(c)}</td>" for c in _cells(row, table)) + flag + "</tr>")
        parts.append("</tbody></table>")
        parts += [f'<p class="hud-note">{escape(line)}</p>' for line in verdict_lines(table)]
    return f'<div class="hud-sensitivity">{"".join(parts)}</div>' if parts else ""
