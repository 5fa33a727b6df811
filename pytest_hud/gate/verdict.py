"""The gate's answers: one :class:`Verdict` per task, and whether the run passes (:func:`gate_passed`).

Pure logic (no pytest, no I/O): the verdict kinds in their order of severity, the record of one
task's verdict with the numbers behind it (builtin types only once :meth:`Verdict.to_dict` has run,
so it crosses the xdist channel and goes into the results file), and the run-level rules: which
verdicts fail the gate, and why a gate that compared nothing is never a pass.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = [
    "COMPARED",
    "VERDICTS",
    "TestName",
    "Verdict",
    "VerdictKind",
    "gate_passed",
    "nothing_compared",
]

VerdictKind = Literal["pass", "regression", "inconclusive", "insufficient coverage", "incomparable", "no baseline",
                      "skipped"]
TestName = Literal[
    "paired-mcnemar",
    "paired-noninferiority",
    "unpaired-boschloo",
    "unpaired-noninferiority",
    "paired-signed-rank",
    "unpaired-rank-sum",
    "floor",
    "coverage",
    "identity",
    "none",
]

_FAILING: frozenset[str] = frozenset({"regression", "insufficient coverage", "incomparable"})
#: Verdicts that come from a comparison (with a baseline or a floor).
COMPARED: frozenset[str] = frozenset({"pass", "regression", "inconclusive"})
#: Every verdict, in the order of severity used by the summaries.
VERDICTS: tuple[str, ...] = ("incomparable", "insufficient coverage", "regression", "inconclusive", "no baseline",
                             "skipped", "pass")


@dataclass
class Verdict:
    """The gate's answer for one task, with the numbers behind it.

    ``drop`` is the estimate the test used (paired: over the shared episodes); rates are over each
    side's finished episodes. ``discordant`` is (worse, better) for paired comparisons.
    ``more_episodes_needed`` is per run (paired: on both sides).
    """

    task: str
    verdict: VerdictKind
    test: TestName = "none"
    p_value: float | None = None
    adjusted_p: float | None = None
    current_rate: float | None = None
    baseline_rate: float | None = None
    n_current: int = 0
    n_baseline: int = 0
    n_pairs: int = 0
    discordant: tuple[int, int] | None = None
    drop: float | None = None
    min_detectable_drop: float | None = None
    more_episodes_needed: int | None = None
    floor: float | None = None
    reason: str = ""
    errors: int = 0
    declared: int = 0
    coverage: float | None = None
    current_interval: tuple[float, float] | None = None
    not_graded: dict[str, list[str]] = field(default_factory=dict)  # why -> episode ids counted but not graded now
    policy: str | None = None
    baseline_policy: str | None = None
    metric: str = "success"  # what was compared: test outcomes, or the sim's graded score
    current_score: float | None = None  # mean score (paired: over the shared episodes), score metric only
    baseline_score: float | None = None

    @property
    def failed(self) -> bool:
        """Whether this verdict fails the gate (regression or insufficient coverage)."""
        return self.verdict in _FAILING

    def to_dict(self) -> dict[str, Any]:
        """Builtin types only (JSON- and xdist-safe): tuples become lists, non-finite floats None."""
        out: dict[str, Any] = {}
        for key, value in asdict(self).items():
            if isinstance(value, tuple):
                value = [_builtin(v) for v in value]
            out[key] = _builtin(value)
        return out


def _builtin(value: Any) -> Any:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        value = float(value)
        return value if math.isfinite(value) else None
    return value


def gate_passed(verdicts: Iterable[Verdict], *, strict: bool = False) -> bool:
    """True unless a task regressed or lacks coverage (or, with ``strict``, is inconclusive).

    Also False when episodes were graded (some task is *no baseline*) but not one task was compared:
    the gate never passes a run it did not compare with anything.
    """
    verdicts = list(verdicts)
    failing = _FAILING | ({"inconclusive"} if strict else set())
    if any(v.verdict in failing for v in verdicts):
        return False
    return nothing_compared(verdicts) is None


def nothing_compared(verdicts: Iterable[Verdict]) -> str | None:
    """Why the gate compared nothing although episodes were graded (None when something was compared)."""
    verdicts = list(verdicts)
    if any(v.verdict in COMPARED for v in verdicts) or not any(v.verdict == "no baseline" for v in verdicts):
        return None
    return ("nothing was compared: no task that ran has graded episodes in the baseline or a floor"
            " (is the baseline from another suite, or empty?)")
