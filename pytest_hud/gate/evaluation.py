"""The gate's rules and their evaluation: compare this run with a stored baseline, task by task.

Pure logic (no pytest, no I/O): the plugin turns results files into
:class:`~pytest_hud.gate.outcomes.TaskOutcomes`, calls :func:`evaluate_gate`, and sets the exit
status from :func:`~pytest_hud.gate.verdict.gate_passed`. Every rule of the gate is stated here
and implemented below.

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
   A task gated on its **score** (``metric: score``) is compared on each episode's graded score
   with rank tests instead (:mod:`.scores`: signed-rank paired, rank-sum unpaired; drops and
   tolerances in score units); the rest of the rules apply unchanged.
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
   (:func:`~pytest_hud.gate.verdict.gate_passed`): a baseline of another suite, or an empty one,
   must not pass silently.
9. **Dropping a task fails.** A task graded in the baseline that has no graded episode now
   (skipped, deselected with ``-k``/``-m``, or no longer collected) is *insufficient coverage*, and
   the reason says which of those happened.

:func:`~pytest_hud.gate.verdict.gate_passed` fails on incomparable, regression and insufficient
coverage; inconclusive passes unless ``strict=True`` (failing CI for lack of episodes on every small
suite would teach people to ignore the gate).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from pytest_hud import stats
from pytest_hud.gate.config import GateConfig, floor_for, metric_for
from pytest_hud.gate.outcomes import TASK_FIELDS, TaskOutcomes
from pytest_hud.gate.scores import ScoreComparison, compare_scores, score_detection, score_summary
from pytest_hud.gate.verdict import TestName, Verdict

__all__ = [
    "PAIRED_MIN_OVERLAP",
    "evaluate_gate",
]

PAIRED_MIN_OVERLAP = stats.PAIRED_MIN_OVERLAP
"""Pair when the shared episode ids are at least this fraction of each side's finished episodes."""


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
    shared = stats.shared_pairs(cur.successes, base.successes)
    if shared:
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
    comparisons: dict[str, _Comparison | ScoreComparison] = {}
    for task, cur in current.items():
        base = baseline.get(task)
        if base is not None and base.n > 0 and cur.n > 0 and task not in mismatches:
            if metric_for(task, config.metrics) == "score":
                scored = compare_scores(cur, base, config.max_drop)
                if scored is not None:
                    comparisons[task] = scored
                    continue
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
            v.test, v.p_value, v.adjusted_p, v.drop = comp.test, comp.p_value, adjusted[task], comp.drop  # type: ignore[assignment]
            if comp.paired:
                v.n_pairs, v.discordant = comp.n_pairs, (comp.worse, comp.better)
            if isinstance(comp, ScoreComparison):
                v.metric, v.current_score, v.baseline_score = "score", comp.current_mean, comp.baseline_mean
                summary = score_summary(comp, adjusted[task])
            else:
                summary = (
                    f"{_pct(v.current_rate or 0.0)} vs baseline {_pct(v.baseline_rate or 0.0)}"
                    f" ({comp.test}, drop {_pts(comp.drop)}, p={comp.p_value:.3g},"
                    f" Holm-adjusted {adjusted[task]:.3g})"
                )
            if adjusted[task] <= config.alpha and comp.drop > config.max_drop:
                tolerance = f" beyond the tolerance of {_pts(config.max_drop)}" if config.max_drop else ""
                states.append(("regression", comp.test, f"dropped{tolerance}: {summary}"))  # type: ignore[arg-type]
            else:
                assert base is not None  # a comparison exists only with a baseline
                if isinstance(comp, ScoreComparison):
                    state, v.min_detectable_drop, extra, why = score_detection(
                        comp, target=config.target_drop, max_drop=config.max_drop, level=level, power=config.power)
                else:
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
