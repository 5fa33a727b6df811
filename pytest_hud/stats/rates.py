"""Intervals, exact tests and multiple comparisons for per-task success rates.

(Over 400 lines on purpose: the exact tests share their tail sums and tie handling; splitting them further would separate code that must change together.)

Pure functions on counts: no pytest, no I/O, numpy only. The gate (:mod:`pytest_hud.gate`) builds its verdicts
from these. The statistics are cut by role into four modules, and every public name of all four is
importable from the package, :mod:`pytest_hud.stats`:

- ``binomial.py``: exact binomial pmf, cdf and sf in log space, the building blocks of the rest;
- ``rates.py`` (this module): the Wilson interval, the exact tests and Holm's procedure;
- ``power.py``: power, minimum detectable drop and episodes needed (the gate's design advice);
- ``sequential.py``: the anytime-valid sequential test behind ``--hud-sequential``.

Conventions used throughout:

- *drop* is ``baseline_rate - current_rate``: positive means the new policy is worse.
- In a paired comparison (the same episode ids on both sides), a *worse* pair succeeded in the
  baseline and failed now, a *better* pair the reverse; the rest are *concordant*.
- One-sided tests ask "is the new policy worse (by more than ``max_drop``)?"; small p = evidence of
  a regression.

Why hand-written. scipy is not a dependency of the core install: it is over 100 MB, and
``import scipy.stats`` costs about a second in every xdist worker, for a handful of formulas on
counts. Where ``scipy.stats`` has the same test, ``tests/unit/test_stats_scipy.py`` checks ours
against it over grids and seeded random tables:

- :func:`wilson_interval`: ``binomtest(k, n).proportion_ci(method="wilson")``;
- :func:`mcnemar_exact_one_sided`: ``binomtest(worse, worse + better, 0.5, alternative="greater")``;
- :func:`fisher_exact_one_sided`: ``fisher_exact(table, alternative="less")``;
- :func:`boschloo_exact_one_sided`: ``boschloo_exact(table, alternative="less")``. Ours handles the
  whole table with numpy and is about 40 times faster at 500 episodes per side (0.06 s against
  2.3 s), which matters with one test per task in every gate run;
- :func:`unpaired_noninferiority_exact` at ``max_drop=0``: ``barnard_exact(table, "less",
  pooled=True)`` (the Farrington-Manning score is then the pooled z). scipy drops tables that tie
  with the observed one in exact arithmetic but not in floating point (scipy issue #18798), which
  makes its p-value too small; ours keeps them, so the two are compared where no such tie exists.

No well-kept library has the rest, so it is written here and tested against hand values, brute force
and simulated error rates (``tests/unit/test_stats.py``): the exact unconditional non-inferiority tests
with a margin (Farrington-Manning score after Chan 1998 for unpaired runs, Tango's score for paired
episodes), the mixture e-process of ``sequential.py``, and the power and sample size of these exact
tests in ``power.py``. Holm's procedure is a few lines (statsmodels has it, but is no dependency);
its test checks it against its definition as closed testing with Bonferroni.

    >>> wilson_interval(8, 10)                      # doctest: +ELLIPSIS
    (0.490..., 0.943...)
    >>> mcnemar_exact_one_sided(worse=8, better=1)  # (C(9,8) + C(9,9)) / 2**9
    0.01953125
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from functools import lru_cache

import numpy as np

from pytest_hud.stats.wilson import _check_count, wilson_interval
from pytest_hud.stats.binomial import (
    _binom_pmf_matrix, _check_probability, _log_comb, _log_factorials, _logsumexp, _xlogy, binom_sf,
)

__all__ = [
    "boschloo_exact_one_sided",
    "fisher_exact_one_sided",
    "holm",
    "holm_adjusted",
    "mcnemar_exact_one_sided",
    "paired_noninferiority_exact",
    "unpaired_noninferiority_exact",
    "wilson_interval",
]

# Two p-values (or statistics) closer than this, relatively, are the same value: tables that tie in
# exact arithmetic must all land in the rejection region, whatever the rounding did to them.
_REL_TIE = 1e-7


# --------------------------------------------------------------------------------------------------
# intervals
# --------------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------------
# exact tests
# --------------------------------------------------------------------------------------------------


def mcnemar_exact_one_sided(worse: int, better: int) -> float:
    """Exact one-sided McNemar test on the discordant pairs of a paired comparison.

    ``worse`` counts episodes that succeeded in the baseline and failed now, ``better`` the reverse.
    Under "no drop" each discordant pair is worse with probability at most 1/2, so
    ``p = P(X >= worse)`` with ``X ~ Binomial(worse + better, 1/2)``. Conditioning on the number of
    discordant pairs makes the test exact without any nuisance parameter; concordant pairs carry no
    information about the difference and are ignored.

        >>> mcnemar_exact_one_sided(8, 1)  # 10 / 512
        0.01953125
    """
    worse, better = operator.index(worse), operator.index(better)
    if worse < 0 or better < 0:
        raise ValueError(f"worse={worse}, better={better}: counts must be >= 0")
    if worse == 0:
        return 1.0
    n = worse + better
    if n <= 2000:
        # Exact integer arithmetic; int / int rounds correctly, so 10/512 comes out as 0.01953125.
        # Each C(n, k+1) from the last (exact division), not math.comb afresh: 200x faster at n=2000.
        term = total = math.comb(n, worse)
        for k in range(worse, n):
            term = term * (n - k) // (k + 1)
            total += term
        return total / (1 << n)
    return binom_sf(worse - 1, n, 0.5)


@lru_cache(maxsize=8)
def _fisher_table(n_new: int, n_base: int) -> np.ndarray:
    """``log P(X_new <= x_new | x_new + x_base)`` for every table, as an (n_new+1, n_base+1) array.

    This is the one-sided Fisher p-value (new rate lower) of every possible outcome; Boschloo's test
    uses it as its ordering statistic.
    """
    total = n_new + n_base
    x = np.arange(n_new + 1)[None, :]
    t = np.arange(total + 1)[:, None]
    lf = _log_factorials(total)
    x_base = t - x
    valid = (x_base >= 0) & (x_base <= n_base)
    xb = np.clip(x_base, 0, n_base)
    log_pmf = np.where(
        valid,
        (lf[n_new] - lf[x] - lf[n_new - x]) + (lf[n_base] - lf[xb] - lf[n_base - xb])
        - (lf[total] - lf[t] - lf[total - t]),
        -np.inf,
    )
    with np.errstate(invalid="ignore"):
        log_cdf = np.logaddexp.accumulate(log_pmf, axis=1)
    xs = np.arange(n_new + 1)[:, None]
    ys = np.arange(n_base + 1)[None, :]
    table = np.minimum(log_cdf[xs + ys, xs], 0.0)
    table.flags.writeable = False  # cached and shared
    return table


def fisher_exact_one_sided(s_new: int, n_new: int, s_base: int, n_base: int) -> float:
    """Fisher's exact test, one-sided (new success rate lower than the baseline's).

    ``p = P(X <= s_new)`` with X hypergeometric given both margins. Valid at any n, but conservative
    because it conditions on the total number of successes; see :func:`boschloo_exact_one_sided`.

        >>> round(fisher_exact_one_sided(1, 5, 5, 5), 6)  # only the observed table: 5 / C(10, 6) = 1/42
        0.02381
    """
    s_new, n_new = _check_count(s_new, n_new, "s_new")
    s_base, n_base = _check_count(s_base, n_base, "s_base")
    if n_new == 0 or n_base == 0:
        return 1.0
    t = s_new + s_base
    x = np.arange(max(0, t - n_base), s_new + 1)
    total = n_new + n_base
    log_pmf = _log_comb(n_new, x) + _log_comb(n_base, t - x) - _log_comb(total, np.array(t))
    return min(1.0, math.exp(_logsumexp(log_pmf)))


def _maximise(f: Callable[[np.ndarray], np.ndarray], low: float, high: float, grid: int = 64) -> float:
    """Largest value of a smooth function of one nuisance parameter on [low, high].

    A grid finds the neighbourhoods of the best local maxima; each is then zoomed into four times.
    Exact unconditional p-values are suprema of polynomials in the nuisance parameter; the grid is
    fine enough that the refinement converges to the global peak in practice.
    """
    xs = np.linspace(low, high, grid + 1)
    values = f(xs)
    best = float(np.max(values))
    step = (high - low) / grid
    for i in np.argsort(values)[::-1][:3]:
        centre, width = float(xs[i]), step
        for _ in range(4):
            local = np.clip(np.linspace(centre - width, centre + width, 17), low, high)
            local_values = f(local)
            j = int(np.argmax(local_values))
            best = max(best, float(local_values[j]))
            centre, width = float(local[j]), width / 8.0
    return min(1.0, best)


def _two_binomial_region_probability(
    region: np.ndarray, n_new: int, n_base: int, p_new: np.ndarray, p_base: np.ndarray
) -> np.ndarray:
    """``P((X_new, X_base) in region)`` for independent binomials, for each pair of rates (vectorised).

    ``sum_ij B_new[g, i] R[i, j] B_base[g, j]`` as one matrix product per chunk of the grid.
    """
    weights = region.astype(float)
    b_new = _binom_pmf_matrix(n_new, p_new)
    b_base = _binom_pmf_matrix(n_base, p_base)
    return np.einsum("gj,gj->g", b_new @ weights, b_base)


def boschloo_exact_one_sided(s_new: int, n_new: int, s_base: int, n_base: int) -> float:
    """Boschloo's exact unconditional test, one-sided (new success rate lower).

    The statistic is Fisher's one-sided p-value; the p-value is the largest probability, over the
    common success rate pi in [0, 1] under "no drop", of a table at least as extreme as the observed
    one. This is the default unpaired test of the gate: it is exact (never above its nominal level),
    and it is uniformly more powerful than Fisher's test (its p-value is never larger), because it
    does not condition away the information in the total number of successes. The maximum is found
    on a 64-point grid plus local refinement; the whole table is handled with numpy, so 500 episodes
    per side take a fraction of a second.

        >>> boschloo_exact_one_sided(0, 2, 2, 2)  # max over pi of (1-pi)^2 pi^2 = 1/16; Fisher gives 1/6
        0.0625
    """
    s_new, n_new = _check_count(s_new, n_new, "s_new")
    s_base, n_base = _check_count(s_base, n_base, "s_base")
    if n_new == 0 or n_base == 0:
        return 1.0
    log_fisher = _fisher_table(n_new, n_base)
    observed = log_fisher[s_new, s_base]
    if observed >= 0.0:
        return 1.0
    region = log_fisher <= observed + _REL_TIE

    def size(pi: np.ndarray) -> np.ndarray:
        return _two_binomial_region_probability(region, n_new, n_base, pi, pi)

    boschloo = _maximise(size, 0.0, 1.0)
    # Boschloo's p never exceeds Fisher's; guard against grid error at the last decimal.
    return min(boschloo, math.exp(observed))


def _restricted_mle_unpaired(
    x_new: np.ndarray, n_new: int, x_base: np.ndarray, n_base: int, margin: float
) -> np.ndarray:
    """Baseline rate maximising the likelihood subject to ``p_base - p_new = margin`` (vectorised).

    The log-likelihood is concave in p_base on (margin, 1), so its derivative is decreasing and a
    bisection on the derivative is robust for every table at once (no cubic-formula edge cases).
    """
    low = np.full(np.broadcast(x_new, x_base).shape, float(margin))
    high = np.ones_like(low)
    for _ in range(60):
        mid = 0.5 * (low + high)
        with np.errstate(divide="ignore", invalid="ignore"):
            slope = (
                x_base / mid
                - (n_base - x_base) / (1.0 - mid)
                + x_new / (mid - margin)
                - (n_new - x_new) / (1.0 - mid + margin)
            )
        go_up = slope > 0
        low = np.where(go_up, mid, low)
        high = np.where(go_up, high, mid)
    return 0.5 * (low + high)


@lru_cache(maxsize=8)
def _farrington_manning(n_new: int, n_base: int, margin: float) -> np.ndarray:
    """Farrington-Manning score statistic for every table, large = evidence that drop > margin."""
    x_new = np.arange(n_new + 1)[:, None].astype(float)
    x_base = np.arange(n_base + 1)[None, :].astype(float)
    p_base = _restricted_mle_unpaired(x_new, n_new, x_base, n_base, margin)
    p_new = np.clip(p_base - margin, 0.0, 1.0)
    variance = p_base * (1 - p_base) / n_base + p_new * (1 - p_new) / n_new
    diff = x_base / n_base - x_new / n_new - margin
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(variance > 0, diff / np.sqrt(variance), 0.0)
    z.flags.writeable = False  # cached and shared
    return z


def unpaired_noninferiority_exact(s_new: int, n_new: int, s_base: int, n_base: int, max_drop: float) -> float:
    """Exact unconditional test of ``H0: p_new >= p_base - max_drop`` (one-sided, Chan 1998).

    Used by the gate when a tolerance ``max_drop > 0`` is configured: a drop no larger than the
    tolerance is the null hypothesis, so small p means "dropped by more than the tolerance". The
    statistic is the Farrington-Manning score; the p-value is maximised over the baseline rate on
    the boundary ``p_new = p_base - max_drop`` (where the size of this test is largest).
    """
    s_new, n_new = _check_count(s_new, n_new, "s_new")
    s_base, n_base = _check_count(s_base, n_base, "s_base")
    margin = _check_probability(max_drop, "max_drop")
    if margin >= 1.0:
        raise ValueError("max_drop must be < 1")
    if n_new == 0 or n_base == 0:
        return 1.0
    z = _farrington_manning(n_new, n_base, margin)
    observed = z[s_new, s_base]
    region = z >= observed - _REL_TIE * max(1.0, abs(observed))

    def size(p_base: np.ndarray) -> np.ndarray:
        return _two_binomial_region_probability(region, n_new, n_base, np.clip(p_base - margin, 0, 1), p_base)

    return _maximise(size, margin, 1.0)


@lru_cache(maxsize=8)
def _tango_scores(n: int, margin: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tango's score statistic for every (worse, better) outcome of n pairs; large = drop > margin."""
    worse, better = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing="ij")
    keep = worse + better <= n
    w = worse[keep].astype(float)
    b = better[keep].astype(float)
    c = n - w - b
    # Restricted MLE of P(better) under P(worse) - P(better) = margin: the positive root of
    # 2n p^2 - A p - b*margin*(1 - margin) = 0 (derivative of the trinomial log-likelihood).
    a = w * (1 - margin) + b * (1 - 3 * margin) - 2 * c * margin
    p_better = (a + np.sqrt(a * a + 8.0 * n * b * margin * (1 - margin))) / (4.0 * n)
    variance = (2.0 * p_better + margin - margin * margin) / n
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(variance > 0, ((w - b) / n - margin) / np.sqrt(variance), 0.0)
    out = (worse[keep], better[keep], z)
    for array in out:
        array.flags.writeable = False  # cached and shared
    return out


def paired_noninferiority_exact(worse: int, better: int, n_pairs: int, max_drop: float) -> float:
    """Exact unconditional test of ``H0: drop <= max_drop`` for paired episodes (one-sided).

    With a tolerance the discordant pairs alone no longer suffice (how often pairs disagree becomes
    a nuisance parameter), so this uses Tango's (1998) score statistic on the (worse, better,
    concordant) trinomial and maximises the tail probability over P(better) on the boundary
    ``P(worse) - P(better) = max_drop``. At ``max_drop = 0`` prefer :func:`mcnemar_exact_one_sided`.
    """
    worse, better, n_pairs = (operator.index(v) for v in (worse, better, n_pairs))
    if worse < 0 or better < 0 or worse + better > n_pairs:
        raise ValueError(f"worse={worse}, better={better} do not fit in n_pairs={n_pairs}")
    margin = _check_probability(max_drop, "max_drop")
    if margin >= 1.0:
        raise ValueError("max_drop must be < 1")
    if n_pairs == 0:
        return 1.0
    ws, bs, z = _tango_scores(n_pairs, margin)
    observed = z[(ws == worse) & (bs == better)][0]
    inside = z >= observed - _REL_TIE * max(1.0, abs(observed))
    w = ws[inside].astype(float)
    b = bs[inside].astype(float)
    c = n_pairs - w - b
    lf = _log_factorials(n_pairs)
    log_coef = lf[n_pairs] - lf[ws[inside]] - lf[bs[inside]] - lf[n_pairs - ws[inside] - bs[inside]]

    def size(p_better: np.ndarray) -> np.ndarray:
        out = np.empty(len(p_better))
        for i, pb in enumerate(p_better):  # region sizes are at most (n+1)^2 / 2; one row at a time
            pw = pb + margin
            pc = max(0.0, 1.0 - pb - pw)
            log_p = log_coef + _xlogy(w, pw) + _xlogy(b, pb) + _xlogy(c, pc)
            out[i] = math.exp(_logsumexp(log_p)) if log_p.size else 0.0
        return out

    return _maximise(size, 0.0, (1.0 - margin) / 2.0, grid=48)


# --------------------------------------------------------------------------------------------------
# multiple comparisons
# --------------------------------------------------------------------------------------------------


def holm_adjusted(pvalues: Mapping[str, float]) -> dict[str, float]:
    """Holm step-down adjusted p-values (compare each with alpha to get Holm's decisions).

    The i-th smallest of m p-values is multiplied by ``m - i + 1``, then made monotone and capped at
    1. Ties are ordered by key so the result does not depend on dict order.

        >>> holm_adjusted({"a": 0.01, "b": 0.04, "c": 0.03})
        {'a': 0.03, 'b': 0.06, 'c': 0.06}
    """
    for key, p in pvalues.items():
        if not 0.0 <= float(p) <= 1.0:
            raise ValueError(f"p-value for {key!r} is {p}, not in [0, 1]")
    order = sorted(pvalues, key=lambda key: (float(pvalues[key]), key))
    m = len(order)
    adjusted: dict[str, float] = {}
    running = 0.0
    for i, key in enumerate(order):
        running = max(running, min(1.0, (m - i) * float(pvalues[key])))
        adjusted[key] = running
    return {key: adjusted[key] for key in pvalues}


def holm(pvalues: Mapping[str, float], alpha: float = 0.05) -> dict[str, bool]:
    """Holm's step-down procedure: which hypotheses to reject with family-wise error <= alpha.

        >>> holm({"a": 0.01, "b": 0.04, "c": 0.03}, alpha=0.05)
        {'a': True, 'b': False, 'c': False}
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha={alpha} must be strictly between 0 and 1")
    return {key: p <= alpha for key, p in holm_adjusted(pvalues).items()}

