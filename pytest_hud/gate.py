"""The CI gate: compare this run with a stored baseline, task by task, and give verdicts.

(Over 500 lines on purpose: every rule of the gate, stated at the top and implemented below, plus the gate file's parser with its error messages.)

Pure logic (no pytest, no I/O): the plugin turns results files into :class:`TaskOutcomes`, calls
:func:`evaluate_gate`, and sets the exit status from :func:`gate_passed`.

Rules, per task (a task is a test function plus its non-episode parameters):

0. **Identity.** Episodes are compared only when what defines the task is the same on both sides:
   the sim target and its build arguments, the step limit, the contract (observation and action
   spaces) and the action chunking (:data:`TASK_FIELDS`, from each episode record's identity and
   contract). A field that
   differs makes the task *incomparable*, naming the field and both values, unless the user accepts
   that difference by name (``--hud-accept-difference``). The policy and its content hash differ by
   design: they are shown, never checked. A field that only one side recorded (a file written
   before it was recorded) is not checked. This verdict wins over every other.
1. **Coverage, episode by episode.** The episodes that count are the ones this run declared (after
   ``-k``/``-m``, less those skipped now) together with every episode the baseline ran (declared
   there, less those skipped there). Each of them that is not graded now is missing, whatever the
   reason, and is named with it: errored (crash, timeout, sim exception), skipped now, deselected,
   declared but never reported (an interrupted run), or not collected now. When ``graded /
   counted < min_coverage`` the verdict is *insufficient coverage*: a policy that crashes on its
   hard episodes must not pass on its easy ones. An episode the baseline graded that this run left
   out on purpose (deselected with ``-k``/``-m``, or skipped) makes the verdict *insufficient
   coverage* whatever the fraction: ``-k`` on the failing seeds must not turn a regression into a
   pass. Baseline episodes no longer collected (the suite's parameters changed) count against
   the fraction, and only when the two sides share episode ids: a task whose episodes are all new
   ids is a fresh sample, compared unpaired. A task that is in the baseline but not in this run
   gets the same verdict. Episodes a sequential decision skipped are not expected, and neither
   are another shard's.
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
7. **Combining:** incomparable > insufficient coverage > regression > inconclusive > pass.
8. **Nothing to compare is never a pass.** A task with graded episodes in this run but none in the
   baseline (absent there, or only errors or skips) and no floor is *no baseline*; a task whose
   episodes were all skipped now and that had no graded episode in the baseline either is *skipped*,
   with the skip reason. Neither fails on its own (suites grow new tasks; optional stacks are skipped
   where absent), but a gate under which nothing at all was compared while something ran fails
   (:func:`gate_passed`): a baseline of another suite, or an empty one, must not pass silently.
9. **Dropping a task fails.** A task graded in the baseline that has no graded episode now
   (skipped, deselected with ``-k``/``-m``, or no longer collected) is *insufficient coverage*, and
   the reason says which of those happened.

:func:`gate_passed` fails on incomparable, regression and insufficient coverage; inconclusive
passes unless ``strict=True`` (failing CI for lack of episodes on every small suite would teach
people to ignore the gate).
"""

from __future__ import annotations

import difflib
import fnmatch
import math
import numbers
from collections.abc import Collection, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from pytest_hud import stats

__all__ = [
    "COMPARED",
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
    "nothing_compared",
    "outcomes_from_records",
    "outcomes_from_results",
    "floors_problem",
    "unmatched_floors",
]

VerdictKind = Literal["pass", "regression", "inconclusive", "insufficient coverage", "incomparable", "no baseline",
                      "skipped"]
TestName = Literal[
    "paired-mcnemar",
    "paired-noninferiority",
    "unpaired-boschloo",
    "unpaired-noninferiority",
    "floor",
    "coverage",
    "identity",
    "none",
]

PAIRED_MIN_OVERLAP = 0.8
"""Pair when the shared episode ids are at least this fraction of each side's finished episodes."""

_FAILING: frozenset[str] = frozenset({"regression", "insufficient coverage", "incomparable"})
#: Verdicts that come from a comparison (with a baseline or a floor).
COMPARED: frozenset[str] = frozenset({"pass", "regression", "inconclusive"})
#: Every verdict, in the order of severity used by the summaries.
VERDICTS: tuple[str, ...] = ("incomparable", "insufficient coverage", "regression", "inconclusive", "no baseline",
                             "skipped", "pass")

#: What defines a task, from each episode record's ``identity``: equal on both sides, or incomparable.
TASK_FIELDS: tuple[str, ...] = ("sim", "build", "max_steps", "contract", "n_action_steps")

#: How a worker's skip reason starts when the sequential test had already decided the task.
SEQUENTIAL_SKIP = "sequential gate already decided"


@dataclass
class TaskOutcomes:
    """One task's episodes on one side of the comparison.

    ``successes`` maps episode id to success for episodes that finished without error; ``errors``
    counts the errored ones; ``declared`` is how many episodes the task declares (its parameters)
    less the skipped ones; ``skipped`` counts skipped episodes and ``skip_reason`` is one of their
    reasons (``skip``/``skipif``, or a sequential decision).

    The episode-level accounting (empty or None where unknown, e.g. for outcomes built by hand):
    ``episodes`` the ids the run declared for the task (after ``-k``/``-m``; None: unknown, the
    records stand in); ``errored`` the errored ids; ``skipped_ids`` each skipped id with its reason;
    ``decided`` the ids a sequential decision skipped; ``deselected`` the ids ``-k``/``-m`` left out;
    ``identity`` each of :data:`TASK_FIELDS` with the values its records carry (canonical JSON);
    ``policies`` the policies (with content hashes) that ran it.
    """

    successes: dict[str, bool]
    errors: int = 0
    declared: int = 0
    skipped: int = 0
    skip_reason: str | None = None
    episodes: frozenset[str] | None = None
    errored: frozenset[str] = frozenset()
    skipped_ids: dict[str, str | None] = field(default_factory=dict)
    decided: frozenset[str] = frozenset()
    deselected: frozenset[str] = frozenset()
    identity: dict[str, frozenset[str]] = field(default_factory=dict)
    policies: frozenset[str] = frozenset()

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

    def ran(self) -> set[str]:
        """The ids this side meant to run: declared (or, unknown, reported), less the skipped ones."""
        if self.episodes is not None:
            ids = set(self.episodes)
        else:
            ids = set(self.successes) | set(self.errored) | set(self.skipped_ids) | set(self.decided)
        return ids - set(self.skipped_ids) - set(self.decided)


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
    ``accept``: fields of :data:`TASK_FIELDS` whose difference from the baseline is accepted on
    purpose (the task is compared anyway).
    """

    alpha: float = 0.05
    max_drop: float = 0.0
    floors: dict[str, float] = field(default_factory=dict)
    min_coverage: float = 0.9
    power: float = 0.8
    detect_drop: float | None = None
    accept: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.accept = tuple(self.accept)
        for name in self.accept:
            if name not in TASK_FIELDS:
                raise ValueError(
                    f"cannot accept a difference in {name!r}{_did_you_mean(name, TASK_FIELDS)}: the fields that"
                    f" define a task are {', '.join(TASK_FIELDS)}"
                )
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
    not_graded: dict[str, list[str]] = field(default_factory=dict)  # why -> episode ids counted but not graded now
    policy: str | None = None
    baseline_policy: str | None = None

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

    # Identity first: a task that is not the same task on both sides is never compared.
    mismatches: dict[str, str] = {}
    for task, cur in current.items():
        base = baseline.get(task)
        if base is not None:
            why = _identity_mismatch(cur, base, config.accept)
            if why:
                mismatches[task] = why

    # Then every comparison's p-value, so Holm sees the whole family.
    comparisons: dict[str, _Comparison] = {}
    for task, cur in current.items():
        base = baseline.get(task)
        if base is not None and base.n > 0 and cur.n > 0 and task not in mismatches:
            comparisons[task] = _compare(cur, base, config.max_drop)
    adjusted = stats.holm_adjusted({t: c.p_value for t, c in comparisons.items()})
    # The strictest level Holm can apply to one task; power is judged there (Bonferroni bound).
    level = config.alpha / max(1, len(comparisons))

    verdicts: list[Verdict] = []
    for task, cur in current.items():
        base = baseline.get(task)
        floor = floor_for(task, config.floors)
        counted, not_graded, dropped = _accounting(cur, base)
        v = Verdict(
            task=task, verdict="pass", floor=floor, n_current=cur.n, errors=cur.errors,
            declared=counted, coverage=cur.n / counted if counted else 0.0,
            n_baseline=base.n if base is not None else 0,
            baseline_rate=(base.n_success / base.n) if base is not None and base.n else None,
            not_graded=not_graded, policy=_policy_text(cur), baseline_policy=_policy_text(base),
        )
        if task in mismatches:
            v.verdict, v.test = "incomparable", "identity"
            v.reason = mismatches[task]
            verdicts.append(v)
            continue
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
        missing = _named(not_graded)

        if cur.n == 0 or (v.coverage or 0.0) < config.min_coverage or dropped:
            v.verdict, v.test = "insufficient coverage", "coverage"
            detail = "; ".join(reason for _, _, reason in states)
            if dropped:
                head = (f"{len(dropped)} episode{'s' if len(dropped) != 1 else ''} graded in the baseline"
                        f" {'were' if len(dropped) != 1 else 'was'} left out of this run; a suite must not pass"
                        " by dropping episodes")
            else:
                head = (f"{cur.n} of {counted} counted episodes finished without error ({cur.errors} errors),"
                        f" below the required {config.min_coverage:.0%}")
            v.reason = head + (f"; not graded now: {missing}" if missing else "") + (f"; {detail}" if detail else "")
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
                    v.reason = "; ".join([reason for _, reason in hits] + others + ([no_base] if no_base else [])
                                         + ([f"not graded now: {missing}"] if missing else []))
                    break
            if v.verdict == "inconclusive" and more:
                v.more_episodes_needed = max(more)
        verdicts.append(v)

    for task, base in baseline.items():
        if task in current:
            continue
        ran = sorted(base.ran() if base.episodes is not None or base.successes else set(), key=_natural)
        v = Verdict(
            task=task, verdict="insufficient coverage", test="coverage", n_baseline=base.n,
            baseline_rate=(base.n_success / base.n) if base.n else None,
            floor=floor_for(task, config.floors), coverage=0.0, declared=len(ran),
            baseline_policy=_policy_text(base),
        )
        why = ("deselected in this run (-k/-m)" if task in deselected
               else "not collected in this run (renamed, removed, or its module skipped at import?)")
        if ran:
            v.not_graded = {("deselected" if task in deselected else "not collected"): ran}
        if base.n:
            v.reason = (f"graded in the baseline ({base.n} episodes) but not run now: {why}; a suite must not"
                        " pass by dropping a task")
        else:
            v.verdict, v.test, v.coverage = "skipped", "none", None
            v.reason = f"not run now: {why}, and no graded episode in the baseline" + (
                f" (skipped there: {base.skip_reason})" if base.skip_reason else "")
        verdicts.append(v)
    return verdicts


def _natural(episode: str) -> list[tuple[int, int | str]]:
    """Episode ids with their numbers in numeric order (seed2 before seed10)."""
    import re

    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", episode) if part]


def _accounting(cur: TaskOutcomes, base: TaskOutcomes | None) -> tuple[int, dict[str, list[str]], set[str]]:
    """(episodes counted, {why: episode ids counted but not graded now}, ids the baseline graded
    that this run left out on purpose): rule 1 of the module docstring."""
    now = cur.ran()
    counted = set(now)
    base_ran = base.ran() if base is not None else set()
    collected = set(cur.episodes or ()) | set(cur.deselected) | set(cur.skipped_ids) | set(cur.decided) | now
    if base_ran & collected:  # the same episodes on both sides: every one the baseline ran counts
        counted |= base_ran - set(cur.decided)
    why: dict[str, list[str]] = {}
    dropped: set[str] = set()
    for ep in sorted(counted - set(cur.successes), key=_natural):
        on_purpose = ep in cur.skipped_ids or ep in cur.deselected  # left out, rather than lost
        if ep in cur.errored:
            reason = "errored"
        elif ep in cur.skipped_ids:
            reason = f"skipped ({cur.skipped_ids[ep] or 'no reason given'})"
        elif ep in cur.deselected:
            reason = "deselected (-k/-m)"
        elif cur.episodes is None:
            reason = "no record now (errored, or never run)"  # ids unknown: an old file
        elif ep in cur.episodes:
            reason = "declared but never reported (an interrupted run?)"
        else:
            reason = "not collected now"
        why.setdefault(reason, []).append(ep)
        if on_purpose and base is not None and ep in base.successes:
            dropped.add(ep)
    if cur.episodes is None:
        # Without the declared ids (an old file, outcomes built by hand) the counts stand in: errors
        # known only by number, and the declared count, still count.
        return max(len(counted), cur.n + cur.errors, cur.declared), why, dropped
    return len(counted), why, dropped


def _named(not_graded: Mapping[str, list[str]], limit: int = 10) -> str:
    """``deselected (-k/-m): 7, 8; errored: 2`` with at most ``limit`` ids per reason."""
    parts = []
    for why, eps in not_graded.items():
        shown = ", ".join(eps[:limit]) + (f" and {len(eps) - limit} more" if len(eps) > limit else "")
        parts.append(f"{why}: episode{'s' if len(eps) != 1 else ''} {shown}")
    return "; ".join(parts)


def _policy_text(outcomes: TaskOutcomes | None) -> str | None:
    return ", ".join(sorted(outcomes.policies)) if outcomes is not None and outcomes.policies else None


def _identity_mismatch(cur: TaskOutcomes, base: TaskOutcomes, accept: Collection[str]) -> str | None:
    """Why the two sides are not the same task (None when every recorded field agrees)."""
    diffs = []
    for name in TASK_FIELDS:
        ours, theirs = cur.identity.get(name), base.identity.get(name)
        if not ours or not theirs or ours == theirs or name in accept:
            continue
        diffs.append(f"{name} is {' or '.join(sorted(theirs))} in the baseline and {' or '.join(sorted(ours))} now")
    if not diffs:
        return None
    names = [d.split(" ", 1)[0] for d in diffs]
    return ("not the same task on both sides, so not compared: " + "; ".join(diffs)
            + f". Record a new baseline for it, or accept the difference on purpose with"
              f" {' '.join(f'--hud-accept-difference={n}' for n in names)}")


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
    if not base.errors:
        return "no baseline: the baseline has no episode of this task that ran"
    return (f"no baseline: none of its {base.errors} baseline episode{'s' if base.errors != 1 else ''}"
            " finished without error")


# --------------------------------------------------------------------------------------------------
# gate file
# --------------------------------------------------------------------------------------------------

_TOP_KEYS = ("alpha", "max_drop", "min_coverage", "power", "detect_drop", "accept_differences", "tasks")
_NUMBER_KEYS = ("alpha", "max_drop", "min_coverage", "power", "detect_drop")
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
    if "accept_differences" in data:
        accept = data["accept_differences"]
        if isinstance(accept, str):
            accept = [accept]
        if not isinstance(accept, list) or not all(isinstance(a, str) for a in accept):
            raise ValueError(f"{source}: accept_differences must be a list of field names, e.g. [build],"
                             f" got {accept!r}")
        out_accept = tuple(accept)
    else:
        out_accept = None
    for key in _NUMBER_KEYS:
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
    if out_accept is not None:
        out["accept"] = out_accept
    try:
        GateConfig(**out)  # one place for the range rules
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    return out


def outcomes_from_records(records: Iterable[Any], declared: Mapping[str, int] | None = None, *,
                          episodes: Mapping[str, Iterable[str]] | None = None,
                          deselected: Mapping[str, Iterable[str]] | None = None) -> dict[str, TaskOutcomes]:
    """The gate's view of episode records (anything with task, episode, outcome, success, identity).

    Only the last record of each (task, episode) counts (reruns and resumes append). Errored
    episodes are left out of the success map and counted as errors; skipped episodes (a task that
    sequential mode decided early) count as neither and are not expected in ``declared`` either.
    ``episodes`` (task -> the episode ids the run declared) and ``deselected`` (task -> the ids
    ``-k``/``-m`` left out) give the episode-level accounting; without ``episodes`` the records
    stand in for what was declared, and ``declared`` (task -> count) for how many.
    """
    latest: dict[tuple[str, str], Any] = {}
    for rec in records:
        latest[(rec.task, str(rec.episode))] = rec
    tasks = set(declared or ()) | set(episodes or ()) | {task for task, _ in latest}
    out = {task: TaskOutcomes({}, 0, int((declared or {}).get(task, 0))) for task in sorted(tasks)}
    for task, ids in (episodes or {}).items():
        out[task].episodes = frozenset(str(e) for e in ids)
    for task, ids in (deselected or {}).items():
        if task in out:
            out[task].deselected = frozenset(str(e) for e in ids)
    errored: dict[str, set[str]] = {}
    decided: dict[str, set[str]] = {}
    identity: dict[str, dict[str, set[str]]] = {}
    policies: dict[str, set[str]] = {}
    for (task, episode), rec in latest.items():
        outcomes = out[task]
        if rec.outcome == "error":
            outcomes.errors += 1
            errored.setdefault(task, set()).add(episode)
        elif rec.outcome == "skipped":
            outcomes.skipped += 1
            reason = getattr(rec, "skip_reason", None)
            outcomes.skip_reason = outcomes.skip_reason or reason
            if str(reason or "").startswith(SEQUENTIAL_SKIP):
                decided.setdefault(task, set()).add(episode)
            else:
                outcomes.skipped_ids[episode] = reason
        elif rec.outcome in ("passed", "failed") and rec.success is not None:
            outcomes.successes[episode] = bool(rec.success)
        ident = dict(getattr(rec, "identity", None) or {})
        if getattr(rec, "contract", None):
            ident["contract"] = rec.contract
        if rec.outcome != "skipped" and ident:
            fields = identity.setdefault(task, {})
            for name in TASK_FIELDS:
                if name in ident:
                    fields.setdefault(name, set()).add(_canonical(ident[name]))
            if ident.get("policy"):
                digest = str(ident.get("policy_hash") or "")
                digest = digest.split(":", 1)[-1][:12]
                policies.setdefault(task, set()).add(f"{ident['policy']}" + (f" (hash {digest})" if digest else ""))
    for task, outcomes in out.items():
        outcomes.errored = frozenset(errored.get(task, ()))
        outcomes.decided = frozenset(decided.get(task, ()))
        outcomes.identity = {name: frozenset(values) for name, values in identity.get(task, {}).items()}
        outcomes.policies = frozenset(policies.get(task, ()))
        if outcomes.episodes is not None:
            outcomes.declared = len(outcomes.episodes)
        outcomes.declared = max(outcomes.declared, outcomes.n + outcomes.errors + outcomes.skipped)
        outcomes.declared -= outcomes.skipped
    return out


def _canonical(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True, default=str)


def outcomes_from_results(results: Any, *, as_baseline: bool = False) -> dict[str, TaskOutcomes]:
    """The gate's view of a loaded results file (a :class:`pytest_hud.core.results.Results`).

    Its header's declared episodes are what the run meant to run, so an incomplete file (a killed
    run) still counts every episode it did not finish. As a baseline (``as_baseline``) an
    incomplete file counts only the episodes it has: the user accepted it knowingly.
    """
    declared = {task: summary.declared for task, summary in results.tasks().items()}
    episodes = results.declared_episodes()
    if as_baseline and not results.complete:
        episodes, declared = None, {}
    return outcomes_from_records(results.latest_episodes(), declared, episodes=episodes,
                                 deselected=results.deselected_episodes())


def unmatched_floors(floors: Mapping[str, float], tasks: Iterable[str]) -> list[str]:
    """The floor patterns (task ids or globs) that match none of ``tasks``."""
    tasks = list(tasks)
    return [pattern for pattern in floors
            if pattern not in tasks and not any(fnmatch.fnmatchcase(task, pattern) for task in tasks)]


def floors_problem(floors: Mapping[str, float], tasks: Iterable[str], flag: str = "--hud-gate") -> str | None:
    """The usage error for gate-file floors that match none of ``tasks`` (None when all match)."""
    tasks = sorted(tasks)
    unmatched = unmatched_floors(floors, tasks)
    if not unmatched:
        return None
    shown = ", ".join(tasks[:5]) + (f" and {len(tasks) - 5} more" if len(tasks) > 5 else "")
    many = len(unmatched) > 1
    return (f"{flag}: the floor{'s' if many else ''} for {', '.join(map(repr, unmatched))} match{'' if many else 'es'}"
            f" no task of this run (a typo, or a renamed test?); its tasks are: {shown or 'none'}")
