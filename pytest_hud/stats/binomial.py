"""Exact binomial and hypergeometric building blocks, in log space.

Pure functions on counts, numpy only: the exact tests (``stats.py``), the power calculations
(``power.py``) and the sequential test (``sequential.py``) are built from these. Everything is
computed from exact log-factorials, so tails of 1e-300 are still right and nothing overflows for
thousands of episodes. ``binom_pmf``, ``binom_cdf`` and ``binom_sf`` match ``scipy.stats.binom``
(cross-checked in ``tests/unit/test_stats_scipy.py``); they are written here so that the core install
needs no scipy.

    >>> round(binom_sf(7, 9, 0.5), 12)  # P(X >= 8) for X ~ Bin(9, 1/2) = (C(9,8) + C(9,9)) / 2**9
    0.01953125
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

__all__ = ["binom_cdf", "binom_logpmf", "binom_pmf", "binom_sf"]


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
