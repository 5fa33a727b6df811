"""Continuous scores (a coverage, a distance made a score, a fraction of subgoals): exact rank tests
of "lower scores now", and the drop they could detect.

Pure (numpy only). Binary success throws away how close a failure came and how cleanly a success
went; a graded score in [0, 1] keeps it and detects a regression with fewer episodes. The gate
compares scores with rank tests, which assume nothing about their distribution (scores pile up at
0 and 1):

- **Paired** (the same episode ids on both sides): the **exact Wilcoxon signed-rank test** on the
  differences ``baseline - current``. Zero differences are dropped; ties share their mid-rank.
  Under "no drop" each difference is as likely positive as negative, so the signs are 2^m equally
  likely sign flips; the distribution of the positive rank sum is computed exactly by dynamic
  programming over (doubled, hence integer) ranks, at any number of pairs. Without ties it is
  scipy's ``wilcoxon(..., method="exact")`` (``tests/unit/test_stats_scores.py`` checks it).
- **Unpaired**: the **exact Wilcoxon-Mann-Whitney rank-sum test**, a permutation test on ranks:
  every split of the pooled scores into the two sides' sizes is equally likely; the number of
  splits per rank sum is counted exactly by dynamic programming while that costs at most
  :data:`EXACT_BUDGET` cell updates (about 100 + 100 episodes). Beyond it the p-value is a
  **Monte-Carlo permutation** p-value with a fixed seed (``(1 + hits) / (1 + 20000)``: valid, never
  below the exact one by more than its sampling error, and the same on every run). Without ties the
  exact one is scipy's ``mannwhitneyu(..., method="exact")``.

With a tolerance ``max_drop`` the current scores are raised by it first (H0: the drop is at most
max_drop). *Power*: the drop the test would catch with probability ``power`` at level ``alpha``,
from the normal approximation of the mean difference with the observed spread, widened by
1/sqrt(0.864) (0.864 is the lowest asymptotic efficiency of the rank tests against the t-test over
all distributions, so the estimate errs on the side of "inconclusive"); infinite when no outcome
of this many episodes could reach ``alpha``.

    >>> signed_rank_exact_one_sided([0.3, 0.2, 0.1, 0.4])    # all four worse: 1 / 2**4
    0.0625
    >>> rank_sum_one_sided([0.9, 0.8, 0.7], [0.1, 0.2, 0.3])  # the lowest three of six: 1 / C(6, 3)
    0.05
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

__all__ = ["EXACT_BUDGET", "rank_sum_one_sided", "score_detectable_drop", "score_episodes_needed",
           "signed_rank_exact_one_sided", "stratified_rank_sum_one_sided"]

#: Cell updates of the exact rank-sum count beyond which a seeded Monte-Carlo permutation test is used.
EXACT_BUDGET = 2 * 10**8
PERMUTATIONS = 20000
#: The lowest asymptotic relative efficiency of the Wilcoxon tests against the t-test (Hodges-Lehmann).
ARE = 0.864
_NORMAL = NormalDist()


def _doubled_ranks(values: np.ndarray) -> np.ndarray:
    """Twice the mid-ranks (1-based) of ``values``: integers even with ties."""
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), dtype=np.int64)
    sorted_values = values[order]
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and sorted_values[j + 1] == sorted_values[i]:
            j += 1
        ranks[order[i:j + 1]] = i + j + 2  # (i+1 + j+1): twice the mid-rank
        i = j + 1
    return ranks


def _check(values: Sequence[float], name: str) -> np.ndarray:
    out = np.asarray(values, dtype=float).ravel()
    if not np.all(np.isfinite(out)):
        raise ValueError(f"{name} holds a score that is not a finite number: {out[~np.isfinite(out)][:3].tolist()}")
    return out


def signed_rank_exact_one_sided(differences: Sequence[float]) -> float:
    """Exact one-sided Wilcoxon signed-rank p-value that the differences (baseline - current) are
    centred above zero, i.e. that the current scores are lower. 1.0 without a non-zero difference."""
    d = _check(differences, "differences")
    d = d[d != 0.0]
    if d.size == 0:
        return 1.0
    ranks = _doubled_ranks(np.abs(d))
    observed = int(ranks[d > 0].sum())
    dist = np.zeros(int(ranks.sum()) + 1)
    dist[0] = 1.0
    for r in ranks:  # each rank's sign flips with probability 1/2
        shifted = np.zeros_like(dist)
        shifted[r:] = dist[:-r]
        dist = 0.5 * (dist + shifted)
    return float(min(1.0, dist[observed:].sum()))


def rank_sum_one_sided(baseline: Sequence[float], current: Sequence[float], *, seed: int = 0) -> float:
    """One-sided Wilcoxon-Mann-Whitney p-value that the current scores are stochastically lower.

    Exact while counting the splits costs at most :data:`EXACT_BUDGET` cell updates, else a
    Monte-Carlo permutation p-value from :data:`PERMUTATIONS` permutations drawn with ``seed``.
    """
    base, cur = _check(baseline, "baseline"), _check(current, "current")
    if base.size == 0 or cur.size == 0:
        return 1.0
    ranks = _doubled_ranks(np.concatenate([cur, base]))
    observed = int(ranks[:cur.size].sum())  # small: the current scores rank low
    n, k = ranks.size, cur.size
    total = int(ranks.sum())
    if n * min(k, n - k) * total <= EXACT_BUDGET:
        small = min(k, n - k)
        # ways[j, s]: subsets of j ranks (of those seen so far) summing to s
        ways = np.zeros((small + 1, total + 1))
        ways[0, 0] = 1.0
        for r in ranks:
            ways[1:, r:] += ways[:-1, :-r].copy()
        dist = ways[small] / ways[small].sum()
        if small == k:
            return float(min(1.0, dist[:observed + 1].sum()))
        # the subsets counted are the baseline's: current sum <= observed <=> baseline sum >= total - observed
        return float(min(1.0, dist[total - observed:].sum()))
    rng = np.random.default_rng(seed)
    sums = np.array([ranks[rng.permutation(n)[:k]].sum() for _ in range(PERMUTATIONS)])
    return float((1 + np.count_nonzero(sums <= observed)) / (1 + PERMUTATIONS))


def stratified_rank_sum_one_sided(tables: Sequence[tuple[Sequence[float], Sequence[float]]], *,
                                  seed: int = 0) -> float:
    """One-sided rank-sum test stratified by task: ``tables`` holds one ``(baseline, current)`` score
    list pair per task. The statistic is the sum over tasks of the current scores' ranks *within their
    task*, and the null distribution permutes the scores within each task only, so a shift in the task
    mix cannot move it. One task: :func:`rank_sum_one_sided` (exact); several: a Monte-Carlo
    permutation p-value from :data:`PERMUTATIONS` within-task permutations drawn with ``seed``.
    """
    used = [(b, c) for b, c in tables if len(b) and len(c)]
    if len(used) <= 1:
        return rank_sum_one_sided(*used[0], seed=seed) if used else 1.0
    rng = np.random.default_rng(seed)
    observed, sampled = 0, np.zeros(PERMUTATIONS, dtype=np.int64)
    for base, cur in used:
        ranks = _doubled_ranks(np.concatenate([_check(cur, "current"), _check(base, "baseline")]))
        observed += int(ranks[:len(cur)].sum())
        sampled += rng.permuted(np.broadcast_to(ranks, (PERMUTATIONS, ranks.size)), axis=1)[:, :len(cur)].sum(axis=1)
    return float((1 + np.count_nonzero(sampled <= observed)) / (1 + PERMUTATIONS))


def _smallest_p(n: int, n_baseline: int | None) -> float:
    """The smallest p-value the test can give with this many episodes (no ties)."""
    if n_baseline is None:
        return 0.5 ** n
    return 1.0 / math.comb(n + n_baseline, n) if n and n_baseline else 1.0


def score_detectable_drop(n: int, spread: float, *, alpha: float, power: float,
                          n_baseline: int | None = None) -> float:
    """The mean score drop the test would catch with probability ``power`` at level ``alpha``.

    ``n``: pairs (``n_baseline`` None) or this run's episodes; ``spread``: the standard deviation of
    the paired differences, or of the scores (pooled) when unpaired.

        >>> round(score_detectable_drop(30, 0.2, alpha=0.05, power=0.8), 3)
        0.098
    """
    if n <= 0 or (n_baseline is not None and n_baseline <= 0) or _smallest_p(n, n_baseline) > alpha:
        return math.inf
    z = _NORMAL.inv_cdf(1.0 - alpha) + _NORMAL.inv_cdf(power)
    scale = math.sqrt(1.0 / n) if n_baseline is None else math.sqrt(1.0 / n + 1.0 / n_baseline)
    return z * spread * scale / math.sqrt(ARE)


def score_episodes_needed(drop: float, spread: float, *, alpha: float, power: float, paired: bool) -> int:
    """Episodes per run (pairs, or each side when unpaired) for :func:`score_detectable_drop` <= ``drop``."""
    if drop <= 0:
        raise ValueError(f"drop={drop} must be > 0")
    z = _NORMAL.inv_cdf(1.0 - alpha) + _NORMAL.inv_cdf(power)
    n = max(1, math.ceil((z * spread / (drop * math.sqrt(ARE))) ** 2 * (1 if paired else 2)))
    while score_detectable_drop(n, spread, alpha=alpha, power=power, n_baseline=None if paired else n) > drop:
        n += 1
    return n
