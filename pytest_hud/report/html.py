"""HTML reports: the summary section (inside pytest-html's report) and a standalone page.

    html = summary_section_html(tasks, verdicts, coverage)    # a <section> for pytest-html's summary
    page = standalone_page(load_results("results.jsonl"))     # a whole page, videos by relative path
    write_standalone_page("report.html", results, self_contained=True)  # videos inlined as data: URIs

The summary section is the per-task table (n, successes, rate, 95% Wilson interval, errors, mean
return, episodes/hour, gate verdict), the success-rate chart (:mod:`pytest_hud.report.svg`) and
the gate's reasons. The standalone page (``--hud-html PATH``, for runs without pytest-html) adds
run provenance and every episode (task, episode, seed, outcome, success, score, steps, duration)
with the videos of failed and errored episodes embedded as ``<video controls>`` players; videos of
successful episodes (``--hud-video all``) sit in collapsed ``<details>``.

Videos are referenced by a path relative to the page's directory (``page_dir``, default the
current directory), so the page and the video directory can be copied or published together;
``self_contained=True`` inlines each MP4 as a ``data:video/mp4;base64,...`` URI instead, so the page
is one file (larger: base64 costs a third more than the MP4).

The markup is static: no JavaScript, nothing fetched from the network, styles inline and scoped to
``.hud-*`` classes so they do not leak into pytest-html's own page. Every piece of text from results
(task ids, errors, reasons) is escaped.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Iterable, Mapping
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pytest_hud.core.results import EpisodeRecord, Results, TaskSummary
from pytest_hud.report.svg import DEFAULT_COLOUR, VERDICT_COLOURS, success_rate_chart
from pytest_hud.report.table import (
    format_interval, format_number, format_rate, gate_verdicts, sim_success_notes, verdict_dict,
)

__all__ = [
    "episodes_table_html",
    "standalone_page",
    "summary_section_html",
    "video_src",
    "write_standalone_page",
]

_STYLE = """
.hud-summary, .hud-episodes { font-family: Helvetica, Arial, sans-serif; color: #222; margin: 12px 0; }
.hud-summary h2, .hud-episodes h2 { font-size: 18px; margin: 8px 0; }
.hud-summary h3 { font-size: 15px; margin: 10px 0 4px; }
table.hud-table { border-collapse: collapse; font-size: 13px; margin: 6px 0; }
table.hud-table th, table.hud-table td { border: 1px solid #ddd; padding: 3px 8px; text-align: right;
  white-space: nowrap; }
table.hud-table th { background: #f3f3f3; }
table.hud-table td.hud-task, table.hud-table th.hud-task { text-align: left; font-family: monospace;
  white-space: normal; overflow-wrap: anywhere; }
table.hud-table td.hud-verdict { text-align: left; font-weight: bold; }
table.hud-table tr.hud-failed td.hud-outcome { color: #c62828; font-weight: bold; }
table.hud-table tr.hud-error td.hud-outcome { color: #6d6d6d; font-weight: bold; }
table.hud-table tr.hud-passed td.hud-outcome { color: #1b7f3b; }
table.hud-table tr.hud-video-row td { text-align: left; background: #fafafa; }
.hud-videos { display: flex; flex-wrap: wrap; gap: 10px; }
.hud-videos figure { margin: 4px; }
.hud-videos video { width: 360px; max-width: 100%; max-height: 480px; background: #000; }
.hud-videos figcaption, .hud-note { font-size: 12px; color: #555; }
.hud-error-text { font-family: monospace; font-size: 12px; color: #6d6d6d; white-space: pre-wrap; }
.hud-figure { margin: 8px 0; overflow-x: auto; }
.hud-gate li { margin: 2px 0; font-size: 13px; }
.hud-meta { font-size: 13px; }
.hud-meta dt { font-weight: bold; float: left; clear: left; width: 9em; }
.hud-meta dd { margin-left: 10em; font-family: monospace; }
"""


def _e(value: Any) -> str:
    return escape(str(value), quote=True)


def _th(head: str) -> str:
    return f'<th class="hud-task">{head}</th>' if head == "Task" else f"<th>{head}</th>"


def _verdict_colour(kind: str | None) -> str:
    return VERDICT_COLOURS.get(kind or "", DEFAULT_COLOUR)


def _coverage_html(coverage: Mapping[str, Any] | None) -> str:
    if not coverage:
        return ""
    parts: list[str] = []
    if "reported" in coverage and "declared" in coverage:
        parts.append(f"{_e(coverage['reported'])}/{_e(coverage['declared'])} declared episodes reported")
    for key in ("graded", "errors", "skipped"):
        if key in coverage:
            parts.append(f"{_e(coverage[key])} {key}")
    for key, value in coverage.items():
        if key not in ("declared", "reported", "graded", "errors", "skipped", "missing"):
            parts.append(f"{_e(key)}: {_e(value)}")
    text = "Coverage: " + ", ".join(parts)
    missing = list(coverage.get("missing") or [])
    if missing:
        shown = ", ".join(f"<code>{_e(m)}</code>" for m in missing[:10])
        more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
        text += f'; <strong style="color:#c62828">missing {len(missing)}</strong>: {shown}{more}'
    return f'<p class="hud-coverage">{text}</p>'


def _tasks_table(tasks: Mapping[str, TaskSummary], verdicts: Mapping[str, Any] | None) -> str:
    heads = ["Task", "n", "Successes", "Rate", "95% CI", "Errors", "Mean return", "Episodes/h"]
    if verdicts is not None:
        heads.append("Verdict")
    rows = ['<table class="hud-table hud-tasks">', "<thead><tr>"
            + "".join(_th(h) for h in heads)
            + "</tr></thead>", "<tbody>"]
    for task, s in tasks.items():
        cells = [
            f'<td class="hud-task">{_e(task)}</td>',
            f"<td>{s.n}</td>",
            f"<td>{s.successes}</td>",
            f'<td class="hud-rate">{format_rate(s.success_rate)}</td>',
            f"<td>{format_interval(s.ci_low, s.ci_high, s.n)}</td>",
            f"<td>{s.errors}</td>",
            f"<td>{format_number(s.mean_return)}</td>",
            f"<td>{format_number(s.episodes_per_hour, 0)}</td>",
        ]
        if verdicts is not None:
            v = verdict_dict(verdicts.get(task))
            kind = str(v["verdict"]) if v and v.get("verdict") else None
            title = f' title="{_e(v["reason"])}"' if v and v.get("reason") else ""
            cells.append(f'<td class="hud-verdict" style="color:{_verdict_colour(kind)}"{title}>'
                         f"{_e(kind or '-')}</td>")
        rows.append(f'<tr data-task="{_e(task)}">' + "".join(cells) + "</tr>")
    if not tasks:
        rows.append(f'<tr><td class="hud-task" colspan="{len(heads)}">no tasks</td></tr>')
    rows.append("</tbody></table>")
    return "\n".join(rows)


def _gate_list(tasks: Iterable[str], verdicts: Mapping[str, Any]) -> str:
    order = {"incomparable": 0, "insufficient coverage": 0, "regression": 1, "inconclusive": 2, "pass": 3}
    items = []
    for task in tasks:
        v = verdict_dict(verdicts.get(task))
        if v and v.get("verdict"):
            items.append((order.get(str(v["verdict"]), 4), task, v))
    if not items:
        return ""
    out = ['<div class="hud-gate"><h3>Gate</h3><ul>']
    for _, task, v in sorted(items, key=lambda item: item[0]):
        kind = str(v["verdict"])
        reason = f": {_e(v['reason'])}" if v.get("reason") else ""
        out.append(f'<li class="hud-verdict-{_e(kind.replace(" ", "-"))}"><code>{_e(task)}</code> '
                   f'<strong style="color:{_verdict_colour(kind)}">{_e(kind)}</strong>{reason}</li>')
    out.append("</ul></div>")
    return "\n".join(out)


def summary_section_html(
    tasks: Mapping[str, TaskSummary],
    verdicts: Mapping[str, Any] | None = None,
    coverage: Mapping[str, Any] | None = None,
    *,
    title: str = "pytest-hud: success rates",
    sensitivity: list[Any] | None = None,
) -> str:
    """A ``<section class="hud-summary">`` with the per-task table, the chart and the gate's verdicts.

    ``verdicts``: task → gate verdict (``Verdict``, dict or string); the verdict column and the gate
    list appear only when given. ``coverage``: the plugin's coverage dict (declared, reported,
    graded, errors, skipped, missing). ``sensitivity``: the robustness axes' tables
    (:mod:`pytest_hud.core.sensitivity`), shown under the chart.
    """
    from pytest_hud.report.sensitivity import sensitivity_html

    if verdicts is not None and not verdicts:
        verdicts = None  # an empty gate adds an empty column and nothing else
    parts = [
        '<section class="hud-summary">',
        f"<style>{_STYLE}</style>",
        f"<h2>{_e(title)}</h2>",
        _tasks_table(tasks, verdicts),
        _coverage_html(coverage),
        "".join(f'<p class="hud-note hud-sim-success">{_e(note)}</p>' for note in sim_success_notes(tasks)),
        f'<figure class="hud-figure">{success_rate_chart(tasks, verdicts)}</figure>',
        sensitivity_html(sensitivity or []),
        _gate_list(tasks, verdicts or {}),
        "</section>",
    ]
    return "\n".join(p for p in parts if p)


# --------------------------------------------------------------------------------------------------
# episodes and videos
# --------------------------------------------------------------------------------------------------


def video_src(path: str | os.PathLike[str], self_contained: bool = False,
              page_dir: str | os.PathLike[str] | None = None) -> str | None:
    """The ``src`` for a ``<video>`` showing the MP4 at ``path``; None when the file does not exist.

    ``self_contained``: a ``data:video/mp4;base64,...`` URI of the file's bytes. Otherwise the path
    relative to ``page_dir`` (default: the current directory), URL-quoted, or a ``file:`` URI when
    no relative path exists (another drive on Windows).
    """
    file = Path(path)
    if not file.is_absolute():
        file = Path.cwd() / file
    if not file.is_file():
        return None
    if self_contained:
        return "data:video/mp4;base64," + base64.b64encode(file.read_bytes()).decode("ascii")
    base = Path(page_dir) if page_dir is not None else Path.cwd()
    try:
        rel = os.path.relpath(file, base.resolve())
    except ValueError:
        return file.as_uri()
    return quote(Path(rel).as_posix())


def _videos(record: EpisodeRecord) -> list[tuple[str, str]]:
    """(label, path) of an episode's videos: ``video`` or ``video/<camera>`` artefacts."""
    out = []
    for key, path in sorted((record.artefacts or {}).items()):
        if key == "video":
            out.append(("video", path))
        elif key.startswith("video/"):
            out.append((key.split("/", 1)[1], path))
    return out


def _video_block(record: EpisodeRecord, self_contained: bool, page_dir: Path | None) -> str:
    figures = []
    for label, path in _videos(record):
        src = video_src(path, self_contained, page_dir)
        if src is None:
            figures.append(f'<p class="hud-note">{_e(label)}: video not available '
                           f"({_e(path)} was not written)</p>")
            continue
        figures.append(f'<figure><video class="hud-video" controls preload="metadata" muted playsinline '
                       f'src="{_e(src)}"></video><figcaption>{_e(label)}: {_e(Path(path).name)}</figcaption>'
                       f"</figure>")
    return '<div class="hud-videos">' + "".join(figures) + "</div>" if figures else ""


def _natural(text: str) -> list[Any]:
    """Sort key that puts episode 10 after episode 9."""
    return [int(tok) if tok.isdigit() else tok for tok in re.split(r"(\d+)", text)]


def _bool(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "no")


def episodes_table_html(
    episodes: Iterable[EpisodeRecord],
    *,
    self_contained: bool = False,
    page_dir: str | os.PathLike[str] | None = None,
) -> str:
    """Every episode as a table row; a failed or errored episode's videos in an open row below it.

    Videos of successful episodes (``--hud-video all``) are in a collapsed ``<details>`` instead.
    """
    records = sorted(episodes, key=lambda r: (r.task, _natural(str(r.episode))))
    heads = ["Task", "Episode", "Seed", "Outcome", "Success", "Score", "Steps", "Duration (s)"]
    out = ['<section class="hud-episodes">', f"<h2>Episodes ({len(records)})</h2>",
           '<table class="hud-table hud-episode-table">', "<thead><tr>"
           + "".join(_th(h) for h in heads)
           + "</tr></thead>", "<tbody>"]
    base = Path(page_dir) if page_dir is not None else None
    for r in records:
        outcome = r.outcome if r.outcome in ("passed", "failed", "error", "skipped") else "other"
        title = f' title="{_e(r.error)}"' if r.error else ""
        out.append(
            f'<tr class="hud-{outcome}" data-task="{_e(r.task)}" data-episode="{_e(r.episode)}">'
            f'<td class="hud-task">{_e(r.task)}</td><td>{_e(r.episode)}</td>'
            f'<td>{"-" if r.seed is None else _e(r.seed)}</td>'
            f'<td class="hud-outcome"{title}>{_e(r.outcome)}{" (reused)" if r.reused else ""}</td>'
            f"<td>{_bool(r.success)}</td><td>{format_number(r.score, 3)}</td>"
            f'<td>{"-" if r.steps is None else _e(r.steps)}</td>'
            f"<td>{format_number(r.duration_s, 2)}</td></tr>"
        )
        block = _video_block(r, self_contained, base)
        error = f'<div class="hud-error-text">{_e(r.error)}</div>' if r.error else ""
        if r.outcome in ("failed", "error") or r.success is False:
            if block or error:
                out.append(f'<tr class="hud-video-row"><td colspan="{len(heads)}">{error}{block}</td></tr>')
        elif block:
            out.append(f'<tr class="hud-video-row"><td colspan="{len(heads)}">'
                       f"<details><summary>video</summary>{block}</details></td></tr>")
    if not records:
        out.append(f'<tr><td class="hud-task" colspan="{len(heads)}">no episodes</td></tr>')
    out += ["</tbody></table>", "</section>"]
    return "\n".join(out)


def _provenance_html(provenance: Mapping[str, Any], run: Mapping[str, Any]) -> str:
    facts: list[tuple[str, Any]] = []
    for key, label in (("run_id", "run"), ("started", "started")):
        if run.get(key):
            facts.append((label, run[key]))
    for key in ("policy", "policy_hash", "sim", "width", "workers"):
        if provenance.get(key) not in (None, ""):
            facts.append((key.replace("_", " "), provenance[key]))
    git = provenance.get("git")
    if isinstance(git, Mapping) and git.get("revision"):
        facts.append(("git", f"{git['revision']}{' (dirty)' if git.get('dirty') else ''}"))
    if not facts:
        return ""
    return '<dl class="hud-meta">' + "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in facts) + "</dl>"


def standalone_page(
    source: Results | Mapping[str, TaskSummary],
    episodes: Iterable[EpisodeRecord] | None = None,
    *,
    verdicts: Mapping[str, Any] | None = None,
    coverage: Mapping[str, Any] | None = None,
    title: str = "pytest-hud report",
    page_dir: str | os.PathLike[str] | None = None,
    self_contained: bool = False,
    sensitivity: list[Any] | None = None,
) -> str:
    """A complete, self-standing HTML page: provenance, the summary section, and every episode.

    ``source`` is a :class:`~pytest_hud.core.results.Results` (tasks, episodes, coverage and gate verdicts
    are taken from it unless given) or a mapping of task summaries (then pass ``episodes``).
    ``page_dir`` is where the page will be written (video paths are made relative to it);
    ``self_contained=True`` inlines the videos instead. Use :func:`write_standalone_page` to write
    the file with the right ``page_dir``.
    """
    run: Mapping[str, Any] = {}
    provenance: Mapping[str, Any] = {}
    if isinstance(source, Results):
        tasks = source.tasks()
        if episodes is None:
            episodes = source.latest_episodes()
        summary = source.summary or {}
        if verdicts is None:
            verdicts = gate_verdicts(summary.get("gate")) or None
        if coverage is None:
            coverage = summary.get("coverage")
        run, provenance = source.run, source.provenance
    else:
        tasks = dict(source)
    episodes = list(episodes or [])
    if sensitivity is None:  # the robustness axes' tables, from the episodes' records
        from pytest_hud.core.sensitivity import sensitivity_tables

        sensitivity = sensitivity_tables(episodes)
    body = [
        _provenance_html(provenance, run),
        summary_section_html(tasks, verdicts, coverage, title="Success rates", sensitivity=sensitivity),
        episodes_table_html(episodes, self_contained=self_contained, page_dir=page_dir),
    ]
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<meta name="generator" content="pytest-hud">',
        f"<title>{_e(title)}</title>",
        "<style>body { margin: 16px 24px; font-family: Helvetica, Arial, sans-serif; }"
        " h1 { font-size: 22px; }</style>",
        "</head>",
        "<body>",
        f"<h1>{_e(title)}</h1>",
        *[part for part in body if part],
        "</body>",
        "</html>",
        "",
    ])


def write_standalone_page(
    path: str | os.PathLike[str],
    source: Results | Mapping[str, TaskSummary],
    episodes: Iterable[EpisodeRecord] | None = None,
    **options: Any,
) -> Path:
    """Write :func:`standalone_page` to ``path`` (parents created), videos relative to its directory."""
    path = Path(path).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    options.setdefault("page_dir", path.parent)
    path.write_text(standalone_page(source, episodes, **options), encoding="utf-8")
    return path
