"""Anytime-valid sequential test of one task against its baseline (``--hud-sequential``).

Pure logic, numpy only; the plugin feeds :class:`SequentialTest` one episode at a time and stops a
task's episodes once it decides. The test is a pair of mixture e-processes (betting martingales) on
the (worse, better, concordant) pair tallies: peeking after every episode keeps the false-alarm
rate at most ``alpha`` (Ville's inequality). Written by hand because no well-kept Python library
offers it: scipy.stats and statsmodels test at a fixed n, and a fixed-n test re-run after every
episode inflates its false-alarm rate far above ``alpha``.

    >>> sequential_decision(worse=6, better=0, concordant=20)
    'undecided'
    >>> sequential_decision(worse=7, better=0, concordant=20)  # the e-value passed 1 / alpha = 20
    'regression'
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Literal

import numpy as np

from pytest_hud.stats.binomial import _xlogy

__all__ = ["Decision", "SequentialTest", "sequential_decision", "sequential_log_evalues"]

Decision = Literal["regression", "pass", "undecided"]


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
