"""The gate on a continuous score: a task that opts in is compared on its episodes' scores with rank
tests (paired signed-rank, unpaired rank-sum), Holm with the other tasks, and power in score units."""

from __future__ import annotations

import pytest

from pytest_hud.gate import GateConfig, TaskOutcomes, evaluate_gate, load_gate_file, metric_for


def outcomes(scores: dict[str, float], threshold: float = 0.95) -> TaskOutcomes:
    """Episodes with these scores; a success when the score reaches ``threshold`` (PushT's rule)."""
    return TaskOutcomes({e: s >= threshold for e, s in scores.items()}, declared=len(scores), scores=dict(scores),
                        episodes=frozenset(scores))


BASE = {str(i): 0.9 - 0.01 * (i % 5) for i in range(20)}  # no episode reaches 0.95: success is 0 of 20
WORSE = {e: s - 0.2 for e, s in BASE.items()}


def test_a_score_drop_that_success_cannot_see_is_a_regression_on_the_score():
    by_success = evaluate_gate({"t": outcomes(WORSE)}, {"t": outcomes(BASE)})[0]
    assert by_success.verdict != "regression" and by_success.test == "paired-mcnemar"
    (v,) = evaluate_gate({"t": outcomes(WORSE)}, {"t": outcomes(BASE)}, GateConfig(metrics={"t": "score"}))
    assert v.verdict == "regression" and v.test == "paired-signed-rank" and v.metric == "score"
    assert v.p_value == pytest.approx(0.5 ** 20) and v.drop == pytest.approx(0.2)
    assert v.current_score == pytest.approx(0.68) and v.baseline_score == pytest.approx(0.88)
    assert "mean score 0.680 vs baseline 0.880 (paired-signed-rank, drop 0.200" in v.reason


def test_the_same_scores_pass_when_a_drop_of_a_tenth_would_have_been_seen():
    spread = {e: s + (0.05 if int(e) % 2 else -0.05) for e, s in BASE.items()}
    (v,) = evaluate_gate({"t": outcomes(spread)}, {"t": outcomes(BASE)}, GateConfig(metrics={"t": "score"}))
    assert v.verdict == "pass" and "a mean score drop of 0.10 would have been caught" in v.reason


def test_too_few_episodes_to_see_a_tenth_is_inconclusive_with_the_episodes_needed():
    base = {str(i): 0.5 + 0.4 * (i % 2) for i in range(4)}
    cur = {e: s + (0.3 if int(e) < 2 else -0.3) for e, s in base.items()}
    (v,) = evaluate_gate({"t": outcomes(cur)}, {"t": outcomes(base)}, GateConfig(metrics={"t": "score"}))
    assert v.verdict == "inconclusive" and v.more_episodes_needed and v.more_episodes_needed > 0
    assert "paired episodes per run" in v.reason


def test_other_episodes_are_compared_with_the_rank_sum_test_and_holm_spans_both_metrics():
    cur = {f"new{e}": s for e, s in WORSE.items()}
    current = {"t": outcomes(cur), "u": TaskOutcomes({str(i): True for i in range(10)}, declared=10)}
    baseline = {"t": outcomes(BASE), "u": TaskOutcomes({str(i): True for i in range(10)}, declared=10)}
    verdicts = {v.task: v for v in evaluate_gate(current, baseline, GateConfig(metrics={"t": "score"}))}
    t = verdicts["t"]
    assert t.test == "unpaired-rank-sum" and t.verdict == "regression"
    assert t.adjusted_p == pytest.approx(min(1.0, 2 * t.p_value))  # Holm over both tasks: t's p is the smaller


def test_the_gate_file_and_globs_name_the_metric():
    assert load_gate_file('tasks: {"evals/test_pusht.py::*": {metric: score}}')["metrics"] == {
        "evals/test_pusht.py::*": "score"}
    assert metric_for("evals/test_pusht.py::test_push[seed=1]", {"evals/test_pusht.py::*": "score"}) == "score"
    assert metric_for("other", {"evals/test_pusht.py::*": "score"}) == "success"
    with pytest.raises(ValueError, match="metric must be one of success, score"):
        load_gate_file("tasks: {t: {metric: coverage}}")


def test_a_sensitivity_table_on_the_score_uses_the_rank_tests_and_shows_the_mean_score():
    from pytest_hud.core.results import EpisodeRecord
    from pytest_hud.core.sensitivity import sensitivity_tables
    from pytest_hud.report.sensitivity import sensitivity_lines

    def rec(level, seed, score):
        return EpisodeRecord(task=f"t.py::t[p={level}]", episode=str(seed), nodeid=f"t.py::t[{level}-{seed}]",
                             outcome="failed", success=False, score=score,
                             axes={"p": {"level": level, "index": level != "none", "reference": "none",
                                         "task": "t.py::t"}})

    recs = [rec("none", s, 0.8 + 0.01 * s) for s in range(8)] + [rec("noise", s, 0.5 + 0.01 * s) for s in range(8)]
    (by_success,) = sensitivity_tables(recs)
    assert by_success.metric == "success" and by_success.rows[1].p_value == 1.0  # 0 of 8 succeed on both sides
    (table,) = sensitivity_tables(recs, score_tasks={r.task for r in recs})
    noise = table.rows[1]
    assert table.metric == "score" and noise.test == "paired-signed-rank" and noise.p_value == pytest.approx(1 / 256)
    assert noise.difference == pytest.approx(-0.3) and noise.mean_score == pytest.approx(0.535) and table.worse == ["noise"]
    lines = sensitivity_lines([table])
    assert "the score: one-sided exact rank tests" in lines[0] and lines[1].split()[7] == "score"
    assert lines[4].split()[7:9] == ["0.535", "-30.0"] and lines[4].endswith("WORSE")
