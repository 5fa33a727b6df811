"""The statistics of a series of runs: changes by the gate's tests with Holm over the series, and a
best run named only as far as a comparison with every other run supports it."""

from __future__ import annotations

from pytest_hud.gate import TaskOutcomes
from pytest_hud.report.history import Run, _split_param, build_history, history_markdown


def outcomes(successes: int, n: int = 40, offset: int = 0) -> TaskOutcomes:
    return TaskOutcomes({str(i + offset): i < successes for i in range(n)}, declared=n)


def test_a_change_that_one_test_would_flag_is_not_marked_when_the_series_is_long():
    # 30 -> 22 of 40 paired: McNemar p = 0.0039 alone, but one of 2 x 2 x 20 = 80 tests here.
    runs = [Run(f"r{i}", {f"t{k}": outcomes(30 if i == 0 or k else 22) for k in range(20)}) for i in range(3)]
    history = build_history(runs)
    change = next(c for c in history.changes if c.task == "t0" and c.direction == "down")
    assert change.test == "paired-mcnemar" and change.p < 0.005 and not change.significant
    assert change.p_holm > 0.05 and history.significant() == []
    alone = build_history([Run("a", {"t0": outcomes(30)}), Run("b", {"t0": outcomes(22)})])
    assert [c.direction for c in alone.significant()] == ["down"]


def test_other_episode_ids_are_compared_unpaired_by_boschloo():
    history = build_history([Run("a", {"t": outcomes(5)}), Run("b", {"t": outcomes(35, offset=100)})])
    (up,) = history.significant()
    assert up.direction == "up" and up.test == "boschloo"


def test_a_best_run_not_clearly_ahead_is_named_with_the_runs_it_cannot_be_told_from():
    history = build_history([Run("a", {"t": outcomes(20)}), Run("b", {"t": outcomes(34)}),
                             Run("c", {"t": outcomes(33)})])
    assert history.runs[history.best].label == "b"
    assert "b is significantly better than a; it is not distinguishable from c (adjusted p=1)" in history.best_statement
    assert "6 one-sided exact tests" in history.best_statement
    assert "**" not in history_markdown(history) and "| t | 50% (20/40) | 85% (34/40) ▲ | 82% (33/40) |" in (
        history_markdown(history).replace("`", ""))


def test_a_sweep_parameter_is_taken_out_of_the_task_id():
    assert _split_param("t.py::test_x[checkpoint=step_9,task=push]", "checkpoint") == ("step_9", "t.py::test_x[task=push]")
    assert _split_param("t.py::test_x[checkpoint=a]", "checkpoint") == ("a", "t.py::test_x")
    assert _split_param("t.py::test_x[task=push]", "checkpoint") == (None, "t.py::test_x[task=push]")
