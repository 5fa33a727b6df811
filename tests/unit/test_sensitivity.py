"""The sensitivity table of robustness axes: levels against the reference, Holm over the levels, and
the gate holding each level to its own baseline."""

from __future__ import annotations

import pytest

from pytest_hud.controller.ledger import Ledger
from pytest_hud.core.results import EpisodeRecord, Results
from pytest_hud.core.sensitivity import sensitivity_tables
from pytest_hud.core.settings import HudSettings, SettingsError
from pytest_hud.gate import GateConfig, gate_passed
from pytest_hud.report.markdown import summary_markdown
from pytest_hud.report.html import summary_section_html
from pytest_hud.report.sensitivity import sensitivity_lines
from pytest_hud.stats import compare_levels

LEVELS = ("none", "small", "large", "other")


def record(level: str, seed: int, success: bool, task: str = "t.py::test_x", outcome: str | None = None,
           reference: str | None = "none", index: int | None = None) -> EpisodeRecord:
    outcome = outcome or ("passed" if success else "failed")
    return EpisodeRecord(
        task=f"{task}[p={level}]", episode=str(seed), nodeid=f"{task}[{level}-{seed}]", outcome=outcome, seed=seed,
        success=None if outcome == "error" else success,
        axes={"p": {"level": level, "index": LEVELS.index(level) if index is None else index,
                    "reference": reference, "task": task}})


def suite(rates: dict[str, int], n: int = 10, task: str = "t.py::test_x") -> list[EpisodeRecord]:
    """``rates[level]`` successes out of ``n`` seeds per level (the first seeds succeed)."""
    return [record(level, s, s < k, task) for level, k in rates.items() for s in range(n)]


def test_a_level_much_worse_than_the_reference_is_flagged_and_a_level_like_it_is_not():
    (table,) = sensitivity_tables(suite({"large": 1, "none": 10, "small": 9}))
    assert [r.level for r in table.rows] == ["none", "small", "large"]  # reference first, then the parameter's order
    none, small, large = table.rows
    assert none.is_reference and none.test is None and none.n == 10 and none.rate == 1.0
    assert small.test == "paired-mcnemar" and small.n_pairs == 10 and not small.significantly_worse
    assert large.difference == pytest.approx(-0.9) and large.p_value == pytest.approx(1 / 2**9)
    assert large.adjusted_p == pytest.approx(2 / 2**9) and large.significantly_worse  # Holm: 2 levels
    assert table.worse == ["large"] and table.problem is None


def test_holm_makes_a_borderline_level_pass_in_a_larger_family():
    # 5 worse pairs of 5 discordant: p = 1/32 = 0.031 alone, but times 3 under Holm with two more levels
    alone = sensitivity_tables(suite({"none": 10, "large": 5}))[0]
    assert alone.rows[1].significantly_worse
    crowd = sensitivity_tables(suite({"none": 10, "large": 5, "small": 10, "other": 10}))[0]
    large = next(r for r in crowd.rows if r.level == "large")
    assert large.p_value == pytest.approx(1 / 32) and large.adjusted_p == pytest.approx(3 / 32)
    assert not large.significantly_worse


def test_levels_that_ran_other_seeds_are_compared_unpaired_with_boschloo():
    recs = [record("none", s, True) for s in range(10)] + [record("large", 100 + s, s < 2) for s in range(10)]
    (table,) = sensitivity_tables(recs)
    large = table.rows[1]
    assert large.test == "unpaired-boschloo" and large.n_pairs == 0 and large.significantly_worse


def test_an_axis_marked_unpaired_is_compared_with_boschloo_even_on_the_same_seeds():
    # variant suites with initial states of their own: seed s is not the same scene at every level
    recs = suite({"none": 10, "large": 2})
    for rec in recs:
        rec.axes["p"]["paired"] = False
    (table,) = sensitivity_tables(recs)
    large = table.rows[1]
    assert large.test == "unpaired-boschloo" and large.n_pairs == 0
    paired = sensitivity_tables(suite({"none": 10, "large": 2}))[0].rows[1]
    assert paired.test == "paired-mcnemar" and paired.p_value == pytest.approx(1 / 2**8)
    assert large.p_value != paired.p_value and large.significantly_worse
    ref = {str(s): True for s in range(10)}
    assert compare_levels(ref, {"x": {str(s): s < 2 for s in range(10)}}, paired=False)["x"].test == "unpaired-boschloo"


def test_errors_are_counted_apart_and_not_graded():
    recs = suite({"none": 10, "small": 10}) + [record("small", 10, False, outcome="error")]
    small = sensitivity_tables(recs)[0].rows[1]
    assert (small.n, small.errors) == (10, 1)


def test_a_reference_without_graded_episodes_is_a_problem_not_a_pass():
    recs = [record("small", s, s < 3) for s in range(10)]
    (table,) = sensitivity_tables(recs)
    assert table.problem and "'none'" in table.problem and table.worse == []
    assert all(r.p_value is None for r in table.rows)
    assert any("has no episodes" in line for line in sensitivity_lines([table]))


def test_without_a_named_reference_the_parameters_first_value_is_the_reference():
    recs = [record(lv, s, lv != "large" or s < 1, reference=None) for lv in ("large", "none") for s in range(8)]
    for r in recs:
        r.axes["p"]["index"] = {"none": 0, "large": 1}[r.axes["p"]["level"]]
    (table,) = sensitivity_tables(recs)
    assert table.reference == "none" and table.worse == ["large"]


def test_tables_pool_over_tasks_and_pair_within_each_task():
    recs = suite({"none": 10, "large": 6}, task="a.py::t") + suite({"none": 10, "large": 6}, task="b.py::t")
    pooled, per_a, per_b = sensitivity_tables(recs, per_task=True)
    assert pooled.scope == "pooled" and pooled.tasks == ["a.py::t", "b.py::t"]
    assert pooled.rows[1].n_pairs == 20 and pooled.rows[1].p_value == pytest.approx(1 / 2**8)
    assert (per_a.scope, per_b.scope) == ("a.py::t", "b.py::t")
    assert per_a.rows[1].p_value == pytest.approx(1 / 2**4)  # 4 worse pairs in one task alone


def test_disagreeing_references_are_named_as_the_problem():
    recs = suite({"none": 5, "small": 5}) + [record("small", 9, True, task="u.py::t", reference="small")]
    (table,) = sensitivity_tables(recs)
    assert "several reference levels" in table.problem


def test_records_without_axes_make_no_table():
    assert sensitivity_tables([EpisodeRecord(task="t", episode="0", nodeid="t[0]", outcome="passed", success=True)]) == []


def test_the_tables_read_the_same_in_every_report():
    tables = sensitivity_tables(suite({"none": 10, "small": 9, "large": 1}))
    lines = sensitivity_lines(tables)
    assert lines[0].startswith("robustness: p (reference none; pooled over 1 task;")
    assert lines[-2].endswith("WORSE") and lines[-2].split()[0] == "large"
    assert lines[-1] == "robustness: p: significantly worse than none: large"
    md = summary_markdown({}, sensitivity=tables)
    assert "#### Robustness: p (reference none" in md and "| `large` |" in md and "❌ worse" in md
    html = summary_section_html({}, sensitivity=tables)
    assert '<tr data-level="large">' in html and ">worse</td>" in html


def test_compare_levels_refuses_a_bad_alpha():
    with pytest.raises(ValueError, match="alpha"):
        compare_levels({"a": True}, {"x": {"a": False}}, alpha=1.0)


def test_the_axis_option_parses_names_and_references():
    settings = HudSettings.build({"axis": "perturbation=none,suite"}, {})
    assert settings.axes == {"perturbation": "none", "suite": None}
    with pytest.raises(SettingsError, match="names no parameter"):
        HudSettings.build({"axis": "=none"}, {})


def gate(current_large: int) -> list:
    baseline = suite({"none": 30, "small": 30, "large": 30}, n=30)
    ledger = Ledger(GateConfig(), Results(run={"record": "run"}, episodes=baseline, summary=None))
    current = suite({"none": 30, "small": 30, "large": current_large}, n=30)
    ledger.declare([{"task": r.task, "episode": r.episode, "seed": r.seed, "nodeid": r.nodeid} for r in current])
    for r in current:
        ledger.add(r)
    return ledger.verdicts()


def test_the_gate_holds_each_level_to_its_own_baseline():
    """The level is in the task id, so a regression at one level fails the gate while the others pass."""
    verdicts = gate(current_large=15)
    kinds = {v.task: v.verdict for v in verdicts}
    assert set(kinds) == {f"t.py::test_x[p={lv}]" for lv in ("none", "small", "large")}
    assert kinds.pop("t.py::test_x[p=large]") == "regression"
    assert set(kinds.values()) <= {"pass", "inconclusive"}
    assert not gate_passed(verdicts)
    assert gate_passed(gate(current_large=30))  # the same run without the drop at that level passes
