"""The CI gate: compare this run with a stored baseline, task by task, and give verdicts.

(Over 400 lines on purpose: every rule of the gate, stated at the top and implemented below, plus the gate file's parser with its error messages.)

Pure logic (no pytest, no I/O): the plugin turns results files into :class:`TaskOutcomes`, calls
:func:`evaluate_gate`, and sets the exit status from :func:`gate_passed`.

Rules, per task (a task is a test function plus its non-episode parameters):

1. **Coverage.** Errored episodes (crash, timeout, sim exception) are not failures, they are missing.
   When ``finished without error / declared < min_coverage`` the verdict is *insufficient coverage*:
   a policy that crashes on its hard episodes must not pass on its easy ones. A task that is in the
   baseline but not in this run gets the same verdict. This check wins over every other.
2. **Paired or unpaired.** Paired when the episode ids that finished on both sides are at least
   ``PAIRED_MIN_OVERLAP`` (80%) of each side's finished episodes; the few unmatched episodes are
   dropped. Pairing an episode with itself removes the seed-to-seed variance that usually dominates
   seeded sims; dropping a fifth of the data costs less than that gains. Otherwise all episodes of
   both sides are compared unpaired. The choice depends on ids only, never on outcomes, so it does
   not bias the test.
3. **The test.** Paired: exact McNemar on the discordant episodes. Unpaired: Boschloo's exact test
   (uniformly more powerful than Fisher's). With a tolerance ``max_drop > 0`` the null hypothesis
   becomes "the drop is at most max_drop" (exact unconditional score tests, Tango for paired,
   Farrington-Manning/Chan for unpaired), so a drop within the tolerance is never a regression; an
   observed drop at or below the tolerance is never flagged whatever the p-value.
4. **Holm** across all tasks that were compared with a baseline: a task is a *regression* when its
   Holm-adjusted p-value is <= alpha. The family-wise false-alarm rate of the gate is <= alpha.
5. **Inconclusive.** A comparison that is not significant only means "pass" if the test could have
   seen a drop that matters. The drop that matters is ``detect_drop`` (default: 10 points beyond
   ``max_drop``), capped at the baseline rate. If the minimum detectable drop at this n (at the
   Bonferroni level alpha/m, the strictest level Holm may apply, and ``power``) exceeds it, the
   verdict is *inconclusive*, with the episodes per run that would make it detectable.
6. **Floors** (``min_success`` from markers or the gate file): the task's success rate is compared
   with the floor using the (1 - alpha) Wilson interval, the one the summary table shows. Upper
   bound below the floor: *regression*. Point estimate below the floor but the interval reaches it:
   *inconclusive* (with the episodes that would settle it if the rate held). Otherwise the floor is
   met. Floors are absolute requirements declared per task, so they are not Holm-adjusted; using
   the two-sided interval makes each one a one-sided test at alpha/2, which keeps them from being
   trigger-happy.
7. **Combining:** insufficient coverage > regression > inconclusive > pass.
8. **Nothing to compare is never a pass.** A task with graded episodes in this run but none in the
   baseline (absent there, or only errors or skips) and no floor is *no baseline*; a task whose
   episodes were all skipped now and that had no graded episode in the baseline either is *skipped*,
   with the skip reason. Neither fails on its own (suites grow new tasks; optional stacks are skipped
   where absent), but a gate under which nothing at all was compared while something ran fails
   (:func:`gate_passed`): a baseline of another suite, or an empty one, must not pass silently.
9. **Dropping a task fails.** A task graded in the baseline that has no graded episode now
   (skipped, deselected with ``-k``/``-m``, or no longer collected) is *insufficient coverage*, and
   the reason says which of those happened.

:func:`gate_passed` fails on regression and insufficient coverage; inconclusive passes unless
``strict=True`` (failing CI for lack of episodes on every small suite would teach people to
ignore the gate).
"""

from __future__ import annotations

import difflib
import fnmatch
import math
import numbers
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from . import stats

__all__ = [
    "COMPARED",
    "PAIRED_MIN_OVERLAP",
    "VERDICTS",
    "GateConfig",
    "TaskOutcomes",
    "Verdict",
    "VerdictKind",
    "evaluate_gate",
    "floor_for",
    "gate_passed",
    "load_gate_file",
    "nothing_compared",
    "outcomes_from_records",
    "outcomes_from_results",
]

VerdictKind = Literal["pass", "regression", "inconclusive", "insufficient coverage", "no baseline", "skipped"]
TestName = Literal[
    "paired-mcnemar",
    "paired-noninferiority",
    "unpaired-boschloo",
    "unpaired-noninferiority",
    "floor",
    "coverage",
    "none",
]

PAIRED_MIN_OVERLAP = 0.8
"""Pair when the shared episode ids are at least this fraction of each side's finished episodes."""

_FAILING: frozenset[str] = frozenset({"regression", "insufficient coverage"})
#: Verdicts that come from a comparison (with a baseline or a floor).
COMPARED: frozenset[str] = frozenset({"pass", "regression", "inconclusive"})
#: Every verdict, in the order of severity used by the summaries.
VERDICTS: tuple[str, ...] = ("insufficient coverage", "regression", "inconclusive", "no baseline", "skipped", "pass")


@dataclass
class TaskOutcomes:
    """One task's finished episodes on one side of the comparison.

    ``successes`` maps episode id to success for episodes that finished without error; ``errors``
    counts the errored ones; ``declared`` is how many episodes the task declares (its parameters)
    less the skipped ones; ``skipped`` counts skipped episodes and ``skip_reason`` is one of their
    reasons (``skip``/``skipif``, or a sequential decision).
    """

    successes: dict[str, bool]
    errors: int = 0
    declared: int = 0
    skipped: int = 0
    skip_reason: str | None = None

    @property
    def n(self) -> int:
        """Episodes that finished without error."""
        return len(self.successes)

    @property
    def n_success(self) -> int:
        """Successful episodes."""
        return sum(1 for ok in self.successes.values() if ok)

    @property
    def all_skipped(self) -> bool:
        """Every episode of the task was skipped (none ran)."""
        return self.skipped > 0 and self.n == 0 and self.errors == 0

    @property
    def coverage(self) -> float:
        """Fraction of declared episodes that finished without error.

        When ``declared`` is unknown (0), finished + errored episodes stand in for it.
        """
        declared = self.declared if self.declared > 0 else self.n + self.errors
        return self.n / declared if declared > 0 else 0.0


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class GateConfig:
    """How strict the gate is. All rates and drops are absolute fractions (0.05 = 5 points).

    ``alpha``: family-wise false-alarm rate across tasks. ``max_drop``: drops up to this are
    tolerated. ``floors``: minimum success per task id or glob (exact ids win, then the first
    matching glob in insertion order). ``min_coverage``: fraction of declared episodes that must
    finish without error. ``power``/``detect_drop``: a non-significant task passes only when a drop
    of ``detect_drop`` (default ``max_drop + 0.10``) would have been flagged with this probability.
    """

    alpha: float = 0.05
    max_drop: float = 0.0
    floors: dict[str, float] = field(default_factory=dict)
    min_coverage: float = 0.9
    power: float = 0.8
    detect_drop: float | None = None

    def __post_init__(self) -> None:
        for name in ("alpha", "max_drop", "min_coverage", "power"):
            if not _is_number(getattr(self, name)):
                raise ValueError(f"{name} must be a number, got {getattr(self, name)!r}")
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha={self.alpha} must be strictly between 0 and 1 (e.g. 0.05)")
        if not 0.0 <= self.max_drop < 1.0:
            raise ValueError(f"max_drop={self.max_drop} must be in [0, 1) (e.g. 0.05 tolerates 5 points)")
        if not 0.0 <= self.min_coverage <= 1.0:
            raise ValueError(f"min_coverage={self.min_coverage} must be in [0, 1] (e.g. 0.9)")
        if not 0.0 < self.power < 1.0:
            raise ValueError(f"power={self.power} must be strictly between 0 and 1 (e.g. 0.8)")
        if self.detect_drop is not None:
            if not _is_number(self.detect_drop):
                raise ValueError(f"detect_drop must be a number, got {self.detect_drop!r}")
            if not self.max_drop < self.detect_drop < 1.0:
                raise ValueError(
                    f"detect_drop={self.detect_drop} must be above max_drop={self.max_drop} and below 1:"
                    " the gate cannot be asked to catch drops it tolerates"
                )
        for pattern, floor in self.floors.items():
            if not isinstance(pattern, str):
                raise ValueError(f"floor keys must be task ids or globs (strings), got {pattern!r}")
            if not _is_number(floor) or not 0.0 <= floor <= 1.0:
                raise ValueError(
                    f"floor for {pattern!r} is {floor!r}; min_success must be a number in [0, 1]"
                )

    @property
    def target_drop(self) -> float:
        """The drop a passing task must have been able to detect."""
        if self.detect_drop is not None:
            return self.detect_drop
        return min(0.99, self.max_drop + 0.10)


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


def floor_for(task: str, floors: Mapping[str, float]) -> float | None:
    """The floor that applies to ``task``: its exact id first, else the first glob that matches."""
    if task in floors:
        return float(floors[task])
    for pattern, floor in floors.items():
        if fnmatch.fnmatchcase(task, pattern):
            return float(floor)
    return None


# --------------------------------------------------------------------------------------------------
# evaluation
# --------------------------------------------------------------------------------------------------


@dataclass
class _Comparison:
    test: TestName
    p_value: float
    drop: float
    paired: bool
    n_pairs: int = 0
    worse: int = 0
    better: int = 0
    baseline_rate: float = 0.0  # the rate the power calculations start from
    discordance: float | None = None


def _compare(cur: TaskOutcomes, base: TaskOutcomes, max_drop: float) -> _Comparison:
    shared = cur.successes.keys() & base.successes.keys()
    paired = bool(shared) and len(shared) >= PAIRED_MIN_OVERLAP * max(cur.n, base.n)
    if paired:
        worse = sum(1 for e in shared if base.successes[e] and not cur.successes[e])
        better = sum(1 for e in shared if cur.successes[e] and not base.successes[e])
        n = len(shared)
        if max_drop > 0.0:
            test: TestName = "paired-noninferiority"
            p = stats.paired_noninferiority_exact(worse, better, n, max_drop)
        else:
            test = "paired-mcnemar"
            p = stats.mcnemar_exact_one_sided(worse, better)
        return _Comparison(
            test=test, p_value=p, drop=(worse - better) / n, paired=True, n_pairs=n, worse=worse,
            better=better, baseline_rate=sum(1 for e in shared if base.successes[e]) / n,
            discordance=(worse + better) / n,
        )
    s_new, s_base = cur.n_success, base.n_success
    if max_drop > 0.0:
        test = "unpaired-noninferiority"
        p = stats.unpaired_noninferiority_exact(s_new, cur.n, s_base, base.n, max_drop)
    else:
        test = "unpaired-boschloo"
        p = stats.boschloo_exact_one_sided(s_new, cur.n, s_base, base.n)
    return _Comparison(
        test=test, p_value=p, drop=s_base / base.n - s_new / cur.n, paired=False,
        baseline_rate=s_base / base.n,
    )


def _pct(x: float) -> str:
    return f"{100.0 * x:.1f}%"


def _pts(x: float) -> str:
    return f"{100.0 * x:.1f} points"


def _detection(
    comp: _Comparison, cur: TaskOutcomes, base: TaskOutcomes, config: GateConfig, level: float
) -> tuple[str, float | None, int | None, str]:
    """Could this comparison have seen a drop that matters? -> (state, mdd, more episodes, reason)."""
    target = min(config.target_drop, comp.baseline_rate)
    if target <= config.max_drop:
        return "pass", None, None, (
            f"baseline success {_pct(comp.baseline_rate)} leaves no drop beyond the tolerance to detect"
        )
    common: dict[str, Any] = dict(
        baseline_rate=comp.baseline_rate, paired=comp.paired, discordance=comp.discordance,
        alpha=level, power=config.power, max_drop=config.max_drop,
    )
    n = comp.n_pairs if comp.paired else cur.n
    mdd = stats.minimum_detectable_drop(n, n_baseline=None if comp.paired else base.n, **common)
    if mdd <= target:
        return "pass", mdd, None, (
            f"a drop of {_pts(target)} would have been caught with {config.power:.0%} power"
            f" (detectable from {_pts(mdd)})"
        )
    shown_mdd = "no drop" if math.isinf(mdd) else f"only drops of {_pts(mdd)} or more"
    if comp.paired:
        needed = stats.episodes_needed(target, **common)
        more = None if needed is None else max(1, needed - n)
        how = f"about {needed} paired episodes per run ({more} more on both sides)"
    else:
        needed = stats.episodes_needed(target, n_baseline=base.n, **common)
        if needed is not None:
            more = max(1, needed - cur.n)
            how = f"about {needed} episodes in this run ({more} more)"
        else:
            more = None
            both = stats.episodes_needed(target, n_baseline=None, **common)
            how = f"a larger baseline: about {both} episodes in each run"
    return "inconclusive", mdd, more, (
        f"not significant, but at this n {shown_mdd} would be caught with {config.power:.0%} power;"
        f" detecting {_pts(target)} needs {how}"
    )


def _floor_check(cur: TaskOutcomes, floor: float, alpha: float) -> tuple[str, int | None, str]:
    rate = cur.n_success / cur.n
    low, high = stats.wilson_interval(cur.n_success, cur.n, 1.0 - alpha)
    interval = f"{_pct(rate)} [{_pct(low)}, {_pct(high)}]"
    if rate >= floor:
        return "pass", None, f"success {interval} meets the floor {_pct(floor)}"
    if high < floor:
        return "regression", None, f"success {interval} is below the floor {_pct(floor)}"
    needed = stats.episodes_needed_for_floor(rate, floor, 1.0 - alpha)
    more = None if needed is None else max(1, needed - cur.n)
    return "inconclusive", more, (
        f"success {interval} is below the floor {_pct(floor)} but its interval reaches it"
        + ("" if more is None else f"; about {more} more episodes would settle it if the rate holds")
    )


def evaluate_gate(
    current: Mapping[str, TaskOutcomes],
    baseline: Mapping[str, TaskOutcomes] | None,
    config: GateConfig | None = None,
    *,
    deselected: Collection[str] = (),
) -> list[Verdict]:
    """One :class:`Verdict` per task of this run, then one per baseline task that did not run.

    ``deselected`` names the tasks this run deselected (``-k``/``-m``), so that a baseline task
    missing now is reported as deselected rather than as no longer collected. See the module
    docstring for the rules.

        >>> cur = {"t": TaskOutcomes({str(i): i >= 8 for i in range(10)}, declared=10)}
        >>> base = {"t": TaskOutcomes({str(i): True for i in range(10)}, declared=10)}
        >>> evaluate_gate(cur, base)[0].verdict    # 8 worse, 0 better: p = 2**-8
        'regression'
        >>> evaluate_gate(cur, {})[0].verdict      # nothing to compare with: never a pass
        'no baseline'
    """
    config = config or GateConfig()
    baseline = baseline or {}

    # First pass: every comparison's p-value, so Holm sees the whole family.
    comparisons: dict[str, _Comparison] = {}
    for task, cur in current.items():
        base = baseline.get(task)
        if base is not None and base.n > 0 and cur.n > 0:
            comparisons[task] = _compare(cur, base, config.max_drop)
    adjusted = stats.holm_adjusted({t: c.p_value for t, c in comparisons.items()})
    # The strictest level Holm can apply to one task; power is judged there (Bonferroni bound).
    level = config.alpha / max(1, len(comparisons))

    verdicts: list[Verdict] = []
    for task, cur in current.items():
        base = baseline.get(task)
        floor = floor_for(task, config.floors)
        v = Verdict(
            task=task, verdict="pass", floor=floor, n_current=cur.n, errors=cur.errors,
            declared=cur.declared, coverage=cur.coverage,
            n_baseline=base.n if base is not None else 0,
            baseline_rate=(base.n_success / base.n) if base is not None and base.n else None,
        )
        if cur.all_skipped:
            _skipped_now(v, cur, base)
            verdicts.append(v)
            continue
        if cur.n:
            v.current_rate = cur.n_success / cur.n
            v.current_interval = stats.wilson_interval(cur.n_success, cur.n, 1.0 - config.alpha)
        states: list[tuple[str, TestName, str]] = []  # (state, test, reason) of each check
        more: list[int] = []

        comp = comparisons.get(task)
        if comp is not None:
            v.test, v.p_value, v.adjusted_p, v.drop = comp.test, comp.p_value, adjusted[task], comp.drop
            if comp.paired:
                v.n_pairs, v.discordant = comp.n_pairs, (comp.worse, comp.better)
            summary = (
                f"{_pct(v.current_rate or 0.0)} vs baseline {_pct(v.baseline_rate or 0.0)}"
                f" ({comp.test}, drop {_pts(comp.drop)}, p={comp.p_value:.3g},"
                f" Holm-adjusted {adjusted[task]:.3g})"
            )
            if adjusted[task] <= config.alpha and comp.drop > config.max_drop:
                tolerance = f" beyond the tolerance of {_pts(config.max_drop)}" if config.max_drop else ""
                states.append(("regression", comp.test, f"dropped{tolerance}: {summary}"))
            else:
                assert base is not None  # a comparison exists only with a baseline
                state, v.min_detectable_drop, extra, why = _detection(comp, cur, base, config, level)
                if extra is not None:
                    more.append(extra)
                states.append((state, comp.test, f"{summary}; {why}"))

        if floor is not None and cur.n:
            state, extra, why = _floor_check(cur, floor, config.alpha)
            if extra is not None:
                more.append(extra)
            states.append((state, "floor", why))
        no_base = None if comp is not None else _no_baseline_reason(base, floor, have_baseline=bool(baseline))

        if cur.n == 0 or cur.coverage < config.min_coverage:
            v.verdict, v.test = "insufficient coverage", "coverage"
            detail = "; ".join(reason for _, _, reason in states)
            v.reason = (
                f"{cur.n} of {cur.declared or cur.n + cur.errors} declared episodes finished without error"
                f" ({cur.errors} errors), below the required {config.min_coverage:.0%}"
                + (f"; {detail}" if detail else "")
            )
        elif not states:
            v.verdict, v.test, v.reason = "no baseline", "none", str(no_base)
        else:
            for kind in ("regression", "inconclusive", "pass"):
                hits = [(test, reason) for state, test, reason in states if state == kind]
                if hits:
                    v.verdict = kind  # type: ignore[assignment]
                    v.test = hits[0][0]
                    # Lead with the reasons that decided, then mention the rest.
                    others = [reason for state, _, reason in states if state != kind]
                    v.reason = "; ".join([reason for _, reason in hits] + others + ([no_base] if no_base else []))
                    break
            if v.verdict == "inconclusive" and more:
                v.more_episodes_needed = max(more)
        verdicts.append(v)

    for task, base in baseline.items():
        if task in current:
            continue
        v = Verdict(
            task=task, verdict="insufficient coverage", test="coverage", n_baseline=base.n,
            baseline_rate=(base.n_success / base.n) if base.n else None,
            floor=floor_for(task, config.floors), coverage=0.0,
        )
        why = ("deselected in this run (-k/-m)" if task in deselected
               else "not collected in this run (renamed, removed, or its module skipped at import?)")
        if base.n:
            v.reason = f"graded in the baseline ({base.n} episodes) but not run now: {why}; a suite must not pass by dropping a task"
        else:
            v.verdict, v.test, v.coverage = "skipped", "none", None
            v.reason = f"not run now: {why}, and no graded episode in the baseline" + (
                f" (skipped there: {base.skip_reason})" if base.skip_reason else "")
        verdicts.append(v)
    return verdicts


def _skipped_now(v: Verdict, cur: TaskOutcomes, base: TaskOutcomes | None) -> None:
    """The verdict of a task whose every episode was skipped in this run."""
    reason = cur.skip_reason or "no reason given"
    v.coverage = None
    if base is not None and base.n:
        v.verdict, v.test = "insufficient coverage", "coverage"
        v.reason = (f"skipped in this run ({reason}) but graded in the baseline ({base.n} episodes):"
                    " a suite must not pass by dropping a task")
    else:
        v.verdict, v.test = "skipped", "none"
        v.reason = f"skipped ({reason})" + (" in both runs" if base is not None and base.all_skipped else "")


def _no_baseline_reason(base: TaskOutcomes | None, floor: float | None, *, have_baseline: bool) -> str:
    """Why a task that ran was not compared with a baseline."""
    if not have_baseline:
        return "no baseline" + ("" if floor is not None else " and no floor for this task")
    if base is None:
        return "not in the baseline (a new task?)"
    if base.all_skipped:
        return f"no baseline: skipped there ({base.skip_reason or 'no reason given'})"
    return f"no baseline: none of its {base.errors} baseline episodes finished without error"


# --------------------------------------------------------------------------------------------------
# gate file
# --------------------------------------------------------------------------------------------------

_TOP_KEYS = ("alpha", "max_drop", "min_coverage", "power", "detect_drop", "tasks")
_TASK_KEYS = ("min_success",)


def _did_you_mean(key: object, known: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(str(key), known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def load_gate_file(text: str, *, source: str = "gate file") -> dict[str, Any]:
    """Parse a YAML gate file into keyword arguments for :class:`GateConfig`.

    Example::

        alpha: 0.05
        max_drop: 0.05
        min_coverage: 0.9
        tasks:
          "evals/test_pusht.py::test_push": {min_success: 0.6}
          "evals/test_aloha.py::*": {min_success: 0.3}

    Returns only the keys the file sets, with ``tasks`` turned into ``floors`` (pattern -> floor), so
    the caller can lay it over options: ``GateConfig(**{**from_options, **load_gate_file(text)})``.
    Raises ``ValueError`` naming the offending key for unknown keys, wrong types and bad ranges.
    """
    import yaml  # only the gate file needs it

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{source} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(
            f"{source} must be a mapping of settings (alpha, max_drop, ...), got {type(data).__name__}"
        )
    unknown = [key for key in data if key not in _TOP_KEYS]
    if unknown:
        raise ValueError(
            f"{source}: unknown key {unknown[0]!r}{_did_you_mean(unknown[0], _TOP_KEYS)};"
            f" known keys are {', '.join(_TOP_KEYS)}"
        )
    out: dict[str, Any] = {}
    for key in _TOP_KEYS[:-1]:
        if key in data:
            value = data[key]
            if not _is_number(value):
                raise ValueError(f"{source}: {key} must be a number, got {type(value).__name__} {value!r}")
            out[key] = float(value)
    if "tasks" in data:
        tasks = data["tasks"]
        if not isinstance(tasks, dict):
            raise ValueError(
                f"{source}: tasks must map task ids or globs to settings, e.g."
                f" {{'evals/test_x.py::test_y': {{min_success: 0.6}}}}; got {type(tasks).__name__}"
            )
        floors: dict[str, float] = {}
        for pattern, settings in tasks.items():
            if not isinstance(pattern, str):
                raise ValueError(f"{source}: task key {pattern!r} must be a string (a task id or a glob)")
            if not isinstance(settings, dict):
                raise ValueError(
                    f"{source}: tasks[{pattern!r}] must be a mapping like {{min_success: 0.6}},"
                    f" got {type(settings).__name__} {settings!r}"
                )
            bad = [key for key in settings if key not in _TASK_KEYS]
            if bad:
                raise ValueError(
                    f"{source}: tasks[{pattern!r}]: unknown key {bad[0]!r}"
                    f"{_did_you_mean(bad[0], _TASK_KEYS)};"
                    f" known keys are {', '.join(_TASK_KEYS)}"
                )
            if "min_success" in settings:
                value = settings["min_success"]
                if not _is_number(value):
                    raise ValueError(
                        f"{source}: tasks[{pattern!r}].min_success must be a number,"
                        f" got {type(value).__name__} {value!r}"
                    )
                floors[pattern] = float(value)
        out["floors"] = floors
    try:
        GateConfig(**out)  # one place for the range rules
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    return out


def outcomes_from_records(records: Iterable[Any], declared: Mapping[str, int] | None = None) -> dict[str, TaskOutcomes]:
    """The gate's view of episode records (anything with task, episode, outcome, success).

    Only the last record of each (task, episode) counts (reruns and resumes append). Errored
    episodes are left out of the success map and counted as errors; skipped episodes (a task that
    sequential mode decided early) count as neither and are not expected in ``declared`` either.
    """
    latest: dict[tuple[str, str], Any] = {}
    for rec in records:
        latest[(rec.task, str(rec.episode))] = rec
    out: dict[str, TaskOutcomes] = {task: TaskOutcomes({}, 0, int(n)) for task, n in (declared or {}).items()}
    for (task, episode), rec in latest.items():
        outcomes = out.setdefault(task, TaskOutcomes({}, 0, 0))
        if rec.outcome == "error":
            outcomes.errors += 1
        elif rec.outcome == "skipped":
            outcomes.skipped += 1
            outcomes.skip_reason = outcomes.skip_reason or getattr(rec, "skip_reason", None)
        elif rec.outcome in ("passed", "failed") and rec.success is not None:
            outcomes.successes[episode] = bool(rec.success)
    for outcomes in out.values():
        outcomes.declared = max(outcomes.declared, outcomes.n + outcomes.errors + outcomes.skipped)
        outcomes.declared -= outcomes.skipped
    return out


def outcomes_from_results(results: Any) -> dict[str, TaskOutcomes]:
    """The gate's view of a loaded results file (a :class:`pytest_hud.results.Results`)."""
    declared = {task: summary.declared for task, summary in results.tasks().items()}
    return outcomes_from_records(results.latest_episodes(), declared)
