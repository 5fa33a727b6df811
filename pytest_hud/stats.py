"""Intervals, exact tests and sequential tests for per-task success rates.

Pure functions on counts: no pytest, no I/O, numpy only (no scipy). The gate (``gate.py``) builds
its verdicts from these; the plugin uses :class:`SequentialTest` for ``--hud-sequential``.

Conventions used throughout:

- *drop* is ``baseline_rate - current_rate``: positive means the new policy is worse.
- In a paired comparison (the same episode ids on both sides), a *worse* pair succeeded in the
  baseline and failed now, a *better* pair the reverse; the rest are *concordant*.
- One-sided tests ask "is the new policy worse (by more than ``max_drop``)?"; small p = evidence of
  a regression.

Everything is computed in log space from exact log-factorials, so tails of 1e-300 are still right
and nothing overflows for thousands of episodes.

    >>> wilson_interval(8, 10)                      # doctest: +ELLIPSIS
    (0.490..., 0.943...)
    >>> mcnemar_exact_one_sided(worse=8, better=1)  # (C(9,8) + C(9,9)) / 2**9
    0.01953125
"""

from __future__ import annotations

import math
import operator
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from statistics import NormalDist
from typing import Literal

import numpy as np

__all__ = [
    "Decision",
    "SequentialTest",
    "binom_cdf",
    "binom_logpmf",
    "binom_pmf",
    "binom_sf",
    "boschloo_exact_one_sided",
    "episodes_needed",
    "episodes_needed_for_floor",
    "fisher_exact_one_sided",
    "holm",
    "holm_adjusted",
    "mcnemar_exact_one_sided",
    "minimum_detectable_drop",
    "paired_noninferiority_exact",
    "paired_power",
    "sequential_decision",
    "sequential_log_evalues",
    "unpaired_noninferiority_exact",
    "unpaired_power",
    "wilson_interval",
]

Decision = Literal["regression", "pass", "undecided"]

_NORMAL = NormalDist()
# Two p-values (or statistics) closer than this, relatively, are the same value: tables that tie in
# exact arithmetic must all land in the rejection region, whatever the rounding did to them.
_REL_TIE = 1e-7


# --------------------------------------------------------------------------------------------------
# exact binomial and hypergeometric building blocks
# --------------------------------------------------------------------------------------------------


@lru_cache(maxsize=32)
def _log_factorials_upto(size: int) -> np.ndarray:
    table = np.array([math.lgamma(k + 1.0) for k in range(size + 1)])
    table.flags.writeable = False
    return table


def _log_factorials(n: int) -> np.ndarray:
    """``log(k!)`` for k = 0..n (at least); lgamma per entry, so exact to double precision."""
    # Round the size up to a power of two so that many different n share a handful of tables.
    return _log_factorials_upto(1 << max(6, int(n).bit_length()))


def _log_comb(n: int, k: np.ndarray) -> np.ndarray:
    lf = _log_factorials(n)
    k = np.asarray(k)
    inside = (k >= 0) & (k <= n)
    kk = np.clip(k, 0, n)
    return np.where(inside, lf[n] - lf[kk] - lf[n - kk], -np.inf)


def _xlogy(x: np.ndarray | float, y: float | np.ndarray) -> np.ndarray:
    """``x * log(y)`` with ``0 * log(0) = 0`` (a certain event costs nothing)."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x == 0, 0.0, x * np.log(y))


def _logsumexp(a: np.ndarray) -> float:
    a = np.asarray(a, dtype=float)
    if a.size == 0:
        return -math.inf
    top = float(np.max(a))
    if top == -math.inf:
        return -math.inf
    return top + math.log(float(np.sum(np.exp(a - top))))


def _check_count(successes: int, n: int, what: str = "successes") -> tuple[int, int]:
    successes, n = operator.index(successes), operator.index(n)
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"{what}={successes} out of n={n}: need 0 <= {what} <= n")
    return successes, n


def _check_probability(p: float, name: str) -> float:
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"{name}={p} is not a probability in [0, 1]")
    return p


def binom_logpmf(k: int | Sequence[int] | np.ndarray, n: int, p: float) -> np.ndarray:
    """``log P(X = k)`` for ``X ~ Binomial(n, p)``, elementwise over ``k`` (``-inf`` outside 0..n)."""
    n = operator.index(n)
    p = _check_probability(p, "p")
    k = np.asarray(k)
    return _log_comb(n, k) + _xlogy(k, p) + _xlogy(n - k, 1.0 - p)


def binom_pmf(k: int, n: int, p: float) -> float:
    """``P(X = k)`` for ``X ~ Binomial(n, p)``."""
    return float(np.exp(binom_logpmf(k, n, p)))


def binom_cdf(k: int, n: int, p: float) -> float:
    """``P(X <= k)`` for ``X ~ Binomial(n, p)``.

    Summed directly from the lower tail (never as ``1 - sf``), so tiny tails keep their digits.
    """
    k, n = operator.index(k), operator.index(n)
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return min(1.0, math.exp(_logsumexp(binom_logpmf(np.arange(k + 1), n, p))))


def binom_sf(k: int, n: int, p: float) -> float:
    """``P(X > k)`` for ``X ~ Binomial(n, p)``.

    scipy's convention: ``P(X >= k)`` is ``binom_sf(k - 1, n, p)``.
    """
    k, n = operator.index(k), operator.index(n)
    if k < 0:
        return 1.0
    if k >= n:
        return 0.0
    return min(1.0, math.exp(_logsumexp(binom_logpmf(np.arange(k + 1, n + 1), n, p))))


def _binom_pmf_matrix(n: int, ps: np.ndarray) -> np.ndarray:
    """``P(X = k)`` for k = 0..n (columns) and every p in ``ps`` (rows)."""
    k = np.arange(n + 1)
    ps = np.asarray(ps, dtype=float)[:, None]
    return np.exp(_log_comb(n, k)[None, :] + _xlogy(k[None, :], ps) + _xlogy((n - k)[None, :], 1.0 - ps))


# --------------------------------------------------------------------------------------------------
# intervals
# --------------------------------------------------------------------------------------------------


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval for a success rate; ``(0.0, 1.0)`` when ``n == 0``.

    Wilson rather than the normal (Wald) interval because it stays inside [0, 1] and keeps close to
    its nominal coverage at the small n and extreme rates that policy evals produce.

        >>> wilson_interval(0, 0)
        (0.0, 1.0)
    """
    successes, n = _check_count(successes, n)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence} must be strictly between 0 and 1")
    if n == 0:
        return (0.0, 1.0)
    z = _NORMAL.inv_cdf(0.5 + confidence / 2.0)
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2.0 * n)) / denom
    half = z * math.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n)) / denom
    # Pin the ends that are exact so that 0/n and n/n do not print as 1e-17 or 0.9999999.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return (low, high)


def episodes_needed_for_floor(rate: float, floor: float, confidence: float = 0.95) -> int | None:
    """Episodes after which a true rate of ``rate`` would put the Wilson upper bound below ``floor``.

    Used to say how many episodes would turn "below the floor, but the interval still reaches it"
    into a definite answer. ``None`` when ``rate >= floor`` (more episodes cannot show it below).
    """
    rate = _check_probability(rate, "rate")
    floor = _check_probability(floor, "floor")
    if rate >= floor:
        return None

    def upper(n: int) -> float:
        # Wilson upper bound with the success count at its expectation (continuous in n).
        z = _NORMAL.inv_cdf(0.5 + confidence / 2.0)
        z2 = z * z
        denom = 1.0 + z2 / n
        return (rate + z2 / (2 * n) + z * math.sqrt(rate * (1 - rate) / n + z2 / (4 * n * n))) / denom

    high = 1
    while upper(high) >= floor:
        high *= 2
    low = max(1, high // 2)
    while low < high:
        mid = (low + high) // 2
        if upper(mid) < floor:
            high = mid
        else:
            low = mid + 1
    return high


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
        return sum(math.comb(n, k) for k in range(worse, n + 1)) / (1 << n)
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


# --------------------------------------------------------------------------------------------------
# power, minimum detectable drop, episodes needed
# --------------------------------------------------------------------------------------------------

# Up to this many expected discordant pairs the paired power is computed exactly; beyond it the
# normal approximation is accurate to well under a percent and the exact sum gets slow.
_EXACT_PAIRED_LIMIT = 1000.0


def _paired_discordance(drop: float, baseline_rate: float | None, discordance: float | None) -> float:
    """Probability that a pair disagrees, at a true drop of ``drop``.

    Given an observed discordance, keep it (but at least ``drop``: a drop of d needs at least d
    discordant pairs). Otherwise assume the two runs of an episode succeed independently, which is
    the pessimistic end: seeded sims make runs agree more often, and agreement adds power.
    """
    if discordance is not None:
        return min(1.0, max(float(discordance), drop))
    if baseline_rate is None:
        raise ValueError("paired power needs baseline_rate or discordance")
    p0, p1 = baseline_rate, baseline_rate - drop
    return min(1.0, max(drop, p0 * (1 - p1) + p1 * (1 - p0)))


@lru_cache(maxsize=1 << 16)
def _mcnemar_critical(discordant: int, alpha: float) -> int:
    """Smallest k with ``P(Bin(discordant, 1/2) >= k) <= alpha`` (discordant + 1 when none)."""
    if discordant == 0:
        return 1
    log_pmf = _log_comb(discordant, np.arange(discordant + 1)) - discordant * math.log(2.0)
    log_upper = np.logaddexp.accumulate(log_pmf[::-1])[::-1]
    hits = np.nonzero(log_upper <= math.log(alpha) + 1e-12)[0]
    return int(hits[0]) if hits.size else discordant + 1


def _mcnemar_power_exact(n: int, p_worse: float, p_better: float, alpha: float) -> float:
    psi = p_worse + p_better
    if psi <= 0.0:
        return 0.0
    q = p_worse / psi
    log_p_discordant = binom_logpmf(np.arange(n + 1), n, min(psi, 1.0))
    # Skip numbers of discordant pairs that carry less than e^-40 of the probability.
    ds = np.nonzero(log_p_discordant > np.max(log_p_discordant) - 40.0)[0]
    total = 0.0
    for d in ds:
        k = _mcnemar_critical(int(d), alpha)
        if k > d:
            continue
        tail = _logsumexp(binom_logpmf(np.arange(k, d + 1), int(d), q))
        total += math.exp(log_p_discordant[d] + tail)
    return min(1.0, total)


def _normal_power(mean_shift: float, null_sd: float, alt_sd: float, alpha: float) -> float:
    z_alpha = _NORMAL.inv_cdf(1.0 - alpha)
    numerator = mean_shift - z_alpha * null_sd
    if alt_sd <= 0.0:
        return 1.0 if numerator > 0 else 0.0
    return _NORMAL.cdf(numerator / alt_sd)


def paired_power(
    n: int,
    drop: float,
    *,
    baseline_rate: float | None = None,
    discordance: float | None = None,
    alpha: float = 0.05,
    max_drop: float = 0.0,
) -> float:
    """Probability that the paired test flags a true drop of ``drop`` with ``n`` pairs.

    With ``max_drop == 0`` this is the exact power of :func:`mcnemar_exact_one_sided` (a sum over
    the number of discordant pairs), switching to the normal approximation (Connor 1987, with a 1/n
    continuity correction) beyond ~1000 expected discordant pairs. With a tolerance it is the normal
    approximation of the score test against ``drop <= max_drop``. How often pairs disagree is given
    by ``discordance`` (observed) or, failing that, by assuming independent runs at
    ``baseline_rate`` (see :func:`minimum_detectable_drop`).
    """
    n = operator.index(n)
    if n <= 0:
        return 0.0
    if drop <= max_drop:
        return alpha  # a drop within the tolerance is flagged at most this often (the size of the test)
    psi = _paired_discordance(drop, baseline_rate, discordance)
    p_worse, p_better = (psi + drop) / 2.0, max(0.0, (psi - drop) / 2.0)
    if max_drop == 0.0 and n * psi <= _EXACT_PAIRED_LIMIT:
        return _mcnemar_power_exact(n, p_worse, p_better, alpha)
    root_n = math.sqrt(n)
    shift = root_n * (drop - max_drop) - 1.0 / root_n
    return _normal_power(
        shift, math.sqrt(max(0.0, psi - max_drop**2)), math.sqrt(max(0.0, psi - drop**2)), alpha
    )


def unpaired_power(
    n: int,
    n_baseline: int,
    drop: float,
    *,
    baseline_rate: float,
    alpha: float = 0.05,
    max_drop: float = 0.0,
) -> float:
    """Approximate probability that the unpaired test flags a true drop of ``drop``.

    Normal approximation with the Fleiss continuity correction ``(1/n + 1/n_baseline) / 2``, which
    tracks Fisher's exact test closely; Boschloo is a little more powerful, so the answer errs on
    the side of asking for more episodes. Null variance at the boundary ``p_new = p_base - max_drop``.
    """
    n, n_baseline = operator.index(n), operator.index(n_baseline)
    p0 = _check_probability(baseline_rate, "baseline_rate")
    if n <= 0 or n_baseline <= 0:
        return 0.0
    if drop <= max_drop:
        return alpha  # a drop within the tolerance is flagged at most this often (the size of the test)
    p1 = max(0.0, p0 - drop)
    pb = max(0.0, p0 - max_drop)
    null_sd = math.sqrt(pb * (1 - pb) / n + p0 * (1 - p0) / n_baseline)
    alt_sd = math.sqrt(p1 * (1 - p1) / n + p0 * (1 - p0) / n_baseline)
    correction = (1.0 / n + 1.0 / n_baseline) / 2.0
    return _normal_power(drop - max_drop - correction, null_sd, alt_sd, alpha)


def _design_power(
    n: int,
    drop: float,
    *,
    baseline_rate: float,
    paired: bool,
    n_baseline: int | None,
    discordance: float | None,
    alpha: float,
    max_drop: float,
) -> float:
    if paired:
        return paired_power(
            n, drop, baseline_rate=baseline_rate, discordance=discordance, alpha=alpha, max_drop=max_drop
        )
    return unpaired_power(
        n, n if n_baseline is None else n_baseline, drop,
        baseline_rate=baseline_rate, alpha=alpha, max_drop=max_drop,
    )


def minimum_detectable_drop(
    n: int,
    *,
    baseline_rate: float,
    paired: bool,
    n_baseline: int | None = None,
    discordance: float | None = None,
    alpha: float = 0.05,
    power: float = 0.8,
    max_drop: float = 0.0,
) -> float:
    """Smallest true drop that the gate's test flags with probability ``power`` at this n.

    ``n`` is the number of pairs (paired) or of current episodes (unpaired; ``n_baseline`` defaults
    to ``n``). Paired: exact McNemar power when ``max_drop == 0`` (see :func:`paired_power`), with
    the pair disagreement rate taken from ``discordance`` if observed, else from independent runs at
    ``baseline_rate``. Unpaired: :func:`unpaired_power`. Returns ``math.inf`` when not even a drop
    to zero successes would be flagged with that probability.

        >>> round(minimum_detectable_drop(100, baseline_rate=0.9, paired=True), 2)
        0.14
    """
    p0 = _check_probability(baseline_rate, "baseline_rate")
    kwargs = dict(
        baseline_rate=p0, paired=paired, n_baseline=n_baseline, discordance=discordance,
        alpha=alpha, max_drop=max_drop,
    )
    if p0 <= max_drop or _design_power(n, p0, **kwargs) < power:  # type: ignore[arg-type]
        return math.inf
    low, high = max_drop, p0
    while high - low > 1e-4:
        mid = 0.5 * (low + high)
        if _design_power(n, mid, **kwargs) >= power:  # type: ignore[arg-type]
            high = mid
        else:
            low = mid
    return high


def episodes_needed(
    drop: float,
    *,
    baseline_rate: float,
    paired: bool,
    n_baseline: int | None = None,
    discordance: float | None = None,
    alpha: float = 0.05,
    power: float = 0.8,
    max_drop: float = 0.0,
) -> int | None:
    """Episodes that make a true drop of ``drop`` flagged with probability ``power``.

    Paired: number of pairs (episodes per run). Unpaired: current episodes, with the baseline as
    large (``n_baseline=None``) or fixed at ``n_baseline``; ``None`` when a baseline that small cannot
    reach the power however many current episodes are run. Uses the same power functions as
    :func:`minimum_detectable_drop`, so the two agree. Exact powers saw-tooth a little in n; the
    search treats power as increasing in n, so read the answer as "about".

        >>> episodes_needed(0.15, baseline_rate=0.9, paired=True) <= 100
        True
    """
    if drop <= max_drop:
        raise ValueError(f"drop={drop} must exceed max_drop={max_drop}: drops within the tolerance pass")
    p0 = _check_probability(baseline_rate, "baseline_rate")
    if drop > p0:
        raise ValueError(f"drop={drop} is larger than baseline_rate={p0}")

    def enough(n: int) -> bool:
        return _design_power(
            n, drop, baseline_rate=p0, paired=paired, n_baseline=n_baseline, discordance=discordance,
            alpha=alpha, max_drop=max_drop,
        ) >= power

    high = 4
    while not enough(high):
        high *= 2
        if high > 10_000_000:
            return None
    low = high // 2 + 1 if high > 4 else 1
    while low < high:
        mid = (low + high) // 2
        if enough(mid):
            high = mid
        else:
            low = mid + 1
    return high


# --------------------------------------------------------------------------------------------------
# sequential testing (anytime-valid, for --hud-sequential)
# --------------------------------------------------------------------------------------------------

# Betting fractions of the mixture martingales, as fractions of the largest safe bet. A uniform
# mixture over a grid costs at most log(len) in evidence against the best fixed bet in hindsight.
_BET_FRACTIONS = np.linspace(0.05, 0.95, 19)


def _default_detect_drop(max_drop: float) -> float:
    return min(0.99, max_drop + 0.10)


def sequential_log_evalues(
    worse: int | np.ndarray,
    better: int | np.ndarray,
    concordant: int | np.ndarray,
    *,
    max_drop: float = 0.0,
    detect_drop: float | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Log e-values for "regression" and for "pass" after the given pair tallies (broadcasts).

    Each pair scores ``X = +1`` (worse), ``-1`` (better) or ``0`` (concordant); ``E[X]`` is the drop.

    - Regression evidence bets against ``H0: drop <= max_drop``: a mixture, over bet sizes
      ``lambda``, of ``prod(1 + lambda * (X_i - max_drop))``. Under H0 each factor has mean <= 1, so
      the mixture is a non-negative supermartingale starting at 1.
    - Pass evidence bets against ``H0': drop >= detect_drop`` with ``prod(1 + mu * (detect_drop -
      X_i))``, likewise a supermartingale when the drop really is that large.

    The products depend only on the counts, hence the tally interface. With ``max_drop == 0`` the
    regression side is a mixture of likelihood ratios on the discordant pairs alone (concordant
    pairs multiply by 1), the sequential twin of McNemar's test.
    """
    margin = float(max_drop)
    detect = _default_detect_drop(margin) if detect_drop is None else float(detect_drop)
    if not 0.0 <= margin < detect < 1.0:
        raise ValueError(f"need 0 <= max_drop < detect_drop < 1, got {margin} and {detect}")
    w = np.asarray(worse, dtype=float)[..., None]
    b = np.asarray(better, dtype=float)[..., None]
    c = np.asarray(concordant, dtype=float)[..., None]
    # Largest bets that keep every factor non-negative: X - margin >= -(1 + margin) and
    # detect - X >= -(1 - detect).
    lam = _BET_FRACTIONS / (1.0 + margin)
    mu = _BET_FRACTIONS / (1.0 - detect)
    log_reg = (
        w * np.log1p(lam * (1.0 - margin))
        + b * np.log1p(-lam * (1.0 + margin))
        + _xlogy(c, 1.0 - lam * margin)
    )
    log_pass = (
        w * np.log1p(-mu * (1.0 - detect))
        + b * np.log1p(mu * (1.0 + detect))
        + c * np.log1p(mu * detect)
    )
    mean = -math.log(len(_BET_FRACTIONS))
    return (
        np.logaddexp.reduce(log_reg, axis=-1) + mean,
        np.logaddexp.reduce(log_pass, axis=-1) + mean,
    )


def sequential_decision(
    worse: int,
    better: int,
    concordant: int,
    *,
    alpha: float = 0.05,
    max_drop: float = 0.0,
    detect_drop: float | None = None,
    beta: float = 0.2,
) -> Decision:
    """Where the sequential test stands after these pair tallies.

    "regression" once the regression e-value reaches ``1/alpha``; "pass" once the pass e-value
    reaches ``1/beta``; else "undecided". By Ville's inequality, P(the regression e-value *ever*
    reaches 1/alpha) <= alpha when the drop is within ``max_drop``, so peeking after every episode
    and stopping whenever (optional stopping) keeps the false-alarm rate <= alpha. Likewise a policy
    that really dropped by ``detect_drop`` or more is passed with probability <= beta. Between the
    two (the indifference zone) either answer may come. Regression wins a tie.
    """
    if not 0.0 < alpha < 1.0 or not 0.0 < beta < 1.0:
        raise ValueError(f"alpha={alpha} and beta={beta} must be strictly between 0 and 1")
    log_reg, log_pass = sequential_log_evalues(
        worse, better, concordant, max_drop=max_drop, detect_drop=detect_drop
    )
    if float(log_reg) >= -math.log(alpha):
        return "regression"
    if float(log_pass) >= -math.log(beta):
        return "pass"
    return "undecided"


class SequentialTest:
    """Anytime-valid per-task comparison against a baseline, fed one episode at a time.

        test = SequentialTest(alpha=0.05, max_drop=0.0, paired=True)
        for current, baseline in results_in_declared_order:
            if test.update(current, baseline) != "undecided":
                break                                   # stop running episodes for this task

    Paired: each update is one episode id's (current, baseline) outcome. Unpaired: current and
    baseline outcomes are queued separately (``update(current=...)``, ``update(baseline=...)``) and
    paired first-in first-out; two independent samples paired this way give pairs whose mean score
    is the drop, so the same e-processes apply (at some cost in power).

    Feed results in an order fixed before they ran (collection or seed order), **not completion
    order**: failures often run to the step limit and finish last, and an order that depends on
    the outcomes breaks the guarantee. :meth:`record` does the reordering given ``order``.

    The first decision other than "undecided" is latched: :meth:`decide` keeps returning it.
    """

    def __init__(
        self,
        alpha: float = 0.05,
        max_drop: float = 0.0,
        *,
        detect_drop: float | None = None,
        beta: float = 0.2,
        paired: bool = True,
        order: Sequence[str] | None = None,
    ) -> None:
        self.alpha = alpha
        self.max_drop = max_drop
        self.detect_drop = _default_detect_drop(max_drop) if detect_drop is None else detect_drop
        self.beta = beta
        self.paired = paired
        # Validate once, up front, rather than on the first update.
        sequential_decision(0, 0, 0, alpha=alpha, max_drop=max_drop, detect_drop=self.detect_drop, beta=beta)
        self.worse = self.better = self.concordant = 0
        self._decision: Decision = "undecided"
        self._current: deque[bool] = deque()
        self._baseline: deque[bool] = deque()
        self._order = list(order) if order is not None else None
        self._next = 0
        self._held: dict[str, tuple[bool | None, bool | None]] = {}

    @property
    def n_pairs(self) -> int:
        """Pairs scored so far."""
        return self.worse + self.better + self.concordant

    @property
    def evalues(self) -> tuple[float, float]:
        """Current (regression, pass) e-values."""
        log_reg, log_pass = sequential_log_evalues(
            self.worse, self.better, self.concordant, max_drop=self.max_drop, detect_drop=self.detect_drop
        )
        return (math.exp(float(log_reg)), math.exp(float(log_pass)))

    def update(self, current: bool | None = None, baseline: bool | None = None) -> Decision:
        """Add one episode's outcome(s) and return the (latched) decision."""
        if self.paired:
            if current is None or baseline is None:
                raise ValueError("a paired SequentialTest needs both the current and the baseline outcome")
            self._score(bool(current), bool(baseline))
        else:
            if current is not None:
                self._current.append(bool(current))
            if baseline is not None:
                self._baseline.append(bool(baseline))
            while self._current and self._baseline:
                self._score(self._current.popleft(), self._baseline.popleft())
        return self.decide()

    def record(self, episode: str, current: bool | None, baseline: bool | None = None) -> Decision:
        """Add an episode that finished in any order; it is scored once all before it in ``order`` are.

        ``current=None`` marks an errored episode: it is skipped (errors count against coverage,
        not as outcomes).
        """
        if self._order is None:
            raise ValueError("record() needs the declared episode order: SequentialTest(order=[...])")
        self._held[episode] = (current, baseline)
        while self._next < len(self._order) and self._order[self._next] in self._held:
            cur, base = self._held.pop(self._order[self._next])
            self._next += 1
            if cur is None or (self.paired and base is None):
                continue
            self.update(cur, base)
        return self.decide()

    def decide(self) -> Decision:
        """The first non-"undecided" decision reached so far, else "undecided"."""
        return self._decision

    def _score(self, current: bool, baseline: bool) -> None:
        if baseline and not current:
            self.worse += 1
        elif current and not baseline:
            self.better += 1
        else:
            self.concordant += 1
        if self._decision == "undecided":
            self._decision = sequential_decision(
                self.worse, self.better, self.concordant,
                alpha=self.alpha, max_drop=self.max_drop, detect_drop=self.detect_drop, beta=self.beta,
            )
