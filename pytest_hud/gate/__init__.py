"""The CI gate: compare this run with a stored baseline, task by task, and give verdicts.

Pure logic (no pytest, no I/O), cut by concern: :mod:`.config` (how strict the gate is, the YAML
gate file, floors), :mod:`.outcomes` (each task's episodes on one side, from records or a results
file), :mod:`.verdict` (a task's verdict and whether the run passes), :mod:`.scores` (the comparison of
a task gated on its score) and :mod:`.evaluation` (the
gate's rules, stated at its top, and :func:`evaluate_gate`). Every name the rest of the project
uses is importable from here. Imports nothing of the project but :mod:`pytest_hud.stats`, and that
(with numpy) only once :func:`evaluate_gate` is first asked for: the controller reads its gate
settings at start-up, before pytest starts the workers, and evaluates the gate at the end.
"""

from __future__ import annotations

from pytest_hud.gate.config import (
    METRICS, GateConfig, floor_for, floors_problem, load_gate_file, metric_for, unmatched_floors,
)
from pytest_hud.gate.outcomes import (
    SEQUENTIAL_SKIP, TASK_FIELDS, TaskOutcomes, outcomes_from_records, outcomes_from_results,
)
from pytest_hud.gate.verdict import COMPARED, VERDICTS, Verdict, VerdictKind, gate_passed, nothing_compared

__all__ = [
    "COMPARED",
    "METRICS",
    "PAIRED_MIN_OVERLAP",
    "SEQUENTIAL_SKIP",
    "TASK_FIELDS",
    "VERDICTS",
    "GateConfig",
    "TaskOutcomes",
    "Verdict",
    "VerdictKind",
    "evaluate_gate",
    "floor_for",
    "gate_passed",
    "load_gate_file",
    "metric_for",
    "nothing_compared",
    "outcomes_from_records",
    "outcomes_from_results",
    "floors_problem",
    "unmatched_floors",
]


def __getattr__(name: str) -> object:
    """:mod:`.evaluation`'s names on first use (it imports the statistics, and with them numpy)."""
    if name in ("PAIRED_MIN_OVERLAP", "evaluate_gate"):
        from pytest_hud.gate import evaluation

        return getattr(evaluation, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
