"""The statistics' error rates by simulation: false alarms under identical success rates, power, and
the anytime-valid sequential test under optional stopping.

Monte-Carlo tests use a seeded numpy Generator, so they are deterministic; tolerances are about three
standard errors of the simulated rate, so a test that is anti-conservative by a few points fails.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_hud.stats import (
    SequentialTest, boschloo_exact_one_sided, mcnemar_exact_one_sided, paired_noninferiority_exact,
    paired_power, sequential_decision, sequential_log_evalues, unpaired_noninferiority_exact,
)

ALPHA = 0.05


def three_se(rate: float, sims: int) -> float:
    return 3.0 * math.sqrt(rate * (1.0 - rate) / sims)


# --------------------------------------------------------------------------------------------------
# Monte Carlo: false alarms under identical success rates, and power
# --------------------------------------------------------------------------------------------------


def paired_runs(rng: np.random.Generator, sims: int, n: int, p_base: float, p_new: float, agree: float = 0.0):
    """(baseline, current) success arrays; with ``agree`` the current run copies the baseline episode."""
    base = rng.random((sims, n)) < p_base
    fresh = rng.random((sims, n)) < p_new
    # Copying keeps the marginal rate only when both rates are equal; used for null scenarios only.
    copy = rng.random((sims, n)) < agree
    return base, np.where(copy, base, fresh)


def mcnemar_critical_table(n: int, alpha: float) -> np.ndarray:
    """For each number of discordant pairs d, the fewest worse pairs that the exact test flags."""
    table = np.full(n + 1, n + 2)
    for d in range(1, n + 1):
        for worse in range(d // 2, d + 1):
            if mcnemar_exact_one_sided(worse, d - worse) <= alpha:
                table[d] = worse
                break
    return table


@pytest.mark.parametrize(("rate", "agree"), [(0.8, 0.0), (0.5, 0.0), (0.85, 0.7)])
def test_paired_test_false_alarm_rate_is_at_most_alpha(rate: float, agree: float) -> None:
    rng = np.random.default_rng(1)
    sims, n = 6000, 60
    base, cur = paired_runs(rng, sims, n, rate, rate, agree)
    worse = (base & ~cur).sum(axis=1)
    better = (cur & ~base).sum(axis=1)
    flagged = np.mean([mcnemar_exact_one_sided(int(w), int(b)) <= ALPHA for w, b in zip(worse, better)])
    print(f"paired, {rate:.0%} vs {rate:.0%}, agree={agree}: false-alarm rate {flagged:.4f}")
    assert flagged <= ALPHA + three_se(ALPHA, sims)
    assert flagged > 0.005  # a test that never fires would pass the line above too


@pytest.mark.parametrize("rate", [0.7, 0.9])
def test_unpaired_test_false_alarm_rate_is_at_most_alpha(rate: float) -> None:
    rng = np.random.default_rng(2)
    sims, n_new, n_base = 4000, 40, 30
    new = rng.binomial(n_new, rate, sims).tolist()
    base = rng.binomial(n_base, rate, sims).tolist()
    cache: dict[tuple[int, int], float] = {}
    for key in set(zip(new, base)):
        cache[key] = boschloo_exact_one_sided(key[0], n_new, key[1], n_base)
    flagged = np.mean([cache[key] <= ALPHA for key in zip(new, base)])
    print(f"unpaired (Boschloo), {rate:.0%} vs {rate:.0%}: false-alarm rate {flagged:.4f}")
    assert flagged <= ALPHA + three_se(ALPHA, sims)
    assert flagged > 0.01


def test_noninferiority_false_alarm_rate_at_the_tolerance_is_at_most_alpha() -> None:
    rng = np.random.default_rng(3)
    sims, n, margin = 3000, 40, 0.1
    new = rng.binomial(n, 0.7 - margin, sims).tolist()
    base = rng.binomial(n, 0.7, sims).tolist()
    cache = {key: unpaired_noninferiority_exact(key[0], n, key[1], n, margin) for key in set(zip(new, base))}
    flagged_unpaired = np.mean([cache[key] <= ALPHA for key in zip(new, base)])
    # Paired at the boundary: P(worse) - P(better) = margin exactly.
    pb = 0.1
    outcome = rng.choice(3, size=(sims, n), p=[pb + margin, pb, 1 - 2 * pb - margin])
    worse = (outcome == 0).sum(axis=1).tolist()
    better = (outcome == 1).sum(axis=1).tolist()
    cache_p = {key: paired_noninferiority_exact(key[0], key[1], n, margin) for key in set(zip(worse, better))}
    flagged_paired = np.mean([cache_p[key] <= ALPHA for key in zip(worse, better)])
    print(f"non-inferiority at the tolerance: unpaired {flagged_unpaired:.4f}, paired {flagged_paired:.4f}")
    assert flagged_unpaired <= ALPHA + three_se(ALPHA, sims)
    assert flagged_paired <= ALPHA + three_se(ALPHA, sims)
    assert min(flagged_unpaired, flagged_paired) > 0.01


def test_power_to_flag_90_to_75_percent_with_100_paired_episodes() -> None:
    rng = np.random.default_rng(4)
    sims, n = 4000, 100
    base, cur = paired_runs(rng, sims, n, 0.9, 0.75)  # independent runs: the least helpful pairing
    worse = (base & ~cur).sum(axis=1)
    better = (cur & ~base).sum(axis=1)
    power = float(np.mean([mcnemar_exact_one_sided(int(w), int(b)) <= ALPHA for w, b in zip(worse, better)]))
    exact = paired_power(n, 0.15, baseline_rate=0.9)
    print(f"power to flag 90% -> 75% with {n} paired episodes: simulated {power:.3f}, exact {exact:.3f}")
    assert power >= 0.75
    assert power == pytest.approx(exact, abs=three_se(exact, sims))


# --------------------------------------------------------------------------------------------------
# sequential test
# --------------------------------------------------------------------------------------------------


def first_decisions(base: np.ndarray, cur: np.ndarray, **kwargs) -> tuple[np.ndarray, np.ndarray]:
    """Stop at the first crossing of either boundary.

    Returns the decision (+1 regression, -1 pass, 0 none) and the pairs used, per simulation.
    """
    alpha, beta = kwargs.pop("alpha", ALPHA), kwargs.pop("beta", 0.2)
    n = base.shape[1]
    worse = np.cumsum(base & ~cur, axis=1)
    better = np.cumsum(cur & ~base, axis=1)
    concordant = np.arange(1, n + 1)[None, :] - worse - better
    log_reg, log_pass = sequential_log_evalues(worse, better, concordant, **kwargs)
    never = n + 1
    reg = log_reg >= -math.log(alpha)
    ok = log_pass >= -math.log(beta)
    t_reg = np.where(reg.any(axis=1), reg.argmax(axis=1), never)
    t_pass = np.where(ok.any(axis=1), ok.argmax(axis=1), never)
    decision = np.where((t_reg <= t_pass) & (t_reg < never), 1, np.where(t_pass < never, -1, 0))
    return decision, np.minimum(np.minimum(t_reg, t_pass) + 1, n)


def test_sequential_false_alarm_rate_stays_below_alpha_while_naive_peeking_does_not() -> None:
    rng = np.random.default_rng(5)
    sims, n = 3000, 300
    base, cur = paired_runs(rng, sims, n, 0.8, 0.8)
    # Anytime-valid test, checked after every pair, never told to stop on "pass".
    worse = np.cumsum(base & ~cur, axis=1)
    better = np.cumsum(cur & ~base, axis=1)
    log_reg, _ = sequential_log_evalues(worse, better, np.arange(1, n + 1) - worse - better)
    ever = float(np.mean((log_reg >= -math.log(ALPHA)).any(axis=1)))
    # The mistake it replaces: re-running the fixed-n exact McNemar after every pair.
    critical = mcnemar_critical_table(n, ALPHA)
    naive = float(np.mean((worse >= critical[worse + better]).any(axis=1)))
    print(f"ever flagged in {n} pairs at 80% vs 80%: e-process {ever:.4f}, peeking McNemar {naive:.4f}")
    assert ever <= ALPHA + three_se(ALPHA, sims)
    assert naive > 2 * ALPHA


def test_sequential_pass_side_rarely_passes_a_real_drop() -> None:
    # At a drop of exactly detect_drop the pass e-process is a test martingale: P(pass) <= beta.
    rng = np.random.default_rng(6)
    sims, n = 3000, 300
    base, cur = paired_runs(rng, sims, n, 0.9, 0.8)
    decision, _ = first_decisions(base, cur, detect_drop=0.1)
    passed = float(np.mean(decision == -1))
    print(f"90% -> 80% with detect_drop=0.1: passed {passed:.3f}, flagged {np.mean(decision == 1):.3f}")
    assert passed <= 0.2 + three_se(0.2, sims)
    assert np.mean(decision == 1) > 0.6


def test_sequential_stops_early_on_clear_cases() -> None:
    rng = np.random.default_rng(8)
    base, cur = paired_runs(rng, 1000, 300, 0.9, 0.5)
    decision, used = first_decisions(base, cur)
    assert np.mean(decision == 1) > 0.99 and np.median(used) < 40
    base, cur = paired_runs(rng, 1000, 300, 0.9, 0.9, agree=0.8)
    decision, used = first_decisions(base, cur)
    assert np.mean(decision == -1) > 0.95 and np.median(used) < 120


def test_sequential_decision_thresholds() -> None:
    # max_drop=0: concordant pairs carry no evidence; 0 discordant pairs decide nothing.
    assert sequential_decision(0, 0, 0) == "undecided"
    assert sequential_decision(0, 0, 5000) == "pass"  # 5000 identical episodes: no 10-point drop
    assert sequential_decision(12, 0, 0) == "regression"  # mixture e-value ~ 70 > 1/0.05
    assert sequential_decision(5, 0, 0) == "undecided"  # 1/32 for McNemar, but not anytime-valid evidence
    log_reg, _ = sequential_log_evalues(3, 1, 50)
    log_reg_more_concordant, _ = sequential_log_evalues(3, 1, 500)
    assert float(log_reg) == pytest.approx(float(log_reg_more_concordant))
    # With a tolerance, agreement counts against "regression".
    with_tol, _ = sequential_log_evalues(3, 1, 500, max_drop=0.05)
    assert float(with_tol) < float(log_reg)
    with pytest.raises(ValueError, match="detect_drop"):
        sequential_log_evalues(1, 1, 1, max_drop=0.1, detect_drop=0.05)


def test_sequential_test_object_latches_its_first_decision() -> None:
    test = SequentialTest(alpha=0.05, paired=True)
    for _ in range(12):
        decision = test.update(current=False, baseline=True)
    assert decision == "regression" and test.worse == 12
    for _ in range(200):
        test.update(current=True, baseline=False)  # evidence turns around; the decision stands
    assert test.decide() == "regression"
    with pytest.raises(ValueError, match="baseline"):
        test.update(current=True)


def test_unpaired_sequential_test_pairs_arrivals_first_in_first_out() -> None:
    test = SequentialTest(paired=False)
    for _ in range(3):
        test.update(current=False)
    assert test.n_pairs == 0  # nothing to pair with yet
    test.update(baseline=True)
    test.update(baseline=True)
    assert (test.worse, test.better, test.concordant) == (2, 0, 0)
    test.update(current=True, baseline=True)
    # Queue was [F] current, then T current and T baseline: F pairs with T (worse), T waits.
    assert (test.worse, test.better, test.concordant) == (3, 0, 0)


def test_record_scores_in_declared_order_whatever_the_completion_order() -> None:
    order = ["e0", "e1", "e2", "e3"]
    test = SequentialTest(order=order)
    test.record("e2", current=False, baseline=True)
    test.record("e1", current=True, baseline=True)
    assert test.n_pairs == 0  # e0 still running: nothing scored out of order
    test.record("e0", current=None)  # e0 errored: skipped, not scored
    assert (test.worse, test.concordant) == (1, 1)
    test.record("e3", current=True, baseline=False)
    assert (test.worse, test.better, test.concordant) == (1, 1, 1)
    with pytest.raises(ValueError, match="order"):
        SequentialTest().record("e0", True, True)
