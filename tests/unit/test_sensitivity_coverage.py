"""The sensitivity table shows what it dropped: an errors column per level in every output, and the
gate's coverage rule per level (a level under it is marked, and never called "not worse")."""

from __future__ import annotations

from pytest_hud.core.results import EpisodeRecord
from pytest_hud.core.sensitivity import sensitivity_tables
from pytest_hud.report.html import summary_section_html
from pytest_hud.report.markdown import summary_markdown
from pytest_hud.report.sensitivity import sensitivity_lines

LEVELS = ("none", "crashy")


def record(level: str, seed: int, success: bool, outcome: str | None = None) -> EpisodeRecord:
    outcome = outcome or ("passed" if success else "failed")
    return EpisodeRecord(
        task=f"t.py::test_x[p={level}]", episode=str(seed), nodeid=f"t.py::test_x[{level}-{seed}]", outcome=outcome,
        seed=seed, success=None if outcome == "error" else success,
        axes={"p": {"level": level, "index": LEVELS.index(level), "reference": "none", "task": "t.py::test_x"}})


def crashing_on_its_failures(errors: int = 15) -> list[EpisodeRecord]:
    """The reference fails 15 of 100 seeds; the level crashes on exactly those it would have failed."""
    ref = [record("none", s, s >= 15) for s in range(100)]
    level = [record("crashy", s, True, outcome="error" if s < errors else None) for s in range(100)]
    return ref + level


def test_a_level_that_crashes_on_its_failures_is_marked_and_never_called_not_worse():
    (table,) = sensitivity_tables(crashing_on_its_failures(), min_coverage=0.9)
    crashy = table.rows[1]
    assert (crashy.n, crashy.errors, crashy.successes) == (85, 15, 85)
    assert crashy.low_coverage and crashy.coverage == 0.85 and not crashy.significantly_worse
    assert crashy.status() == "low coverage" and table.low_coverage == ["crashy"]
    lines = sensitivity_lines([table])
    assert lines[1].split()[:4] == ["level", "n", "err", "succ"]
    assert lines[4].split()[:4] == ["crashy", "85", "15", "85"] and lines[4].endswith("LOW COVERAGE")
    assert not any("no level significantly worse" in line for line in lines)
    assert any("under the 90% coverage rule" in line and "crashy (85/100 graded)" in line for line in lines)


def test_the_same_level_within_the_coverage_rule_is_judged():
    (table,) = sensitivity_tables(crashing_on_its_failures(errors=5), min_coverage=0.9)
    assert table.rows[1].status() == "not worse" and not table.low_coverage
    assert sensitivity_lines([table])[-1] == "robustness: p: no level significantly worse than none"
    (lenient,) = sensitivity_tables(crashing_on_its_failures(), min_coverage=0.8)  # --hud-min-coverage=0.8
    assert lenient.rows[1].status() == "not worse"


def test_a_reference_under_the_rule_leaves_no_level_called_not_worse():
    recs = [record("none", s, True, outcome="error" if s < 3 else None) for s in range(10)]
    recs += [record("crashy", s, True) for s in range(10)]
    (table,) = sensitivity_tables(recs)
    assert table.reference_low and [r.status(True) for r in table.rows] == ["ref", "low coverage"]
    lines = sensitivity_lines([table])
    assert lines[3].endswith("LOW COVERAGE") and lines[4].endswith("LOW COVERAGE")
    assert not any("significantly worse than none" in line for line in lines)
    assert "so no level is called not worse" in lines[-1]


def test_errors_and_the_coverage_mark_reach_markdown_html_and_the_results_file():
    tables = sensitivity_tables(crashing_on_its_failures())
    stored = [t.to_dict() for t in tables]
    (row_ref, row_crashy) = stored[0]["rows"]
    assert row_crashy["errors"] == 15 and row_crashy["status"] == "low coverage" and row_crashy["low_coverage"]
    assert row_crashy["coverage"] == 0.85 and row_ref["status"] == "ref"
    assert stored[0]["low_coverage"] == ["crashy"] and stored[0]["min_coverage"] == 0.9
    md = summary_markdown({}, sensitivity=tables)
    assert "| Level | n | Errors | Successes |" in md
    assert "| `crashy` | 85 | 15 | 85 |" in md and "⚠️ low coverage" in md
    html = summary_section_html({}, sensitivity=tables)
    assert "<th>Errors</th>" in html and ">low coverage</td>" in html
    assert '<tr data-level="crashy"><td class="hud-task">crashy</td><td>85</td><td>15</td>' in html
