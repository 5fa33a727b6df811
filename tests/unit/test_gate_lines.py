"""The gate's lines for people: tasks that pass without a baseline for one reason are one line."""

from pytest_hud.gate.verdict import Verdict
from pytest_hud.report.table import gate_lines

REASON = "no baseline and no floor for this task"


def levels(n: int) -> list[Verdict]:
    return [Verdict(task=f"r.py::test_axis[level={i}]", verdict="no baseline", reason=REASON) for i in range(n)]


def test_many_tasks_without_a_baseline_are_one_line_by_test_function():
    verdicts = levels(14) + [Verdict(task="p.py::test_push", verdict="no baseline", reason=REASON),
                             Verdict(task="c.py::test_balance", verdict="pass")]
    lines = gate_lines(verdicts)
    assert lines == [(f"gate: NO BASELINE for 15 tasks ({REASON}): r.py::test_axis (14 tasks), p.py::test_push", False)]


def test_a_few_tasks_without_a_baseline_keep_a_line_each():
    lines = gate_lines(levels(3) + [Verdict(task="c.py::test_balance", verdict="pass")])
    assert [text for text, _ in lines] == [f"gate: NO BASELINE r.py::test_axis[level={i}]: {REASON}" for i in range(3)]


def test_failing_verdicts_are_never_folded():
    verdicts = levels(5) + [Verdict(task="x.py::test_x", verdict="regression", reason="worse")]
    lines = gate_lines(verdicts, strict=True)  # strict: a task without a baseline fails the gate too
    assert sum(text.startswith("gate: NO BASELINE r.py") for text, _ in lines) == 5
    assert ("gate: REGRESSION x.py::test_x: worse", True) in lines
