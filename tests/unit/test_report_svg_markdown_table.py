"""The per-task summaries people read: terminal table, markdown for PR comments, the SVG chart."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from pytest_hud.gate import TaskOutcomes, evaluate_gate
from pytest_hud.report.markdown import comparison_markdown, summary_markdown
from pytest_hud.report.svg import DEFAULT_COLOUR, VERDICT_COLOURS, success_rate_chart
from pytest_hud.report.table import short_task, summary_lines, verdict_cell
from pytest_hud.core.results import EpisodeRecord, TaskSummary, aggregate
from pytest_hud.stats import wilson_interval

SVG = "{http://www.w3.org/2000/svg}"
CARTPOLE = "evals/classic/test_cartpole.py::test_balance"
PUSHT = "evals/manipulation/test_pusht.py::test_push_t[diffusion-policy-checkpoint-v2-final]"


def episodes(task: str, successes: int, failures: int, errors: int = 0,
             reward: float = 10.0) -> list[EpisodeRecord]:
    outcomes = ["passed"] * successes + ["failed"] * failures + ["error"] * errors
    return [EpisodeRecord(task=task, episode=str(i), nodeid=f"{task}[{i}]", outcome=o, seed=i,
                          success={"passed": True, "failed": False}.get(o), total_reward=reward,
                          duration_s=1.8)
            for i, o in enumerate(outcomes)]


@pytest.fixture
def tasks() -> dict[str, TaskSummary]:
    return aggregate(episodes(CARTPOLE, 41, 9, reward=451.25) + episodes(PUSHT, 3, 7, errors=2, reward=0.5)
                     + [EpisodeRecord(task="t.py::test_never_graded", episode="0", nodeid="n",
                                      outcome="error")])


# -------------------------------------------------------------------------------------------- table


def test_the_table_shows_counts_rate_and_wilson_interval_per_task(tasks) -> None:
    lines = summary_lines(tasks, width=120)
    assert lines[0].split() == ["task", "n", "succ", "rate", "95%", "CI", "err", "mean", "ret", "ep/h"]
    row = next(line for line in lines if line.startswith(CARTPOLE))
    low, high = wilson_interval(41, 50)
    assert row.split()[1:] == ["50", "41", "82.0%", f"[{100 * low:.1f},", f"{100 * high:.1f}]", "0", "451.2",
                               "2000"]
    never = next(line for line in lines if "never_graded" in line)
    assert never.split()[1:6] == ["0", "0", "-", "-", "1"]  # no graded episode: no rate, no interval


def test_long_task_ids_are_shortened_to_fit_the_width(tasks) -> None:
    lines = summary_lines(tasks, width=80)
    assert all(len(line) <= 80 for line in lines)
    assert any(line.startswith("…") and "v2-final]" in line for line in lines)  # the telling end survives
    assert len({line.split()[0] for line in lines[2:]}) == 3


def test_the_verdict_column_appears_only_with_a_gate(tasks) -> None:
    assert "verdict" not in summary_lines(tasks)[0]
    verdicts = {CARTPOLE: {"verdict": "regression", "adjusted_p": 0.0042}, PUSHT: "inconclusive"}
    lines = summary_lines(tasks, verdicts, width=140)
    assert lines[0].rstrip().endswith("verdict")
    assert next(line for line in lines if line.startswith(CARTPOLE)).endswith("regression (p=0.0042)")
    assert next(line for line in lines if "never_graded" in line).endswith("  -")


def test_short_task_drops_directories_then_the_start_of_the_file() -> None:
    assert short_task(CARTPOLE, 100) == CARTPOLE
    assert short_task(CARTPOLE, 30) == "test_cartpole.py::test_balance"
    assert short_task(CARTPOLE, 20) == "…le.py::test_balance"
    assert len(short_task(PUSHT, 25)) == 25 and short_task(PUSHT, 25).endswith("final]")


def test_verdict_cell_accepts_gate_verdict_objects() -> None:
    cur = {"t": TaskOutcomes({str(i): i >= 8 for i in range(10)}, declared=10)}
    base = {"t": TaskOutcomes({str(i): True for i in range(10)}, declared=10)}
    verdict = evaluate_gate(cur, base)[0]
    assert verdict_cell(verdict).startswith("regression (p=")


# ----------------------------------------------------------------------------------------- markdown


def table_rows(markdown: str) -> list[list[str]]:
    rows = [line for line in markdown.splitlines() if line.startswith("|")]
    # split on unescaped pipes only: an escaped \| inside a code span is part of the cell
    return [[c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]] for row in rows]


def test_summary_markdown_is_a_github_table_with_one_row_per_task(tasks) -> None:
    text = summary_markdown(tasks, {CARTPOLE: {"verdict": "pass", "reason": "drop of 2 points, p=0.6"}},
                            coverage={"declared": 63, "reported": 63, "graded": 60, "errors": 3, "skipped": 0,
                                      "missing": []}, title="Nightly eval")
    assert text.startswith("### Nightly eval\n")
    rows = table_rows(text)
    assert rows[0] == ["Task", "n", "Successes", "Rate", "95% CI", "Errors", "Mean return", "Verdict"]
    assert all(re.fullmatch(r":?-+:?", cell) for cell in rows[1])  # the delimiter row
    cart = next(r for r in rows if CARTPOLE in r[0])
    assert cart[1:] == ["50", "41", "82.0%", "[69.2, 90.2]", "0", "451.2", "✅ pass"]
    assert len(rows) == 2 + len(tasks)
    assert "Coverage: 63/63 declared episodes reported, 60 graded, 3 errors, 0 skipped" in text
    assert "<details>" in text and "drop of 2 points" in text


def test_markdown_escapes_pipes_and_html_in_task_ids() -> None:
    task = "t.py::test_x[a|b-<img src=x>]"
    verdicts = {task: {"verdict": "regression", "reason": "<b>x</b> | y"}}
    text = summary_markdown(aggregate(episodes(task, 1, 1)), verdicts)
    row = next(r for r in table_rows(text) if "test_x" in r[0])
    assert len(row) == 8  # the pipe in the id did not add a column
    assert "<b>" not in text and "&lt;b&gt;" in text


def test_comparison_markdown_shows_both_rates_the_change_and_the_gates_verdict() -> None:
    base = aggregate(episodes(CARTPOLE, 45, 5))
    cur = aggregate(episodes(CARTPOLE, 30, 20) + episodes("t.py::test_new", 5, 5))
    verdicts = {CARTPOLE: {"verdict": "regression", "drop": 0.3, "adjusted_p": 0.00012, "reason": "dropped"}}
    text = comparison_markdown(cur, base, verdicts)
    rows = table_rows(text)
    assert rows[0] == ["Task", "baseline", "current", "Change", "p (adj.)", "Verdict"]
    cart = next(r for r in rows if CARTPOLE in r[0])
    assert cart[1:] == ["90.0% (n=50)", "60.0% (n=50)", "-30.0 pts", "0.00012", "❌ regression"]
    new = next(r for r in rows if "test_new" in r[0])
    assert new[1] == "—" and new[-1] == "-"
    assert "Gate: 1 regression" in text


# ---------------------------------------------------------------------------------------------- svg


def test_the_chart_is_valid_svg_with_a_bar_and_whisker_per_graded_task(tasks) -> None:
    svg = success_rate_chart(tasks)
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    rows = root.findall(f"{SVG}g[@class='hud-chart-row']")
    assert [r.get("data-task") for r in rows] == list(tasks)
    bars = {r.get("data-task"): r.find(f"{SVG}rect[@class='hud-bar']") for r in rows}
    assert bars["t.py::test_never_graded"] is None  # n = 0: no bar, a note instead
    cart, pusht = float(bars[CARTPOLE].get("width")), float(bars[PUSHT].get("width"))
    assert cart / pusht == pytest.approx(0.82 / 0.30, rel=0.01)
    whisker = rows[0].find(f"{SVG}g[@class='hud-whisker']")
    xs = [float(line.get("x1")) for line in whisker]
    x0 = float(bars[CARTPOLE].get("x"))
    span = cart / 0.82
    low, high = wilson_interval(41, 50)
    assert xs[0] == pytest.approx(x0 + span * low, abs=0.1)
    assert xs[2] == pytest.approx(x0 + span * high, abs=0.1)
    assert {t.text for t in root.iter(f"{SVG}text")} >= {"0%", "50%", "100%"}
    assert bars[CARTPOLE].get("fill") == DEFAULT_COLOUR


def test_the_chart_is_coloured_by_verdict_and_marks_the_baseline(tasks) -> None:
    svg = success_rate_chart(tasks, {CARTPOLE: {"verdict": "regression", "baseline_rate": 0.95},
                                     PUSHT: {"verdict": "pass"}})
    root = ET.fromstring(svg)
    rows = {r.get("data-task"): r for r in root.findall(f"{SVG}g[@class='hud-chart-row']")}
    assert rows[CARTPOLE].find(f"{SVG}rect[@class='hud-bar']").get("fill") == VERDICT_COLOURS["regression"]
    assert rows[PUSHT].find(f"{SVG}rect[@class='hud-bar']").get("fill") == VERDICT_COLOURS["pass"]
    assert rows[CARTPOLE].find(f"{SVG}line[@class='hud-baseline']") is not None
    assert rows[PUSHT].find(f"{SVG}line[@class='hud-baseline']") is None
    legend = {t.text for t in root.iter(f"{SVG}text")}
    assert {"regression", "pass", "baseline rate"} <= legend


def test_the_chart_escapes_text_and_has_no_script_or_external_resources() -> None:
    task = 't.py::test_x[<script>alert(1)</script>&"q"]'
    svg = success_rate_chart(aggregate(episodes(task, 2, 1)),
                             {task: {"verdict": "pass", "reason": "</svg><script>"}})
    root = ET.fromstring(svg)  # still well-formed XML
    assert not [el for el in root.iter() if el.tag.endswith("script")]
    assert "<script>" not in svg and "href" not in svg and "url(" not in svg
    assert root.find(f"{SVG}g").get("data-task") == task  # escaped, not mangled


def test_an_empty_chart_says_so() -> None:
    root = ET.fromstring(success_rate_chart({}))
    assert "no tasks" in {t.text for t in root.iter(f"{SVG}text")}
