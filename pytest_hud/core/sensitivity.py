"""The sensitivity table: success per level of a robustness axis, each level tested against the reference.

Pure (no pytest, no I/O). An *axis* is a test parameter whose values are perturbation levels
(``@pytest.mark.hud_axis("perturbation", reference="none")``, or ``--hud-axis perturbation=none``);
each episode record of such a test carries, under ``axes``, its level, the level's position in the
parameter's list, the reference level when one was named, and its task *without* the axis (the
unit that pairs episodes across levels: the same task, the same episode id, another level)::

    {"perturbation": {"level": "obs_noise_0.05", "index": 2, "reference": "none",
                      "task": "evals/test_meta_world_robustness.py::test_mt10[task=push-v3]"}}

:func:`sensitivity_tables` groups the records by axis: one table per axis pooled over every task
that has it, and optionally one per task. A row per level: graded episodes, successes, the rate and
its 95% Wilson interval (over all its graded episodes), errors, the difference from the reference on
what the test compared (the shared pairs when paired), and the exact one-sided
test of :func:`pytest_hud.stats.compare_levels` (paired McNemar within each task when the levels ran
the same episodes; otherwise, and always for an axis marked ``paired=False``, whose records say
``"paired": false``, Boschloo's test for one task and the exact test stratified by task for several),
Holm-adjusted over the table's levels, with a flag for the levels significantly worse.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from pytest_hud.core.results import EpisodeRecord, to_builtin
from pytest_hud.stats import compare_level_scores, compare_levels, wilson_interval

__all__ = ["LevelRow", "SensitivityTable", "sensitivity_tables"]

POOLED = "pooled"


@dataclass
class LevelRow:
    """One level of an axis: its counts, and its test against the reference (None on the reference row)."""

    level: str
    is_reference: bool
    n: int  # graded episodes (passed + failed)
    successes: int
    errors: int
    rate: float | None
    ci_low: float
    ci_high: float
    # this level's rate minus the reference's on what the test compared (paired: the shared pairs;
    # negative: worse); ``rate`` is over all of the level's graded episodes
    difference: float | None = None
    test: str | None = None
    p_value: float | None = None
    adjusted_p: float | None = None
    significantly_worse: bool = False
    n_pairs: int = 0
    low_coverage: bool = False  # graded / (graded + errors) under the table's min_coverage
    mean_score: float | None = None  # the mean graded score (a table on the score metric)

    @property
    def coverage(self) -> float | None:
        """Graded episodes of this level's graded and errored ones (None when it has neither)."""
        return self.n / (self.n + self.errors) if self.n + self.errors else None

    def status(self, reference_low: bool = False) -> str:
        """``ref``, ``worse``, ``low coverage`` (not judged: never "not worse"), ``not worse`` or ``untested``."""
        if self.is_reference:
            return "ref"
        if self.significantly_worse:
            return "worse"
        if self.low_coverage or reference_low:
            return "low coverage"
        return "untested" if self.p_value is None else "not worse"


@dataclass
class SensitivityTable:
    """One axis's levels, pooled over its tasks (``scope="pooled"``) or for one task (``scope`` = its id)."""

    axis: str
    reference: str | None
    scope: str
    tasks: list[str]
    alpha: float
    rows: list[LevelRow] = field(default_factory=list)
    problem: str | None = None  # why the levels could not be tested (no graded reference episode)
    min_coverage: float = 0.0
    metric: str = "success"  # or "score": the levels' graded scores, compared with rank tests

    @property
    def exploratory(self) -> bool:
        """A per-task table: Holm within its own levels only, no error control across tasks or axes."""
        return self.scope != POOLED

    @property
    def reference_low(self) -> bool:
        """The reference lost too many episodes to errors: no level can be called not worse."""
        return any(r.is_reference and r.low_coverage for r in self.rows)

    @property
    def low_coverage(self) -> list[str]:
        """The levels (the reference included) whose graded episodes are under ``min_coverage``."""
        return [r.level for r in self.rows if r.low_coverage]

    @property
    def worse(self) -> list[str]:
        """The levels significantly worse than the reference (Holm over this table's levels)."""
        return [r.level for r in self.rows if r.significantly_worse]

    def to_dict(self) -> dict[str, Any]:
        rows = [dict(row, coverage=r.coverage, status=r.status(self.reference_low))
                for row, r in zip(asdict(self)["rows"], self.rows, strict=True)]
        return to_builtin(dict(asdict(self), rows=rows, worse=self.worse, low_coverage=self.low_coverage,
                               family="exploratory" if self.exploratory else "axis"))


def _task_of(key: tuple[str, str]) -> str:
    """An episode key's stratum: its task (the pooled table's unpaired levels are tested within tasks)."""
    return key[0]


def _axis_entries(records: Iterable[EpisodeRecord]) -> dict[str, list[tuple[EpisodeRecord, dict[str, Any]]]]:
    by_axis: dict[str, list[tuple[EpisodeRecord, dict[str, Any]]]] = {}
    for rec in records:
        for axis, entry in (getattr(rec, "axes", None) or {}).items():
            if isinstance(entry, dict) and "level" in entry:
                by_axis.setdefault(str(axis), []).append((rec, entry))
    return by_axis


def _reference(axis: str, entries: list[tuple[EpisodeRecord, dict[str, Any]]]) -> tuple[str | None, str | None]:
    """The reference level (named, else the parameter's first value) and a problem, if any."""
    named = sorted({str(e["reference"]) for _, e in entries if e.get("reference") is not None})
    if len(named) > 1:
        return None, (f"axis {axis!r} has several reference levels ({', '.join(map(repr, named))}): give every "
                      f"test of the axis the same reference, or name the axes apart")
    if named:
        return named[0], None
    first = min(entries, key=lambda pair: (pair[1].get("index") is None, pair[1].get("index") or 0))
    return str(first[1]["level"]), None


def _table(axis: str, reference: str | None, scope: str, entries: list[tuple[EpisodeRecord, dict[str, Any]]],
           alpha: float, problem: str | None, min_coverage: float, metric: str = "success") -> SensitivityTable:
    order: dict[str, tuple[int, int]] = {}
    graded: dict[str, dict[tuple[str, str], bool]] = {}
    scored: dict[str, dict[tuple[str, str], float]] = {}
    errors: dict[str, int] = {}
    for seen, (rec, entry) in enumerate(entries):
        level = str(entry["level"])
        index = entry.get("index")
        order[level] = min(order.get(level, (1 << 30, seen)), (index if isinstance(index, int) else 1 << 30, seen))
        graded.setdefault(level, {})
        errors.setdefault(level, 0)
        if rec.outcome in ("passed", "failed") and rec.success is not None:
            key = (str(entry.get("task", rec.task)), str(rec.episode))
            graded[level][key] = bool(rec.success)
            if rec.score is not None:
                scored.setdefault(level, {})[key] = float(rec.score)
        elif rec.outcome == "error":
            errors[level] += 1
    levels = sorted(order, key=lambda lv: (lv != reference, order[lv]))
    tasks = sorted({str(e.get("task", r.task)) for r, e in entries})
    table = SensitivityTable(axis, reference, scope, tasks, alpha, problem=problem, min_coverage=min_coverage,
                             metric=metric)
    if problem is None and reference not in order:
        table.problem = (f"the reference level {reference!r} of axis {axis!r} has no episodes"
                         + ("" if scope == POOLED else f" in {scope}") + ": the levels are not tested")
    elif problem is None and not graded[reference]:
        table.problem = f"the reference level {reference!r} of axis {axis!r} has no graded episode: the levels are not tested"
    # an axis whose levels do not share initial states by seed (hud_axis(..., paired=False))
    paired = all(entry.get("paired", True) for _, entry in entries)
    if table.problem:
        tests = {}
    elif metric == "score":
        tests = compare_level_scores(scored.get(reference or "", {}),
                                     {lv: scored.get(lv, {}) for lv in levels if lv != reference}, alpha,
                                     paired=paired, stratum=_task_of)
    else:
        tests = compare_levels(graded[reference], {lv: graded[lv] for lv in levels if lv != reference}, alpha,
                               paired=paired, stratum=_task_of)
    for level in levels:
        outcomes = graded[level]
        n, s = len(outcomes), sum(outcomes.values())
        low, high = wilson_interval(s, n)
        rate = s / n if n else None
        row = LevelRow(level, level == reference, n, s, errors[level], rate, low, high)
        row.low_coverage = n + errors[level] > 0 and n < min_coverage * (n + errors[level])
        if scored.get(level):
            row.mean_score = sum(scored[level].values()) / len(scored[level])
        t = tests.get(level)
        if t is not None:
            row.difference = None if t.drop is None else -t.drop  # on what the test compared
            row.test, row.p_value, row.adjusted_p = t.test, t.p_value, t.adjusted_p
            row.significantly_worse, row.n_pairs = t.significantly_worse, t.n_pairs
        table.rows.append(row)
    return table


def sensitivity_tables(records: Iterable[EpisodeRecord], alpha: float = 0.05,
                       per_task: bool = False, min_coverage: float = 0.9,
                       score_tasks: Collection[str] = ()) -> list[SensitivityTable]:
    """One table per axis pooled over its tasks, then (``per_task``) one per task of each axis.

    Records without ``axes`` are ignored, so a run without axes gets no table. A family for Holm is
    one table. The pooled table of an axis is its family-wise verdict: the chance that it flags any
    level although none is worse is at most ``alpha`` (per axis: k axes, k families). The per-task
    tables are *exploratory*: each is adjusted over its own levels only, so with many tasks some
    table flags a level by chance; every output labels them so. A level whose
    graded episodes are under ``min_coverage`` of its graded and errored ones (the gate's coverage
    rule, ``--hud-min-coverage``) is marked *low coverage*: errors are dropped from both sides of a
    test, which is sound only when an error is unrelated to the outcome it replaced, so such a level
    is never called "not worse" (nor is any level when the reference itself is under it).
    ``score_tasks``: the task ids gated on their score (``hud(metric="score")``); an axis whose
    every episode is of one is tabled on the score (the gate's rank tests, the mean score per level).
    """
    if not 0.0 <= min_coverage <= 1.0:
        raise ValueError(f"min_coverage={min_coverage} must be in [0, 1] (e.g. 0.9)")
    out: list[SensitivityTable] = []
    for axis, entries in sorted(_axis_entries(records).items()):
        reference, problem = _reference(axis, entries)
        metric = "score" if score_tasks and all(r.task in score_tasks for r, _ in entries) else "success"
        out.append(_table(axis, reference, POOLED, entries, alpha, problem, min_coverage, metric))
        tasks = sorted({str(e.get("task", r.task)) for r, e in entries})
        if per_task and len(tasks) > 1:
            for task in tasks:
                mine = [(r, e) for r, e in entries if str(e.get("task", r.task)) == task]
                out.append(_table(axis, reference, task, mine, alpha, problem, min_coverage, metric))
    return out

