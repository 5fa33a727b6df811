"""Power and sample size: how large a drop the gate can see, and how many episodes it needs.

Pure functions, numpy only. The gate (:mod:`pytest_hud.gate`) prints these next to its verdicts: the minimum
detectable drop at the current n, and the episodes that would settle an undecided task. The powers
are those of the gate's own tests (:mod:`.rates`): exact for McNemar's test and for the unpaired
tests up to a quarter million possible tables (the probability of the test's own rejection region),
normal approximations with continuity corrections beyond. Written by hand because no well-kept
Python library computes the power of these exact tests (statsmodels' power functions for
proportions are normal approximations, and statsmodels is not a dependency).

    >>> round(minimum_detectable_drop(100, baseline_rate=0.9, paired=True), 2)
    0.14
"""

from __future__ import annotations

import math
import operator
from functools import lru_cache
from statistics import NormalDist

import numpy as np

from pytest_hud.stats import rates as stats
from pytest_hud.stats.binomial import (
    _binom_pmf_matrix, _check_probability, _log_comb, _logsumexp, binom_logpmf,
)

__all__ = [
    "episodes_needed",
    "episodes_needed_for_floor",
    "minimum_detectable_drop",
    "paired_power",
    "unpaired_power",
]

_NORMAL = NormalDist()

# Up to this many expected discordant pairs the paired power is computed exactly; beyond it the
# normal approximation is accurate to well under a percent and the exact sum gets slow.
_EXACT_PAIRED_LIMIT = 1000.0
# Up to this many possible tables ((n + 1) * (n_baseline + 1)) the unpaired power is the exact
# probability of the test's rejection region (about 50 ms to find it at the limit); beyond it, a
# normal approximation.
_EXACT_UNPAIRED_TABLES = 62_500
# Nuisance-rate grid for the size of a candidate rejection region (the tests' own p-values check
# the boundary, so a grid that misses a peak cannot let a table in that the test would not flag).
_SIZE_GRID = 129


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


@lru_cache(maxsize=512)
def _unpaired_rejection_region(n: int, n_baseline: int, alpha: float, max_drop: float) -> np.ndarray:
    """Every table ``(successes now, successes in the baseline)`` that the gate's unpaired test
    flags at level ``alpha``, as an ``(n + 1, n_baseline + 1)`` bool array.

    Both tests order the tables by a statistic (Boschloo: Fisher's one-sided p-value; with a
    tolerance: the Farrington-Manning score) and their p-value is the largest probability, over the
    nuisance rate, of a table at least as extreme: so they flag exactly the tables up to some
    threshold of the statistic. The largest threshold whose region has size at most ``alpha`` is
    found for every candidate at once (cumulative sums over a grid of nuisance rates), then checked
    with the test's own p-value, which moves it down where the grid missed a peak.
    """

    if max_drop == 0.0:
        stat = stats._fisher_table(n, n_baseline)  # log Fisher p: small is extreme

        def p_value(i: int, j: int) -> float:
            return stats.boschloo_exact_one_sided(i, n, j, n_baseline)

        tie = np.full(stat.shape, stats._REL_TIE)
        rates = np.linspace(0.0, 1.0, _SIZE_GRID)
        new_rates, base_rates = rates, rates
    else:
        score = stats._farrington_manning(n, n_baseline, max_drop)  # large is extreme
        stat = -score

        def p_value(i: int, j: int) -> float:
            return stats.unpaired_noninferiority_exact(i, n, j, n_baseline, max_drop)

        tie = stats._REL_TIE * np.maximum(1.0, np.abs(score))
        base_rates = np.linspace(max_drop, 1.0, _SIZE_GRID)
        new_rates = np.clip(base_rates - max_drop, 0.0, 1.0)
    flat = stat.ravel()
    order = np.argsort(flat, kind="stable")
    ranked, ranked_tie = flat[order], tie.ravel()[order]
    # The region of a table's threshold takes the tables that tie with it too (as the tests do).
    ends = np.searchsorted(ranked, ranked + ranked_tie, side="right") - 1
    size = np.zeros(flat.size)
    b_new = _binom_pmf_matrix(n, new_rates)
    b_base = _binom_pmf_matrix(n_baseline, base_rates)
    rows, cols = np.divmod(order, n_baseline + 1)
    for g in range(len(base_rates)):
        np.maximum(size, np.cumsum(b_new[g, rows] * b_base[g, cols])[ends], out=size)
    k = int(np.searchsorted(size, alpha, side="right")) - 1  # sizes grow with the threshold
    while k >= 0 and p_value(int(rows[k]), int(cols[k])) > alpha:
        k = int(np.searchsorted(ranked, ranked[k], side="left")) - 1  # below the tables tied with it
    region = stat <= (ranked[k] + ranked_tie[k]) if k >= 0 else np.zeros(stat.shape, bool)
    region.flags.writeable = False  # cached and shared
    return region


def unpaired_power(
    n: int,
    n_baseline: int,
    drop: float,
    *,
    baseline_rate: float,
    alpha: float = 0.05,
    max_drop: float = 0.0,
) -> float:
    """Probability that the unpaired test flags a true drop of ``drop`` (``n`` episodes now,
    ``n_baseline`` in the baseline).

    Exact up to ``_EXACT_UNPAIRED_TABLES`` possible tables: the probability, at ``p_new =
    baseline_rate - drop`` and ``p_base = baseline_rate``, of the tables the gate's test
    (Boschloo's, or the Farrington-Manning test with a tolerance) flags at level ``alpha``. Beyond:
    a normal approximation with the Fleiss continuity correction ``(1/n + 1/n_baseline) / 2``, made
    conservative where the exact tests are weakest, near 0% and 100%: their size is a maximum over
    the unknown common rate, so the null variance of each side is taken at the point of its 95%
    Wilson interval nearest 1/2 (at 249 episodes a side it stays below the exact power from 50% to
    100% baselines; a plain plug-in said 0.47 for a 1-point drop from 100%, where the test has 0.11).
    The alternative's variances use ``(k + 1/2) / (m + 1)``.
    """
    n, n_baseline = operator.index(n), operator.index(n_baseline)
    p0 = _check_probability(baseline_rate, "baseline_rate")
    if n <= 0 or n_baseline <= 0:
        return 0.0
    if drop <= max_drop:
        return alpha  # a drop within the tolerance is flagged at most this often (the size of the test)
    p1 = max(0.0, p0 - drop)
    if (n + 1) * (n_baseline + 1) <= _EXACT_UNPAIRED_TABLES:

        region = _unpaired_rejection_region(n, n_baseline, float(alpha), float(max_drop))
        power = stats._two_binomial_region_probability(region, n, n_baseline, np.array([p1]), np.array([p0]))
        return float(min(1.0, power[0]))

    pb = max(0.0, p0 - max_drop)

    def null_var(p: float, m: int) -> float:
        low, high = stats.wilson_interval(round(p * m), m)
        q = min(max(0.5, low), high)  # the most variable rate the data cannot rule out
        return q * (1 - q) / m

    def alt_var(p: float, m: int) -> float:
        q = (p * m + 0.5) / (m + 1)
        return q * (1 - q) / m

    null_sd = math.sqrt(null_var(pb, n) + null_var(p0, n_baseline))
    alt_sd = math.sqrt(alt_var(p1, n) + alt_var(p0, n_baseline))
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
# episodes needed to settle a success-rate floor
# --------------------------------------------------------------------------------------------------


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
