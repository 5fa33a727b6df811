"""An inline SVG bar chart of success rate per task, with 95% Wilson interval whiskers.

    svg = success_rate_chart(results.tasks(), verdicts)   # a "<svg ...>...</svg>" string

One horizontal bar per task on a 0-100% axis; a whisker spans the task's Wilson interval (the one
the tables show); when gate verdicts are given the bars take the verdict's colour, a tick marks the
baseline's rate, and a legend names the colours. Hovering a row shows its full task id and numbers
(an SVG ``<title>``).

The chart is plain SVG markup: no JavaScript, no fonts or stylesheets fetched from anywhere, no
element ids (so several charts can sit on one page). All text is escaped, so task ids with ``<`` or
``&`` in their parameters cannot break the page. It works inlined in HTML (pytest-html's summary,
the standalone page) and saved as a ``.svg`` file.
"""

from __future__ import annotations

from collections.abc import Mapping
from html import escape
from typing import Any

from pytest_hud.core.results import TaskSummary
from pytest_hud.report.table import format_interval, format_rate, short_task, verdict_dict

__all__ = ["DEFAULT_COLOUR", "VERDICT_COLOURS", "success_rate_chart"]

#: Bar colour per gate verdict; chosen to stay distinguishable for the common colour-vision deficiencies
#: (the verdict is also in the hover text and the tables, so colour is never the only carrier).
VERDICT_COLOURS: dict[str, str] = {
    "pass": "#1b7f3b",
    "regression": "#c62828",
    "inconclusive": "#e08a00",
    "insufficient coverage": "#6d6d6d",
    "incomparable": "#4a4a4a",
}
#: Bar colour without a gate.
DEFAULT_COLOUR = "#3a6ea5"
_UNKNOWN_VERDICT_COLOUR = "#8e44ad"

_FONT = 'font-family="Helvetica, Arial, sans-serif"'
_CHAR_W = 6.6  # average advance of a 12px sans-serif character, to size the label column


def _attr(text: Any) -> str:
    return escape(str(text), quote=True)


def _num(x: float) -> str:
    return f"{x:.1f}"


def success_rate_chart(
    tasks: Mapping[str, TaskSummary],
    verdicts: Mapping[str, Any] | None = None,
    *,
    width: int = 720,
    title: str = "Success rate per task (95% Wilson interval)",
) -> str:
    """Render the chart as an SVG string ``width`` pixels wide (the height follows the task count).

    ``verdicts`` maps task id to a gate verdict (``Verdict``, its ``to_dict()``, or a verdict string);
    tasks without one keep the neutral colour.
    """
    verdicts = verdicts or {}
    names = list(tasks)
    row_h, bar_h = 26, 16
    top = 34
    legend_h = 22 if verdicts else 0
    axis_h = 30
    height = top + max(1, len(names)) * row_h + axis_h + legend_h

    # Label column: as wide as the longest label needs, but never more than 40% of the chart.
    longest = max((len(t) for t in names), default=8)
    label_w = int(min(width * 0.4, max(80.0, longest * _CHAR_W + 12)))
    label_chars = max(8, int((label_w - 12) / _CHAR_W))
    value_w = 118  # room right of the plot for "100.0%  n=1000"
    x0, x1 = label_w, width - value_w
    span = x1 - x0

    def x(rate: float) -> float:
        return x0 + span * min(1.0, max(0.0, rate))

    out: list[str] = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="hud-chart" role="img" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'aria-label="{_attr(title)}" {_FONT} font-size="12">',
        f"<title>{escape(title)}</title>",
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        f'<text x="{x0}" y="20" font-size="13" font-weight="bold" fill="#222">{escape(title)}</text>',
    ]

    # Grid and axis first, so that bars and whiskers draw over them.
    plot_bottom = top + max(1, len(names)) * row_h
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        gx = _num(x(tick))
        out.append(f'<line x1="{gx}" y1="{top - 4}" x2="{gx}" y2="{plot_bottom}" '
                   f'stroke="{"#999" if tick in (0.0, 1.0) else "#e3e3e3"}" stroke-width="1"/>')
        out.append(f'<text x="{gx}" y="{plot_bottom + 16}" text-anchor="middle" fill="#555">'
                   f"{int(tick * 100)}%</text>")
    out.append(f'<line x1="{x0}" y1="{plot_bottom}" x2="{x1}" y2="{plot_bottom}" stroke="#999" '
               'stroke-width="1"/>')

    if not names:
        out.append(f'<text x="{_num(x(0.5))}" y="{top + row_h / 2 + 4}" text-anchor="middle" '
                   f'fill="#777">no tasks</text>')

    used_verdicts: list[str] = []
    for i, task in enumerate(names):
        s = tasks[task]
        v = verdict_dict(verdicts.get(task))
        kind = str(v["verdict"]) if v and v.get("verdict") else None
        colour = DEFAULT_COLOUR if kind is None else VERDICT_COLOURS.get(kind, _UNKNOWN_VERDICT_COLOUR)
        if kind is not None and kind not in used_verdicts:
            used_verdicts.append(kind)
        cy = top + i * row_h + row_h / 2
        hover = (f"{task}\n{format_rate(s.success_rate)} {format_interval(s.ci_low, s.ci_high, s.n)} "
                 f"({s.successes}/{s.n} successes, {s.errors} errors)")
        if kind is not None:
            hover += f"\ngate: {kind}"
            if v and v.get("reason"):
                hover += f" - {v['reason']}"
        out.append(f'<g class="hud-chart-row" data-task="{_attr(task)}"'
                   + (f' data-verdict="{_attr(kind)}"' if kind else "") + ">")
        out.append(f"<title>{escape(hover)}</title>")
        if i % 2:  # zebra rows help the eye from a long label to its bar
            out.append(f'<rect x="0" y="{_num(cy - row_h / 2)}" width="{width}" height="{row_h}" '
                       f'fill="#f6f6f6"/>')
        out.append(f'<text x="{x0 - 8}" y="{_num(cy + 4)}" text-anchor="end" fill="#222">'
                   f"{escape(short_task(task, label_chars))}</text>")
        if s.n and s.success_rate is not None:
            out.append(f'<rect class="hud-bar" x="{x0}" y="{_num(cy - bar_h / 2)}" '
                       f'width="{_num(x(s.success_rate) - x0)}" height="{bar_h}" fill="{colour}" '
                       f'fill-opacity="0.85"/>')
            lo, hi = _num(x(s.ci_low)), _num(x(s.ci_high))
            cap = bar_h / 2 - 2
            out.append(f'<g class="hud-whisker" stroke="#222" stroke-width="1.5">'
                       f'<line x1="{lo}" y1="{_num(cy)}" x2="{hi}" y2="{_num(cy)}"/>'
                       f'<line x1="{lo}" y1="{_num(cy - cap)}" x2="{lo}" y2="{_num(cy + cap)}"/>'
                       f'<line x1="{hi}" y1="{_num(cy - cap)}" x2="{hi}" y2="{_num(cy + cap)}"/></g>')
            value = f"{format_rate(s.success_rate)}  n={s.n}"
        else:
            out.append(f'<text x="{x0 + 6}" y="{_num(cy + 4)}" fill="#777" font-style="italic">'
                       f"no graded episodes</text>")
            value = f"-  n={s.n}"
        base = v.get("baseline_rate") if v else None
        if isinstance(base, (int, float)) and 0.0 <= base <= 1.0:
            # The baseline's rate as a dashed tick: the drop is visible without reading numbers.
            bx = _num(x(float(base)))
            out.append(f'<line class="hud-baseline" x1="{bx}" y1="{_num(cy - row_h / 2 + 2)}" x2="{bx}" '
                       f'y2="{_num(cy + row_h / 2 - 2)}" stroke="#111" stroke-width="2" '
                       f'stroke-dasharray="3,2"/>')
        out.append(f'<text x="{x1 + 8}" y="{_num(cy + 4)}" fill="#222">{escape(value)}</text>')
        out.append("</g>")

    if used_verdicts:
        ly = plot_bottom + axis_h + 8
        lx = float(x0)
        for kind in used_verdicts:
            colour = VERDICT_COLOURS.get(kind, _UNKNOWN_VERDICT_COLOUR)
            out.append(f'<rect x="{_num(lx)}" y="{ly - 9}" width="10" height="10" fill="{colour}"/>')
            out.append(f'<text x="{_num(lx + 14)}" y="{ly}" fill="#333">{escape(kind)}</text>')
            lx += 14 + len(kind) * _CHAR_W + 18
        if any(isinstance((verdict_dict(verdicts.get(t)) or {}).get("baseline_rate"), (int, float))
               for t in names):
            out.append(f'<line x1="{_num(lx)}" y1="{ly - 10}" x2="{_num(lx)}" y2="{ly + 1}" stroke="#111" '
                       f'stroke-width="2" stroke-dasharray="3,2"/>')
            out.append(f'<text x="{_num(lx + 6)}" y="{ly}" fill="#333">baseline rate</text>')
    out.append("</svg>")
    return "\n".join(out)
