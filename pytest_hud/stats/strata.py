"""An exact test of "lower success rate" pooled over tasks, stratified by task.

Pure (numpy only). Pooling the counts of several tasks into one 2x2 table compares task *mixes* as
much as policies: when a level errs on half of an easy task's episodes, its graded episodes lean to
the hard task and its pooled rate drops although no task's rate changed. Stratifying removes that:
each task keeps its own 2x2 table (level and reference, successes and failures), and the test
conditions on every table's margins.

**The exact conditional test** (the exact Mantel-Haenszel test of a common odds ratio of 1, as in
R's ``mantelhaen.test(exact=TRUE)``, one-sided). Given task k's margins (``n_new``, ``n_base``
episodes, ``t`` successes in all), the level's successes ``X_k`` are hypergeometric under "the level
is no worse in any task", whatever the task's own success rate; the tasks are independent, so the
distribution of ``S = sum X_k`` is the convolution of theirs, and the p-value is ``P(S <= s)``. It
is exact with no nuisance parameter (every task's rate is conditioned away) and needs no rate to be
the same across tasks. With one task it is Fisher's exact test (``tests/unit/test_stats_strata.py``
checks both against scipy).

    >>> round(stratified_exact_one_sided([(1, 5, 5, 5)]), 6)      # one task: Fisher's 1/42
    0.02381
    >>> round(stratified_exact_one_sided([(9, 10, 9, 10), (1, 10, 9, 10)]), 4)
    0.003
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from pytest_hud.stats.binomial import _log_comb
from pytest_hud.stats.wilson import _check_count

__all__ = ["stratified_difference", "stratified_exact_one_sided"]


def _hypergeometric(n_new: int, n_base: int, total: int) -> tuple[int, np.ndarray]:
    """(smallest x, P(X = x) for x from there): the level's successes given the table's margins."""
    low, high = max(0, total - n_base), min(n_new, total)
    x = np.arange(low, high + 1)
    log_pmf = _log_comb(n_new, x) + _log_comb(n_base, total - x) - _log_comb(n_new + n_base, np.array(total))
    pmf = np.exp(log_pmf)
    return low, pmf / pmf.sum()


def stratified_exact_one_sided(tables: Sequence[tuple[int, int, int, int]]) -> float:
    """One-sided exact conditional test over tasks: is the new success rate lower?

    ``tables`` holds one ``(s_new, n_new, s_base, n_base)`` per task. A task with no episode on one
    side carries no information about the difference and drops out. Returns 1.0 when none is left.
    """
    offset, dist, observed = 0, np.ones(1), 0
    for s_new, n_new, s_base, n_base in tables:
        s_new, n_new = _check_count(s_new, n_new, "s_new")
        s_base, n_base = _check_count(s_base, n_base, "s_base")
        if n_new == 0 or n_base == 0:
            continue
        low, pmf = _hypergeometric(n_new, n_base, s_new + s_base)
        offset += low
        dist = np.convolve(dist, pmf)
        observed += s_new
    index = observed - offset
    if len(dist) == 1:
        return 1.0
    # sum the lower tail and its complement's complement: the smaller of the two sums is the more accurate
    lower, upper = float(dist[:index + 1].sum()), float(dist[index + 1:].sum())
    return min(1.0, lower if lower <= 0.5 else 1.0 - upper)


def stratified_difference(tables: Sequence[tuple[int, int, int, int]]) -> float | None:
    """The Mantel-Haenszel weighted difference, reference rate minus new rate (positive: worse).

    Each task weighs ``n_new * n_base / (n_new + n_base)``, so a task on only one side counts for
    nothing, as in the test. None when no task has episodes on both sides.

        >>> stratified_difference([(9, 10, 9, 10), (1, 10, 9, 10)])
        0.4
    """
    num = den = 0.0
    for s_new, n_new, s_base, n_base in tables:
        if n_new and n_base:
            weight = n_new * n_base / (n_new + n_base)
            num += weight * (s_base / n_base - s_new / n_new)
            den += weight
    return num / den if den else None
