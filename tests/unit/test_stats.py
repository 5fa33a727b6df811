"""Statistics behind the summary and the gate, by hand: the binomial building blocks, the Wilson
interval, the exact tests, Holm, and the power calculations (their error rates by simulation are in
``test_stats_simulated.py``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pytest_hud.stats import (
    binom_cdf, binom_pmf, binom_sf, boschloo_exact_one_sided, episodes_needed, episodes_needed_for_floor,
    fisher_exact_one_sided, holm, holm_adjusted, mcnemar_exact_one_sided, minimum_detectable_drop,
    paired_noninferiority_exact, paired_power, unpaired_noninferiority_exact, unpaired_power, wilson_interval,
)

ALPHA = 0.05


# --------------------------------------------------------------------------------------------------
# binomial building blocks
# --------------------------------------------------------------------------------------------------


def test_binomial_pmf_cdf_and_sf_match_hand_values() -> None:
    # Bin(5, 0.3): P(X = 2) = C(5,2) 0.3^2 0.7^3 = 10 * 0.09 * 0.343
    assert binom_pmf(2, 5, 0.3) == pytest.approx(0.3087, rel=1e-12)
    # Bin(4, 1/2): P(X <= 1) = (1 + 4) / 16, P(X > 1) = (6 + 4 + 1) / 16
    assert binom_cdf(1, 4, 0.5) == pytest.approx(5 / 16, rel=1e-12)
    assert binom_sf(1, 4, 0.5) == pytest.approx(11 / 16, rel=1e-12)
    assert binom_cdf(-1, 4, 0.5) == 0.0 and binom_cdf(4, 4, 0.5) == 1.0
    assert binom_sf(4, 4, 0.5) == 0.0 and binom_sf(-1, 4, 0.5) == 1.0


def test_binomial_tails_keep_their_digits_far_out() -> None:
    # P(X = 0) for Bin(1000, 1/2) is 2^-1000 ~ 9.3e-302: a linear-space sum or 1 - cdf would give 0.
    assert binom_cdf(0, 1000, 0.5) == pytest.approx(2.0**-1000, rel=1e-9)
    assert binom_sf(999, 1000, 0.5) == pytest.approx(2.0**-1000, rel=1e-9)


def test_binomial_handles_certain_events() -> None:
    assert binom_pmf(0, 7, 0.0) == 1.0
    assert binom_pmf(7, 7, 1.0) == 1.0
    assert binom_pmf(3, 7, 1.0) == 0.0


# --------------------------------------------------------------------------------------------------
# Wilson interval
# --------------------------------------------------------------------------------------------------


def test_wilson_interval_for_8_of_10_is_the_textbook_value() -> None:
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.4902, abs=5e-5)
    assert high == pytest.approx(0.9433, abs=5e-5)


def test_wilson_interval_edges() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)
    low, high = wilson_interval(0, 10)
    assert low == 0.0 and 0.0 < high < 0.35
    low, high = wilson_interval(10, 10)
    assert high == 1.0 and 0.65 < low < 1.0


def test_wilson_interval_widens_with_confidence_and_narrows_with_n() -> None:
    assert wilson_interval(8, 10, 0.99)[0] < wilson_interval(8, 10, 0.95)[0]
    assert wilson_interval(80, 100)[1] - wilson_interval(80, 100)[0] < 0.2
    assert wilson_interval(80, 100)[0] > wilson_interval(8, 10)[0]


@pytest.mark.parametrize("args", [(11, 10), (-1, 10), (3, -1)])
def test_wilson_interval_rejects_impossible_counts(args: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match="successes"):
        wilson_interval(*args)


def test_floor_episode_count_makes_the_upper_bound_drop_below_the_floor() -> None:
    needed = episodes_needed_for_floor(0.5, 0.6)
    assert needed is not None
    assert wilson_interval(needed // 2, 2 * (needed // 2))[1] == pytest.approx(0.6, abs=0.005)
    assert wilson_interval(needed, 2 * needed)[1] < 0.6 < wilson_interval(needed // 4, 2 * (needed // 4))[1]
    assert episodes_needed_for_floor(0.7, 0.6) is None


# --------------------------------------------------------------------------------------------------
# exact tests
# --------------------------------------------------------------------------------------------------


def test_mcnemar_counts_only_discordant_pairs() -> None:
    # 8 worse, 1 better: P(X >= 8 | Bin(9, 1/2)) = (C(9,8) + C(9,9)) / 2^9 = 10/512
    assert mcnemar_exact_one_sided(8, 1) == 10 / 512
    assert mcnemar_exact_one_sided(5, 0) == 1 / 32
    # 3 worse, 3 better: (C(6,3) + C(6,4) + C(6,5) + C(6,6)) / 64 = 42/64
    assert mcnemar_exact_one_sided(3, 3) == 42 / 64
    assert mcnemar_exact_one_sided(0, 5) == 1.0
    assert mcnemar_exact_one_sided(0, 0) == 1.0


def test_mcnemar_large_counts_agree_with_the_log_space_tail() -> None:
    # n = 2000 uses exact integers; binom_sf is the log-space path used beyond that.
    assert mcnemar_exact_one_sided(1060, 940) == pytest.approx(binom_sf(1059, 2000, 0.5), rel=1e-9)
    assert 0.0 < mcnemar_exact_one_sided(1100, 950) < 0.001


def test_fisher_one_sided_small_tables_by_hand() -> None:
    # new 1/5 vs base 5/5: 6 successes in total; the new arm has at least 1 of them, and the observed
    # table is the only one as extreme: C(5,1) C(5,5) / C(10,6) = 5/210 = 1/42.
    assert fisher_exact_one_sided(1, 5, 5, 5) == pytest.approx(1 / 42, rel=1e-12)
    # new 2/6 vs base 5/6: 7 successes; x_new in {1, 2}: (C(6,1)C(6,6) + C(6,2)C(6,5)) / C(12,7)
    # = (6 + 90) / 792 = 4/33.
    assert fisher_exact_one_sided(2, 6, 5, 6) == pytest.approx(4 / 33, rel=1e-12)
    # A better new policy is no evidence of a drop.
    assert fisher_exact_one_sided(5, 5, 1, 5) == pytest.approx(1.0)
    assert fisher_exact_one_sided(0, 0, 3, 5) == 1.0


def test_boschloo_by_hand_on_tiny_tables() -> None:
    # new 0/1 vs base 1/1: only that table has Fisher p <= 1/2, so p = max_pi (1 - pi) pi = 1/4.
    assert boschloo_exact_one_sided(0, 1, 1, 1) == pytest.approx(0.25, abs=1e-9)
    # new 0/2 vs base 2/2: Fisher says 1/6; the region is that table alone, max (1-pi)^2 pi^2 = 1/16.
    assert fisher_exact_one_sided(0, 2, 2, 2) == pytest.approx(1 / 6)
    assert boschloo_exact_one_sided(0, 2, 2, 2) == pytest.approx(1 / 16, abs=1e-9)


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        # Cross-checked with scipy 1.17 stats.boschloo_exact([[s_new, s_base], [f_new, f_base]], "less").
        ((30, 50, 40, 50), 0.017601001148428),
        ((60, 100, 75, 100), 0.014062708873170),
        ((11, 14, 2, 2), 0.419104725057446),
    ],
)
def test_boschloo_matches_reference_values(table: tuple[int, int, int, int], expected: float) -> None:
    assert boschloo_exact_one_sided(*table) == pytest.approx(expected, rel=1e-6)


def test_boschloo_is_never_less_powerful_than_fisher() -> None:
    rng = np.random.default_rng(7)
    for _ in range(40):
        n_new, n_base = (int(v) for v in rng.integers(1, 40, 2))
        s_new, s_base = int(rng.integers(0, n_new + 1)), int(rng.integers(0, n_base + 1))
        assert boschloo_exact_one_sided(s_new, n_new, s_base, n_base) <= fisher_exact_one_sided(
            s_new, n_new, s_base, n_base
        ) + 1e-12


def test_boschloo_at_500_episodes_per_side() -> None:
    # no wall-clock bound here (a loaded CI machine is no measurement): its speed is the docstring's
    p = boschloo_exact_one_sided(400, 500, 430, 500)
    assert p == pytest.approx(0.00622207, rel=1e-4)  # below Fisher's 0.00723


def test_noninferiority_tests_by_hand_with_one_episode() -> None:
    # Unpaired, base 1/1 vs new 0/1, tolerance 0.1: only the observed table is as extreme, so
    # p = max over p_base in [0.1, 1] of p_base * (1 - (p_base - 0.1)) = (1.1 / 2)^2.
    assert unpaired_noninferiority_exact(0, 1, 1, 1, 0.1) == pytest.approx(0.3025, abs=1e-6)
    # Paired, one pair that got worse: p = max P(worse) = (1 - 0.1) / 2 + 0.1 = 0.55.
    assert paired_noninferiority_exact(1, 0, 1, 0.1) == pytest.approx(0.55, abs=1e-6)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        # Cross-checked by brute force (restricted MLE by scipy.optimize, 4001-point grid supremum).
        (("unpaired", 5, 10, 9, 10, 0.1), 0.0830467816),
        (("unpaired", 12, 20, 18, 20, 0.05), 0.0397446421),
        (("paired", 4, 0, 10, 0.05), 0.0427201626),
        (("paired", 5, 1, 12, 0.1), 0.1754094335),
    ],
)
def test_noninferiority_tests_match_brute_force(args: tuple, expected: float) -> None:
    kind, *counts = args
    test = unpaired_noninferiority_exact if kind == "unpaired" else paired_noninferiority_exact
    assert test(*counts) == pytest.approx(expected, rel=1e-6)


def test_a_drop_within_the_tolerance_is_not_significant() -> None:
    # 16 of 400 pairs got worse, none better: a 4-point drop. Without tolerance that is decisive...
    assert mcnemar_exact_one_sided(16, 0) < 1e-4
    # ...with a 5-point tolerance it is nothing.
    assert paired_noninferiority_exact(16, 0, 400, 0.05) > 0.5
    # Unpaired: 45/50 vs 47/50 is a 4-point drop.
    assert unpaired_noninferiority_exact(45, 50, 47, 50, 0.05) > 0.5
    # And a larger tolerance never makes the evidence stronger.
    wider, narrower = (unpaired_noninferiority_exact(30, 50, 45, 50, margin) for margin in (0.1, 0.0))
    assert wider > narrower


# --------------------------------------------------------------------------------------------------
# Holm
# --------------------------------------------------------------------------------------------------


def test_holm_adjusts_step_down() -> None:
    # Sorted 0.01, 0.03, 0.04 -> 3*0.01, 2*0.03, max(0.06, 1*0.04) = 0.03, 0.06, 0.06
    adjusted = holm_adjusted({"a": 0.01, "b": 0.04, "c": 0.03})
    assert adjusted == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06})
    assert holm({"a": 0.01, "b": 0.04, "c": 0.03}, alpha=0.05) == {"a": True, "b": False, "c": False}


def test_holm_rejects_what_bonferroni_would_not() -> None:
    # Bonferroni: 2 * 0.04 = 0.08 > 0.05. Holm: a at 2 * 0.02 = 0.04, then b at 1 * 0.04.
    assert holm({"a": 0.02, "b": 0.04}, alpha=0.05) == {"a": True, "b": True}
    assert holm({"only": 0.049}) == {"only": True}
    assert holm({"x": 0.6, "y": 0.9}) == {"x": False, "y": False}
    assert holm_adjusted({}) == {}


def test_holm_caps_at_one_and_refuses_non_probabilities() -> None:
    assert holm_adjusted({"a": 0.6, "b": 0.7}) == {"a": 1.0, "b": 1.0}
    with pytest.raises(ValueError, match="'a'"):
        holm_adjusted({"a": 1.5})


# --------------------------------------------------------------------------------------------------
# power, minimum detectable drop, episodes needed
# --------------------------------------------------------------------------------------------------


def test_exact_paired_power_by_hand() -> None:
    # Every pair discordant and worse: 5 pairs give p = 1/32 <= 0.05, 4 pairs can at best give 1/16.
    assert paired_power(5, 1.0, discordance=1.0) == pytest.approx(1.0)
    assert paired_power(4, 1.0, discordance=1.0) == 0.0
    # Half the pairs discordant, all worse: rejection needs all 5 discordant: 0.5^5.
    assert paired_power(5, 0.5, discordance=0.5) == pytest.approx(1 / 32)


def test_minimum_detectable_drop_and_episodes_needed_agree() -> None:
    for paired in (True, False):
        n = episodes_needed(0.15, baseline_rate=0.85, paired=paired)
        assert n is not None and 20 < n < 300
        assert minimum_detectable_drop(n, baseline_rate=0.85, paired=paired) <= 0.15 + 1e-3
        assert minimum_detectable_drop(n // 2, baseline_rate=0.85, paired=paired) > 0.15


def test_minimum_detectable_drop_shrinks_with_n_and_with_agreement() -> None:
    drops = [minimum_detectable_drop(n, baseline_rate=0.8, paired=True) for n in (10, 50, 200)]
    assert drops[0] > drops[1] > drops[2]
    # Seeded sims that mostly agree with themselves detect smaller drops than independent runs.
    assert minimum_detectable_drop(100, baseline_rate=0.8, paired=True, discordance=0.05) < drops[1] / 2
    # Ten episodes cannot see a 10-point drop; a strict level makes it worse.
    assert minimum_detectable_drop(10, baseline_rate=0.9, paired=False) > 0.4
    assert math.isinf(minimum_detectable_drop(3, baseline_rate=0.9, paired=True))


def test_episodes_needed_refuses_impossible_requests() -> None:
    # A 30-episode baseline cannot support detecting 10 points at 80% power, however large the run.
    assert episodes_needed(0.1, baseline_rate=0.9, paired=False, n_baseline=30) is None
    assert episodes_needed(0.1, baseline_rate=0.9, paired=False, n_baseline=300) is not None
    with pytest.raises(ValueError, match="max_drop"):
        episodes_needed(0.05, baseline_rate=0.9, paired=True, max_drop=0.05)
    with pytest.raises(ValueError, match="baseline_rate"):
        episodes_needed(0.5, baseline_rate=0.3, paired=True)


def _region_power_by_brute_force(n: int, m: int, drop: float, p0: float, alpha: float, max_drop: float) -> float:
    """Sum, over every table the gate's own test flags, of that table's probability."""
    total = 0.0
    for i in range(n + 1):
        for j in range(m + 1):
            p = (boschloo_exact_one_sided(i, n, j, m) if max_drop == 0.0
                 else unpaired_noninferiority_exact(i, n, j, m, max_drop))
            if p <= alpha:
                total += binom_pmf(i, n, p0 - drop) * binom_pmf(j, m, p0)
    return total


@pytest.mark.parametrize("n, m, drop, p0, alpha, max_drop", [
    (13, 32, 0.133, 1.0, 0.05, 0.0),  # a perfect baseline: the normal approximation said 0.80
    (44, 10, 0.10, 1.0, 0.05, 0.0),  # and here 0.80 against 0.003
    (8, 8, 0.3, 0.8, 0.05, 0.0),
    (20, 15, 0.25, 0.7, 0.01, 0.0),
    (12, 10, 0.3, 0.9, 0.05, 0.1),  # with a tolerance: the Farrington-Manning test's region
    (15, 9, 0.2, 0.5, 0.05, 0.05),
])
def test_unpaired_power_is_the_probability_of_the_tests_own_rejection_region(n, m, drop, p0, alpha, max_drop):
    exact = unpaired_power(n, m, drop, baseline_rate=p0, alpha=alpha, max_drop=max_drop)
    assert exact == pytest.approx(_region_power_by_brute_force(n, m, drop, p0, alpha, max_drop), abs=1e-9)


@pytest.mark.parametrize("p0", [0.5, 0.8, 0.9, 0.95, 0.99, 1.0])
def test_beyond_the_exact_sizes_the_unpaired_power_never_exceeds_the_tests_own(p0) -> None:
    """250 episodes a side is just past the exact computation: the approximation that takes over
    must not claim more power than the test has (the gate would say pass without it)."""
    from pytest_hud.stats.binomial import _binom_pmf_matrix
    from pytest_hud.stats.power import _unpaired_rejection_region

    region = _unpaired_rejection_region(250, 250, 0.05, 0.0).astype(float)
    for drop in (0.01, 0.03, 0.05, 0.1):
        if drop > p0:
            continue
        exact = _binom_pmf_matrix(250, np.array([p0 - drop]))[0] @ region @ _binom_pmf_matrix(250, np.array([p0]))[0]
        assert unpaired_power(250, 250, drop, baseline_rate=p0) <= exact + 1e-9, (p0, drop)


def test_a_small_perfect_baseline_cannot_show_a_ten_point_drop_however_many_episodes_run() -> None:
    assert unpaired_power(44, 10, 0.10, baseline_rate=1.0) < 0.01
    assert episodes_needed(0.10, baseline_rate=1.0, paired=False, n_baseline=10) is None
    # beyond the exact sizes, the approximation does not take a perfect baseline as certainty either
    assert unpaired_power(20_000, 10, 0.10, baseline_rate=1.0) < 0.8


def test_unpaired_power_at_the_minimum_detectable_drop_is_about_the_target() -> None:
    """Simulate Boschloo's test at the drop the (normal) planning formula says it detects 80% of the time."""
    rng = np.random.default_rng(11)
    n, p0 = 50, 0.8
    drop = minimum_detectable_drop(n, baseline_rate=p0, paired=False)
    sims = 1500
    new = rng.binomial(n, p0 - drop, sims)
    base = rng.binomial(n, p0, sims)
    cache: dict[tuple[int, int], bool] = {}
    flagged = 0
    for s_new, s_base in zip(new.tolist(), base.tolist()):
        if (s_new, s_base) not in cache:
            cache[s_new, s_base] = boschloo_exact_one_sided(s_new, n, s_base, n) <= ALPHA
        flagged += cache[s_new, s_base]
    power = flagged / sims
    print(f"unpaired n={n}, {p0:.0%} -> {p0 - drop:.1%}: simulated Boschloo power {power:.3f} (target 0.8)")
    assert 0.72 <= power <= 0.9
    assert unpaired_power(n, n, drop, baseline_rate=p0) == pytest.approx(0.8, abs=0.01)
