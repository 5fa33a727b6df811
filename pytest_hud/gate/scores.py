"""The gate on a continuous score: a task that opts in (``hud(metric="score")`` or ``metric: score``
in the gate file) is compared on each episode's graded score instead of its success.

Pure logic (no pytest, no I/O). The rules are the gate's (:mod:`.evaluation`) with the score's tests
(:mod:`pytest_hud.stats.scores`):

- **Paired or unpaired** as for success: the same episode ids on both sides (80% or more) are
  compared paired, with the exact Wilcoxon signed-rank test on ``baseline - current``; otherwise
  unpaired, with the exact Wilcoxon-Mann-Whitney rank-sum test (a seeded Monte-Carlo permutation
  p-value beyond about 100 + 100 episodes). With a tolerance ``max_drop`` the null hypothesis is
  "the mean score dropped by at most max_drop": the current scores are raised by it before the test.
- **Holm** across all the gate's tasks, success and score alike (one family).
- **Inconclusive**: a non-significant task passes only if the test could have seen a mean score
  drop of ``detect_drop`` (default 0.1 beyond max_drop) with the configured power at the Bonferroni
  level; otherwise it is inconclusive with the episodes per run that would make it detectable.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from pytest_hud import stats
from pytest_hud.gate.outcomes import TaskOutcomes

__all__ = ["ScoreComparison", "compare_scores", "score_detection"]


@dataclass
class ScoreComparison:
    test: str  # "paired-signed-rank" or "unpaired-rank-sum"
    p_value: float
    drop: float  # mean baseline score - mean current score (paired: over the shared episodes)
    paired: bool
    baseline_mean: float
    current_mean: float
    spread: float  # sd of the paired differences, or of both sides' scores (pooled) when unpaired
    n: int  # pairs, or this run's scored episodes
    n_baseline: int
    n_pairs: int = 0
    worse: int = 0  # paired: episodes that scored lower now
    better: int = 0


def compare_scores(cur: TaskOutcomes, base: TaskOutcomes, max_drop: float) -> ScoreComparison | None:
    """The score test of one task (None when a side has no scored episode)."""
    now = {e: s for e, s in cur.scores.items() if e in cur.successes}
    then = {e: s for e, s in base.scores.items() if e in base.successes}
    if not now or not then:
        return None
    shared = sorted(stats.shared_pairs(now, then) or ())
    if shared:
        diffs = [then[e] - now[e] for e in shared]
        return ScoreComparison(
            "paired-signed-rank", stats.signed_rank_exact_one_sided([d - max_drop for d in diffs]),
            statistics.fmean(diffs), True, statistics.fmean(then[e] for e in shared),
            statistics.fmean(now[e] for e in shared), statistics.pstdev(diffs), len(shared), len(shared),
            len(shared), sum(1 for d in diffs if d > 0), sum(1 for d in diffs if d < 0))
    a, b = list(then.values()), list(now.values())
    spread = math.sqrt(((len(a) - 1) * _var(a) + (len(b) - 1) * _var(b)) / max(1, len(a) + len(b) - 2))
    return ScoreComparison(
        "unpaired-rank-sum", stats.rank_sum_one_sided(a, [s + max_drop for s in b]),
        statistics.fmean(a) - statistics.fmean(b), False, statistics.fmean(a), statistics.fmean(b), spread,
        len(b), len(a))


def _var(values: list[float]) -> float:
    return statistics.variance(values) if len(values) > 1 else 0.0


def score_detection(comp: ScoreComparison, *, target: float, max_drop: float, level: float,
                    power: float) -> tuple[str, float | None, int | None, str]:
    """Could this comparison have seen a mean score drop of ``target``? -> (state, mdd, more episodes, reason)."""
    mdd = stats.score_detectable_drop(comp.n, comp.spread, alpha=level, power=power,
                                      n_baseline=None if comp.paired else comp.n_baseline) + max_drop
    if mdd <= target:
        return "pass", mdd, None, (f"a mean score drop of {target:.2f} would have been caught with {power:.0%}"
                                   f" power (detectable from {mdd:.3f})")
    needed = stats.score_episodes_needed(max(1e-6, target - max_drop), comp.spread, alpha=level, power=power,
                                         paired=comp.paired)
    more = max(1, needed - comp.n)
    shown = "no drop" if math.isinf(mdd) else f"only mean score drops of {mdd:.3f} or more"
    how = f"about {needed} {'paired episodes per run' if comp.paired else 'episodes on each side'} ({more} more)"
    return "inconclusive", mdd, more, (f"not significant, but at this n {shown} would be caught with {power:.0%}"
                                       f" power; detecting {target:.2f} needs {how}")


def score_summary(comp: ScoreComparison, adjusted_p: float) -> str:
    """``mean score 0.41 vs baseline 0.83 (paired-signed-rank, drop 0.42, p=..., Holm-adjusted ...)``."""
    return (f"mean score {comp.current_mean:.3f} vs baseline {comp.baseline_mean:.3f} ({comp.test},"
            f" drop {comp.drop:.3f}, p={comp.p_value:.3g}, Holm-adjusted {adjusted_p:.3g})")
