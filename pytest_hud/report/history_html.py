"""The history page: one SVG chart per task (success across the runs, Wilson intervals as whiskers,
significant changes marked), the table of every run, and the best run's statement.

Plain HTML and inline SVG, nothing fetched and no JavaScript (as :mod:`pytest_hud.report.svg`);
all text escaped. Each chart's points carry ``data-run``/``data-rate`` attributes and a ``<title>``
(hover text), each marked change a ``data-change`` of ``up`` or ``down``.
"""

from __future__ import annotations

from html import escape

from pytest_hud.report.history import History, change_lines
from pytest_hud.report.svg import VERDICT_COLOURS

__all__ = ["history_page", "task_chart"]

_UP, _DOWN, _LINE = VERDICT_COLOURS["pass"], VERDICT_COLOURS["regression"], "#3a6ea5"
_FONT = 'font-family="Helvetica, Arial, sans-serif"'


def _a(text: object) -> str:
    return escape(str(text), quote=True)


def task_chart(history: History, task: str, width: int = 760) -> str:
    """One task's success across the runs as an SVG string."""
    runs = history.runs
    left, right, top, bottom = 48, 16, 28, 70
    height = 240
    plot_w, plot_h = width - left - right, height - top - bottom
    step = plot_w / max(1, len(runs) - 1) if len(runs) > 1 else 0

    def x(i: int) -> float:
        return left + (i * step if len(runs) > 1 else plot_w / 2)

    def y(rate: float) -> float:
        return top + (1.0 - rate) * plot_h

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="hud-history-chart" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" role="img" data-task="{_a(task)}">',
             f'<title>{_a(task)}: success per run (95% Wilson interval)</title>']
    for tick in (0, 25, 50, 75, 100):
        ty = y(tick / 100)
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{ty:.1f}" y2="{ty:.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{ty + 4:.1f}" text-anchor="end" font-size="11" {_FONT}>{tick}%</text>')
    present = [(i, history.points[(task, i)]) for i in range(len(runs))
               if (task, i) in history.points and history.points[(task, i)].n]
    if len(present) > 1:
        path = " ".join(f"{'M' if k == 0 else 'L'}{x(i):.1f},{y(p.rate):.1f}" for k, (i, p) in enumerate(present))
        parts.append(f'<path d="{path}" fill="none" stroke="{_LINE}" stroke-width="1.5"/>')
    marks = {(c.after, c.direction): c for c in history.significant() if c.task == task}
    for i, p in present:
        cx = x(i)
        parts.append(f'<line class="hud-whisker" x1="{cx:.1f}" x2="{cx:.1f}" y1="{y(p.high):.1f}" '
                     f'y2="{y(p.low):.1f}" stroke="#555" stroke-width="1.5"/>')
        tip = (f"{runs[i].label}: {p.successes}/{p.n} = {100 * p.rate:.1f}% "
               f"[{100 * p.low:.1f}%, {100 * p.high:.1f}%]" + (f", {p.errors} errors" if p.errors else ""))
        parts.append(f'<circle class="hud-point" cx="{cx:.1f}" cy="{y(p.rate):.1f}" r="4" fill="{_LINE}" '
                     f'data-run="{_a(runs[i].label)}" data-rate="{p.rate:.4f}"><title>{_a(tip)}</title></circle>')
        for direction, colour, dy, glyph in (("up", _UP, -12, "▲"), ("down", _DOWN, 16, "▼")):
            change = marks.get((i, direction))
            if change is not None:
                why = (f"{'rise' if direction == 'up' else 'drop'} from {runs[change.before].label}: "
                       f"{change.test}, p={change.p:.2g}, Holm-adjusted p={change.p_holm:.2g}")
                parts.append(f'<text class="hud-change" data-change="{direction}" x="{cx:.1f}" '
                             f'y="{y(p.rate) + dy:.1f}" text-anchor="middle" font-size="13" fill="{colour}" '
                             f'{_FONT}>{glyph}<title>{_a(why)}</title></text>')
    best = history.best
    for i, run in enumerate(runs):
        weight = ' font-weight="bold"' if i == best else ""
        parts.append(f'<text x="{x(i):.1f}" y="{height - bottom + 16}" font-size="11" {_FONT}{weight} '
                     f'text-anchor="end" transform="rotate(-30 {x(i):.1f} {height - bottom + 16})">'
                     f'{_a(run.label)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)


def history_page(history: History, title: str = "pytest-hud: success across runs") -> str:
    """The whole page (a string of HTML)."""
    runs = history.runs
    rows = []
    for i, run in enumerate(runs):
        d = run.details
        rows.append("<tr>" + "".join(f"<td>{_a(v)}</td>" for v in (
            i + 1, run.label + (" (best)" if i == history.best else ""), d.get("commit") or "-",
            d.get("policy_hash") or "-", d.get("parameter") or d.get("file") or "-")) + "</tr>")
    changes = change_lines(history)
    body = [
        f"<h1>{_a(title)}</h1>",
        f'<p class="hud-best">{_a(history.best_statement)}</p>' if history.best_statement else "",
        "<h2>Significant changes between consecutive runs</h2>",
        "<ul class=\"hud-changes\">" + "".join(f"<li>{_a(c)}</li>" for c in changes) + "</ul>" if changes else
        f"<p class=\"hud-changes\">None (Holm over {len(history.changes)} one-sided exact tests, alpha "
        f"{history.alpha:g}).</p>",
        "<h2>Success per task</h2>",
        *(f'<section class="hud-task"><h3>{_a(task)}</h3>{task_chart(history, task)}</section>'
          for task in history.tasks),
        "<h2>Runs</h2>",
        '<table class="hud-runs"><thead><tr><th>#</th><th>run</th><th>commit</th><th>policy hash</th>'
        "<th>source</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>",
    ]
    style = ("body{font-family:Helvetica,Arial,sans-serif;margin:24px;max-width:900px}"
             "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}"
             ".hud-best{background:#f3f7fb;padding:8px;border-left:4px solid #3a6ea5}")
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_a(title)}</title>'
            f"<style>{style}</style></head><body>\n" + "\n".join(b for b in body if b) + "\n</body></html>\n")
