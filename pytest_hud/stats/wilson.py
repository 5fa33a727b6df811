"""The Wilson score interval of a success rate, and the check of a count it shares with the exact
tests: pure Python (no numpy), so that the run's live progress line and its summary table do not
import numpy into the controller."""

from __future__ import annotations

import math
import operator
from statistics import NormalDist

__all__ = ["wilson_interval"]

_NORMAL = NormalDist()


def _check_count(successes: int, n: int, what: str = "successes") -> tuple[int, int]:
    successes, n = operator.index(successes), operator.index(n)
    if n < 0 or not 0 <= successes <= n:
        raise ValueError(f"{what}={successes} out of n={n}: need 0 <= {what} <= n")
    return successes, n


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
