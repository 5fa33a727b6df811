"""The history page opened in headless Chromium: one chart per task, every run's point with its
interval, the marked changes where the statistics put them, and the best run's statement.

The page is built from runs whose outcomes are known by construction (a rise, a drop, a task
without any change) and then asked, through the browser, what it rendered and where.
"""

from __future__ import annotations

import pytest

from pytest_hud.gate import TaskOutcomes
from pytest_hud.report.history import Run, build_history
from pytest_hud.report.history_html import history_page
from test_report_html_browser import browser  # noqa: F401 - fixture (skips or fails without Chromium)

pytestmark = pytest.mark.timeout(180)


def outcomes(successes: int, n: int = 40) -> TaskOutcomes:
    return TaskOutcomes({str(i): i < successes for i in range(n)}, declared=n)


RUNS = [  # reach rises 10 -> 38 at step_2000 and drops back at step_3000; <push&pull> stays flat
    Run("step_1000", {"t.py::test_reach": outcomes(10), "t.py::test_push[x=<push&pull>]": outcomes(30)},
        details={"commit": "abc123"}),
    Run("step_2000", {"t.py::test_reach": outcomes(38), "t.py::test_push[x=<push&pull>]": outcomes(31)}),
    Run("step_3000", {"t.py::test_reach": outcomes(12), "t.py::test_push[x=<push&pull>]": outcomes(29)}),
]

WHAT_WAS_RENDERED = """
(() => {
  const charts = Array.from(document.querySelectorAll('svg.hud-history-chart'));
  return charts.map((svg) => {
    const box = svg.getBoundingClientRect();
    const points = Array.from(svg.querySelectorAll('circle.hud-point')).map((c) => {
      const r = c.getBoundingClientRect();
      return {run: c.dataset.run, rate: Number(c.dataset.rate), x: r.x + r.width / 2, y: r.y + r.height / 2,
              inside: r.x >= box.x && r.right <= box.right && r.y >= box.y && r.bottom <= box.bottom};
    });
    const whiskers = Array.from(svg.querySelectorAll('line.hud-whisker')).map((l) => l.getBoundingClientRect().height);
    const changes = Array.from(svg.querySelectorAll('text.hud-change')).map((t) => ({
      direction: t.dataset.change, x: t.getBoundingClientRect().x + t.getBoundingClientRect().width / 2}));
    return {task: svg.dataset.task, width: box.width, points, whiskers, changes};
  });
})()
"""


def test_the_history_page_renders_each_task_with_its_points_intervals_and_changes(browser, tmp_path):
    history = build_history(RUNS)
    page = tmp_path / "history.html"
    page.write_text(history_page(history))
    browser.open(page.as_uri())
    charts = {c["task"]: c for c in browser.evaluate(WHAT_WAS_RENDERED)}
    assert set(charts) == {"t.py::test_reach", "t.py::test_push[x=<push&pull>]"}  # escaped, not markup
    reach, push = charts["t.py::test_reach"], charts["t.py::test_push[x=<push&pull>]"]
    assert [p["run"] for p in reach["points"]] == ["step_1000", "step_2000", "step_3000"]
    assert all(p["inside"] for c in charts.values() for p in c["points"])
    # Left to right in run order, higher success drawn higher, each with a visible interval.
    xs = [p["x"] for p in reach["points"]]
    assert xs == sorted(xs) and reach["points"][1]["y"] < reach["points"][0]["y"]
    assert all(h > 5 for h in reach["whiskers"]) and len(reach["whiskers"]) == 3
    # The rise is marked at step_2000, the drop at step_3000; the flat task has no mark.
    assert [(c["direction"], round(c["x"])) for c in reach["changes"]] == [
        ("up", round(xs[1])), ("down", round(xs[2]))]
    assert push["changes"] == []
    best = browser.evaluate("document.querySelector('p.hud-best').textContent")
    assert best.startswith("Best: step_2000, 69/80 = 86.2%") and "6 one-sided exact tests" in best
    runs = browser.evaluate("Array.from(document.querySelectorAll('table.hud-runs tbody tr'))"
                            ".map((r) => r.cells[1].textContent + ' ' + r.cells[2].textContent)")
    assert runs == ["step_1000 abc123", "step_2000 (best) -", "step_3000 -"]
