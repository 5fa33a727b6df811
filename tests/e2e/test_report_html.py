"""HTML reports as written: the summary section, the standalone page's links, the pytest-html
columns and video extras (no browser; ``test_report_html_browser.py`` opens them in Chromium)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from pytest_hud.core.results import aggregate
from pytest_hud.report.html import standalone_page, summary_section_html
from pytest_hud.report.pytest_html import EPISODE_COLUMNS, HtmlReportHooks, video_extra
from reportkit import TASK, episode_records


def test_the_summary_section_has_the_table_chart_and_verdicts() -> None:
    tasks = aggregate(episode_records("/nonexistent.mp4"))
    html = summary_section_html(tasks, {TASK: {"verdict": "regression", "reason": "dropped <a lot>"}},
                                {"declared": 6, "reported": 5, "graded": 4, "errors": 1, "skipped": 0,
                                 "missing": ["x[5]"]})
    assert html.count('<tr data-task="') == 2 and '<svg xmlns="http://www.w3.org/2000/svg"' in html
    assert "dropped &lt;a lot&gt;" in html and "<a lot>" not in html
    assert "missing 1" in html and "<script" not in html


def test_the_standalone_page_links_videos_relative_to_the_page_by_default(tmp_path: Path) -> None:
    video = tmp_path / "videos" / "ep.mp4"
    video.parent.mkdir()
    video.write_bytes(b"\x00\x00\x00\x18ftypmp42")
    page = standalone_page(aggregate(episode_records(str(video))), episode_records(str(video)),
                           page_dir=tmp_path / "report")
    assert 'src="../videos/ep.mp4"' in page and "data:video" not in page
    inline = standalone_page(aggregate(episode_records(str(video))), episode_records(str(video)),
                             self_contained=True)
    assert 'src="data:video/mp4;base64,AAAAGGZ0eXBtcDQy"' in inline
    missing = standalone_page(aggregate(episode_records(str(tmp_path / "gone.mp4"))),
                              episode_records(str(tmp_path / "gone.mp4")))
    assert "video not available" in missing and "<video" not in missing


def test_pytest_html_rows_keep_the_headers_column_count() -> None:
    hooks = HtmlReportHooks(SimpleNamespace(getoption=lambda *a, **k: None))
    header = ["<th>Result</th>", "<th>Test</th>", "<th>Duration</th>", "<th>Links</th>"]
    hooks.pytest_html_results_table_header(header)
    assert len(header) == 4 + len(EPISODE_COLUMNS) and header[2].endswith(">Task</th>")
    episode = SimpleNamespace(hud_episode={"task": TASK, "episode": "3", "seed": 3, "success": False,
                                           "score": 0.25, "steps": 15, "duration_s": 1.5, "artefacts": {}})
    plain = SimpleNamespace()  # a test that is not an episode
    for report in (episode, plain):
        row = ["<td>r</td>", "<td>t</td>", "<td>d</td>", "<td>l</td>"]
        hooks.pytest_html_results_table_row(report, row)
        assert len(row) == len(header)
    row = ["<td>r</td>", "<td>t</td>", "<td>d</td>", "<td>l</td>"]
    hooks.pytest_html_results_table_row(episode, row)
    assert row[2:9] == ['<td class="col-hud_task">evals/test_pusht.py::test_push</td>',
                        '<td class="col-hud_episode">3</td>', '<td class="col-hud_seed">3</td>',
                        '<td class="col-hud_success">no</td>', '<td class="col-hud_score">0.250</td>',
                        '<td class="col-hud_steps">15</td>', '<td class="col-hud_duration">1.50 s</td>']


def test_pytest_html_columns_join_a_header_built_before_activation() -> None:
    started = SimpleNamespace(_report=SimpleNamespace(running_state="started",
                                                      table_header=["<th>Result</th>", "<th>Test</th>"]))
    config = SimpleNamespace(getoption=lambda *a, **k: None,
                             pluginmanager=SimpleNamespace(get_plugins=lambda: [object(), started]))
    hooks = HtmlReportHooks(config)
    hooks.join_started_report()
    hooks.join_started_report()  # once only
    assert len(started._report.table_header) == 2 + len(EPISODE_COLUMNS)
    row = ["<td>r</td>", "<td>t</td>"]
    hooks.pytest_html_results_table_row(SimpleNamespace(), row)
    assert len(row) == len(started._report.table_header)


def test_pytest_html_rows_stay_as_they_are_when_no_header_was_extended() -> None:
    config = SimpleNamespace(getoption=lambda *a, **k: None, pluginmanager=SimpleNamespace(get_plugins=lambda: []))
    hooks = HtmlReportHooks(config)
    hooks.join_started_report()  # no started pytest-html report to join
    row = ["<td>r</td>", "<td>t</td>"]
    hooks.pytest_html_results_table_row(SimpleNamespace(hud_episode={"task": TASK}), row)
    assert row == ["<td>r</td>", "<td>t</td>"]


def test_video_extra_inlines_or_links_the_mp4(tmp_path: Path) -> None:
    video = tmp_path / "v" / "a b.mp4"
    video.parent.mkdir()
    video.write_bytes(b"\x00\x00\x00\x18ftypmp42")
    inline = video_extra(video, True)
    assert inline["format_type"] == "html"
    assert 'src="data:video/mp4;base64,AAAAGGZ0eXBtcDQy"' in inline["content"]
    linked = video_extra(video, False, relative_to=tmp_path / "html")
    assert 'src="../v/a%20b.mp4"' in linked["content"]
    assert "not available" in video_extra(tmp_path / "none.mp4", False)["content"]


class FakeClock:
    """The ``time`` of the module under test: ``sleep`` moves ``monotonic`` on at once, so a wait is
    measured in the seconds it asked for, whatever the machine's load."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_the_video_extra_is_added_when_the_episodes_teardown_report_arrives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    monkeypatch.setattr(sys.modules[HtmlReportHooks.__module__], "time", clock)
    video = tmp_path / "v.mp4"
    video.write_bytes(b"\x00\x00\x00\x18ftypmp42")
    options = {"htmlpath": str(tmp_path / "report.html"), "self_contained_html": True}
    hooks = HtmlReportHooks(SimpleNamespace(getoption=lambda name, default=None: options.get(name, default)),
                            video_wait_s=10.0)
    # The plugin relabels an errored episode's call report as "setup": the carrier is found by its
    # hud_episode, not by its phase.
    carrier = SimpleNamespace(nodeid="t.py::test[1]", when="setup", extras=[],
                              hud_episode={"task": "t", "episode": "1", "artefacts": {"video": str(video),
                                                                                      "trace": "x.npz"}})
    hooks.pytest_runtest_logreport(carrier)
    assert carrier.extras == []  # not yet: the encode may still be finishing
    hooks.pytest_runtest_logreport(SimpleNamespace(nodeid="t.py::test[1]", when="teardown"))
    [extra] = carrier.extras
    assert extra["format_type"] == "html" and "data:video/mp4;base64," in extra["content"]

    # A video that never appears: the extra says so, and the next one does not wait again.
    lost = SimpleNamespace(nodeid="t.py::test[2]", when="call",
                           hud_episode={"artefacts": {"video/wrist": str(tmp_path / "never.mp4")}})
    hooks.pytest_runtest_logreport(lost)
    before = clock.now
    hooks.pytest_runtest_logreport(SimpleNamespace(nodeid="t.py::test[2]", when="teardown"))
    assert clock.now - before >= 10.0  # it waited video_wait_s for the first video that never came
    assert "video not available" in lost.extras[0]["content"] and "wrist" in lost.extras[0]["content"]
    again = SimpleNamespace(nodeid="t.py::test[3]", when="call",
                            hud_episode={"artefacts": {"video": str(tmp_path / "never2.mp4")}})
    hooks.pytest_runtest_logreport(again)
    before = clock.now
    hooks.pytest_runtest_logreport(SimpleNamespace(nodeid="t.py::test[3]", when="teardown"))
    assert clock.now == before  # no second wait
    assert "video not available" in again.extras[0]["content"]
