"""pytest-html 4.x integration: episode columns, the per-task summary, and failure videos inline.

Registered by the plugin on the controller only when pytest-html is installed and ``--html`` is
given (pytest-randomly style: an optional integration in its own small class)::

    if config.pluginmanager.hasplugin("html") and not hasattr(config, "workerinput"):
        config.pluginmanager.register(HtmlReportHooks(config, controller.html_summary), "hud-html")

What it adds to the report:

- **Columns** Task, Episode, Seed, Success, Score, Steps, Episode time after pytest-html's *Test*
  column, from ``report.hud_episode`` (the builtin dict the plugin puts on each episode's report).
  Tests that are not episodes get empty cells, so every row keeps the header's column count.
- **Summary**: :func:`~pytest_hud.report.html.summary_section_html` (per-task table, chart, gate
  verdicts) appended to the summary's ``postfix``, built from ``summary()``, a callable the plugin
  passes in that returns the controller's current ``(tasks, verdicts, coverage)``; it is called in
  pytest-html's ``pytest_sessionfinish`` (trylast), after the gate has run.
- **Videos**: an HTML extra with a ``<video controls>`` player for each episode that has a video
  artefact, shown in the test's expandable details (failed tests are expanded by default).

How videos get into the report, and why this way (checked against pytest-html 4.2.0's source):

1. pytest-html collects ``report.extras`` in its ``pytest_runtest_logreport`` (``trylast``) on the
   controller, and only when the test's *teardown* report arrives does it process the extras of all
   that test's reports and render the rows. The worker-side ``pytest_runtest_makereport`` is too
   early (the MP4 is still being encoded on the recorder's thread, and under xdist a base64 video
   would also have to cross the execnet channel), and the row hook is too late (extras are already
   processed by then and it cannot add any).
2. So :class:`HtmlReportHooks` implements ``pytest_runtest_logreport`` (``tryfirst``) on the
   controller: it remembers the report that carries ``hud_episode`` and, when that test's teardown
   report arrives, appends :func:`video_extra` for each ``video``/``video/<camera>`` artefact to the
   carrier's ``extras``, just before pytest-html reads them. This is the same code path with and
   without xdist: under xdist the controller gets deserialised reports whose ``hud_episode`` holds
   only builtins (the path as a string), and the extra is built from that path on the controller;
   under ``-n 0`` the controller is the worker. (The reports' ``when`` is not relied on: the
   plugin relabels an errored episode's call report as ``setup``.)
3. Recorders write ``<name>.mp4.part`` and rename it when the encode finishes, so an existing file is
   complete. The plugin flushes the worker's recorder before the episode's reports leave the worker;
   as a second guard the controller waits up to ``video_wait_s`` for the file to appear. If a
   video never appears the extra says so, and later waits are skipped (no stall per episode).
4. ``--self-contained-html``: pytest-html's own ``extras.video`` would be inlined too, but it takes
   base64 content and in the normal mode copies it into ``assets/`` and shows it in its small media
   viewer. An ``extras.html`` extra is inserted verbatim, so :func:`video_extra` controls the
   player: in self-contained mode the ``src`` is a ``data:video/mp4;base64,...`` URI (the report is
   one file and plays anywhere); otherwise it is the MP4's path relative to the report's directory
   (``--html``'s parent), so the report stays small and plays as long as the video directory is
   published with it (for CI artefacts, keep the videos under the report's directory).

``tests/e2e/test_report_html_browser.py`` opens such reports in headless Chromium, made under
``-n 2 --self-contained-html`` and under ``-n 0`` with linked videos, and checks that the players
decode their media.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from html import escape
from pathlib import Path
from typing import Any

import pytest

from pytest_hud.core.results import TaskSummary
from pytest_hud.report.html import summary_section_html, video_src
from pytest_hud.report.table import format_number

__all__ = ["EPISODE_COLUMNS", "HtmlReportHooks", "video_extra"]

#: (column type used for sorting, header) of the episode columns, in order.
EPISODE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("hud_task", "Task"),
    ("hud_episode", "Episode"),
    ("hud_seed", "Seed"),
    ("hud_success", "Success"),
    ("hud_score", "Score"),
    ("hud_steps", "Steps"),
    ("hud_duration", "Episode time"),
)
_INSERT_AT = 2  # after pytest-html's Result and Test columns, before its Duration and Links

#: What the plugin's summary callable returns: (task summaries, gate verdicts or None, coverage or None).
SummaryData = tuple[Mapping[str, TaskSummary], Mapping[str, Any] | None, Mapping[str, Any] | None]


def _html_extra(content: str) -> dict[str, Any]:
    try:
        from pytest_html import extras
    except ImportError:  # the same dict pytest-html builds, for callers that only render it later
        return {"name": None, "format_type": "html", "content": content, "mime_type": None, "extension": None}
    return extras.html(content)


def video_extra(
    path: str | os.PathLike[str],
    self_contained: bool,
    *,
    relative_to: str | os.PathLike[str] | None = None,
    name: str | None = None,
) -> dict[str, Any]:
    """A pytest-html extra (``extras.html``) with a playable ``<video controls>`` for the MP4 at ``path``.

    ``self_contained``: the video is inlined as a base64 ``data:`` URI (``--self-contained-html``).
    Otherwise its ``src`` is the path relative to ``relative_to`` (the report's directory; default
    the current directory). If the file does not exist the extra says so instead of a dead player.
    """
    label = escape(name or Path(path).name)
    src = video_src(path, self_contained, relative_to)
    if src is None:
        return _html_extra(f'<p class="hud-video-missing">{label}: video not available '
                           f"({escape(str(path))} was not written)</p>")
    return _html_extra(
        f'<div class="hud-video-extra"><video class="hud-video" controls preload="metadata" muted '
        f'playsinline style="width:360px;max-width:100%;max-height:480px;background:#000" '
        f'src="{escape(src, quote=True)}">'
        f"</video><div>{label}</div></div>"
    )


def _cell(column: str, value: Any) -> str:
    return f'<td class="col-{column}">{escape(str(value), quote=True)}</td>'


class HtmlReportHooks:
    """pytest-html hooks for episode columns, the per-task summary section and videos.

    ``summary``: returns ``(tasks, verdicts, coverage)`` (task summaries, gate verdicts or None, the
    coverage dict or None) when the report is finished; None leaves the summary out.
    ``video_wait_s``: how long the controller waits for a video file that is not there yet.
    """

    def __init__(
        self,
        config: pytest.Config,
        summary: Callable[[], SummaryData] | None = None,
        *,
        video_wait_s: float = 10.0,
    ) -> None:
        self.config = config
        self.summary = summary
        self.video_wait_s = video_wait_s
        self._carriers: dict[str, Any] = {}
        self._gave_up_waiting = False
        self._columns = False  # rows get episode cells only if the header got its columns

    def join_started_report(self) -> None:
        """Add the episode columns to a pytest-html header that was built before we were registered.

        pytest-hud activates lazily (after collection, or when an xdist worker reports it), which
        is after pytest-html's ``pytest_sessionstart`` asked for header cells. Rows must have as
        many cells as the header, so if the started report can't be found the rows stay as they are.
        """
        if self._columns:
            return
        for plugin in self.config.pluginmanager.get_plugins():
            report = getattr(plugin, "_report", None)
            header = getattr(report, "table_header", None)
            if getattr(report, "running_state", None) == "started" and isinstance(header, list):
                self.pytest_html_results_table_header(header)
                return

    # ------------------------------------------------------------ settings
    @property
    def self_contained(self) -> bool:
        return bool(self.config.getoption("self_contained_html", False))

    @property
    def report_dir(self) -> Path | None:
        """The directory of ``--html PATH``, resolved the way pytest-html resolves it."""
        html_path = self.config.getoption("htmlpath", None)
        if not html_path:
            return None
        return (Path.cwd() / Path(os.path.expandvars(html_path)).expanduser()).parent

    # ------------------------------------------------------------- columns
    def pytest_html_results_table_header(self, cells: list[str]) -> None:
        cells[_INSERT_AT:_INSERT_AT] = [
            f'<th class="sortable" data-column-type="{col}">{title}</th>' for col, title in EPISODE_COLUMNS
        ]
        self._columns = True

    def pytest_html_results_table_row(self, report: Any, cells: list[str]) -> None:
        if not self._columns:
            return
        ep = getattr(report, "hud_episode", None)
        if not isinstance(ep, Mapping):
            ep = {}
        success = ep.get("success")
        values = {
            "hud_task": ep.get("task", ""),
            "hud_episode": ep.get("episode", ""),
            "hud_seed": "" if ep.get("seed") is None else ep["seed"],
            "hud_success": "" if success is None else ("yes" if success else "no"),
            "hud_score": "" if ep.get("score") is None else format_number(ep["score"], 3),
            "hud_steps": "" if ep.get("steps") is None else ep["steps"],
            "hud_duration": "" if ep.get("duration_s") is None else f"{format_number(ep['duration_s'], 2)} s",
        }
        cells[_INSERT_AT:_INSERT_AT] = [_cell(col, values[col]) for col, _ in EPISODE_COLUMNS]

    # ------------------------------------------------------------- summary
    def pytest_html_results_summary(self, prefix: list[str], summary: list[str], postfix: list[str]) -> None:
        if self.summary is None:
            return
        data = tuple(self.summary())
        tasks: Mapping[str, TaskSummary] = data[0] or {}
        verdicts = data[1] if len(data) > 1 else None
        coverage = data[2] if len(data) > 2 else None
        sensitivity = data[3] if len(data) > 3 else None
        if tasks or verdicts:
            postfix.append(summary_section_html(tasks, verdicts, coverage, sensitivity=sensitivity))

    # -------------------------------------------------------------- videos
    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if hasattr(self.config, "workerinput") or self.report_dir is None:
            return  # pytest-html renders on the controller, and only with --html
        if isinstance(getattr(report, "hud_episode", None), Mapping):
            self._carriers[report.nodeid] = report
        if report.when != "teardown":
            return
        carrier = self._carriers.pop(report.nodeid, None)
        if carrier is None:
            return
        videos = _video_artefacts(carrier.hud_episode)
        if not videos:
            return
        extras = list(getattr(carrier, "extras", None) or [])
        for label, path in videos:
            self._wait_for(path)
            extras.append(video_extra(path, self.self_contained, relative_to=self.report_dir, name=label))
        carrier.extras = extras

    def _wait_for(self, path: str) -> None:
        """Give an encode that is still finishing a moment; stop waiting once one never arrived."""
        if self._gave_up_waiting:
            return
        file = Path(path)
        deadline = time.monotonic() + self.video_wait_s
        while not file.exists():
            if time.monotonic() >= deadline:
                self._gave_up_waiting = True
                return
            time.sleep(0.05)

    def pytest_sessionfinish(self) -> None:
        self._carriers.clear()  # tests whose teardown never came (a crashed worker)


def _video_artefacts(episode: Mapping[str, Any]) -> list[tuple[str, str]]:
    artefacts = episode.get("artefacts") or {}
    if not isinstance(artefacts, Mapping):
        return []
    out = []
    for key, path in sorted(artefacts.items()):
        if key == "video" or str(key).startswith("video/"):
            label = "video" if key == "video" else str(key).split("/", 1)[1]
            out.append((f"{label}: {Path(str(path)).name}", str(path)))
    return out
