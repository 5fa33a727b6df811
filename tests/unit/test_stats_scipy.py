"""The gate's exact tests and intervals against scipy.stats, wherever scipy has the same test.

``pytest_hud.stats.rates`` is written on numpy alone so that the core install needs no scipy (its docstring
says why); these tests hold it to scipy's answers on every small table, where off-by-ones live, and
on seeded random cases up to thousands of episodes (hypothesis runs derandomized, no database).

Tolerances, and why they are honest:

- Finite sums and closed forms (binomial tails, McNemar, Fisher, Wilson): 1e-9 relative. Both sides
  are exact up to rounding (ours sums exact log-factorials; the largest gap seen is 4e-11, on a cdf
  of 18,808 terms), while an off-by-one in a tail moves it by a whole pmf term.
- Boschloo and Barnard: 1e-5 relative. Both p-values are a maximum over the common success rate
  found numerically (ours: a 64-point grid zoomed in four times; scipy: ``shgo`` from ``n=32``
  Sobol points), so either may fall a little short of the true supremum. Over all 8,100 tables up
  to 12 episodes per side the largest gap was 1.3e-6 (scipy the lower); a wrong rejection region
  moves the p-value by a whole table's probability.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sp

from pytest_hud.stats import (
    binom_cdf, binom_pmf, binom_sf, boschloo_exact_one_sided, fisher_exact_one_sided, holm, holm_adjusted,
    mcnemar_exact_one_sided, unpaired_noninferiority_exact, wilson_interval,
)

EXACT = 1e-9  # relative, for sums and closed forms
MAXIMISED = 1e-5  # relative, for suprema over a nuisance parameter
TINY = 1e-300  # below this both sides are "zero" (scipy and we may underflow at different points)
RANDOM = settings(max_examples=100, deadline=None, derandomize=True, database=None)


def assert_close(ours: float, theirs: float, rel: float, what: str) -> None:
    # math.isclose with abs_tol=TINY: pytest.approx's default abs=1e-12 would wave tiny p-values through.
    assert math.isclose(ours, float(theirs), rel_tol=rel, abs_tol=TINY), f"{what}: ours {ours!r}, scipy {theirs!r}"


def two_sample_table(s_new: int, n_new: int, s_base: int, n_base: int) -> list[list[int]]:
    """scipy's layout for two binomial samples: one column per run, successes in the first row.

    With ``alternative="less"`` each of fisher_exact, boschloo_exact and barnard_exact then asks
    whether the first column (the new run) succeeds less often, which is our one-sided question.
    """
    return [[s_new, s_base], [n_new - s_new, n_base - s_base]]


def all_tables(max_n: int, min_n: int = 0):
    """Every (s_new, n_new, s_base, n_base) with both run sizes in min_n..max_n."""
    for n_new, n_base in itertools.product(range(min_n, max_n + 1), repeat=2):
        for s_new, s_base in itertools.product(range(n_new + 1), range(n_base + 1)):
            yield s_new, n_new, s_base, n_base


def random_tables(count: int, max_n: int, seed: int):
    """Seeded tables with the new run a little worse on average, so small p-values are common."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        n_new, n_base = (int(v) for v in rng.integers(4, max_n + 1, 2))
        rate = rng.uniform(0.2, 0.95)
        yield int(rng.binomial(n_new, rate - rng.uniform(0.0, 0.2))), n_new, int(rng.binomial(n_base, rate)), n_base


# --------------------------------------------------------------------------------------------------
# binomial tails and McNemar (scipy.stats.binom, scipy.stats.binomtest)
# --------------------------------------------------------------------------------------------------


def test_binomial_pmf_cdf_and_sf_match_scipy_on_a_grid() -> None:
    for n in range(31):
        ks = np.arange(-1, n + 2)
        for p in (0.0, 0.013, 0.3, 0.5, 0.77, 1.0):
            for k, pmf, cdf, sf in zip(ks, sp.binom.pmf(ks, n, p), sp.binom.cdf(ks, n, p), sp.binom.sf(ks, n, p)):
                args = f"k={k}, n={n}, p={p}"
                if 0 <= k <= n:
                    assert_close(binom_pmf(int(k), n, p), pmf, EXACT, f"pmf({args})")
                assert_close(binom_cdf(int(k), n, p), cdf, EXACT, f"cdf({args})")
                assert_close(binom_sf(int(k), n, p), sf, EXACT, f"sf({args})")


@RANDOM
@given(n=st.integers(1, 20_000), k_fraction=st.floats(0.0, 1.0), p=st.floats(0.0, 1.0))
def test_binomial_tails_match_scipy_at_thousands_of_trials(n: int, k_fraction: float, p: float) -> None:
    k = round(k_fraction * n)
    assert_close(binom_cdf(k, n, p), sp.binom.cdf(k, n, p), EXACT, f"cdf(k={k}, n={n}, p={p})")
    assert_close(binom_sf(k, n, p), sp.binom.sf(k, n, p), EXACT, f"sf(k={k}, n={n}, p={p})")


def mcnemar_by_scipy(worse: int, better: int) -> float:
    return sp.binomtest(worse, worse + better, 0.5, alternative="greater").pvalue


def test_mcnemar_matches_scipy_binomtest_on_every_small_count() -> None:
    assert mcnemar_exact_one_sided(0, 0) == 1.0  # no discordant pair: no evidence (binomtest needs n >= 1)
    for worse, better in itertools.product(range(41), repeat=2):
        if worse + better:
            assert_close(
                mcnemar_exact_one_sided(worse, better), mcnemar_by_scipy(worse, better), EXACT,
                f"McNemar(worse={worse}, better={better})",
            )


@RANDOM
@given(worse=st.integers(0, 6000), better=st.integers(0, 6000))
def test_mcnemar_matches_scipy_past_the_exact_integer_path(worse: int, better: int) -> None:
    # Beyond 2000 discordant pairs we switch from integer sums to binom_sf; both must agree with scipy.
    if worse + better:
        assert_close(
            mcnemar_exact_one_sided(worse, better), mcnemar_by_scipy(worse, better), EXACT,
            f"McNemar(worse={worse}, better={better})",
        )


# --------------------------------------------------------------------------------------------------
# Fisher (scipy.stats.fisher_exact)
# --------------------------------------------------------------------------------------------------


def fisher_by_scipy(s_new: int, n_new: int, s_base: int, n_base: int) -> float:
    return sp.fisher_exact(two_sample_table(s_new, n_new, s_base, n_base), alternative="less").pvalue


def test_fisher_matches_scipy_on_every_table_up_to_8_per_side() -> None:
    for table in all_tables(8):
        assert_close(fisher_exact_one_sided(*table), fisher_by_scipy(*table), EXACT, f"Fisher{table}")


@RANDOM
@given(
    n_new=st.integers(1, 1000), n_base=st.integers(1, 1000),
    new_fraction=st.floats(0.0, 1.0), base_fraction=st.floats(0.0, 1.0),
)
def test_fisher_matches_scipy_on_large_tables(n_new: int, n_base: int, new_fraction: float, base_fraction: float) -> None:
    table = (round(new_fraction * n_new), n_new, round(base_fraction * n_base), n_base)
    assert_close(fisher_exact_one_sided(*table), fisher_by_scipy(*table), EXACT, f"Fisher{table}")


# --------------------------------------------------------------------------------------------------
# Boschloo (scipy.stats.boschloo_exact); scipy takes ~15 ms a table, hence the small grid
# --------------------------------------------------------------------------------------------------


def boschloo_by_scipy(s_new: int, n_new: int, s_base: int, n_base: int) -> float:
    return sp.boschloo_exact(two_sample_table(s_new, n_new, s_base, n_base), alternative="less").pvalue


def test_boschloo_matches_scipy_on_every_table_up_to_3_per_side() -> None:
    for table in all_tables(3, min_n=1):
        assert_close(boschloo_exact_one_sided(*table), boschloo_by_scipy(*table), MAXIMISED, f"Boschloo{table}")


@pytest.mark.parametrize(
    "table",
    [
        (2, 12, 8, 12),  # the largest gap on the 12-per-side grid: scipy's optimiser stops 1.3e-6 short
        (0, 20, 20, 20),  # p = 2^-40 ~ 9e-13: the tolerance is relative, not absolute
        *random_tables(16, max_n=150, seed=20240611),
    ],
)
def test_boschloo_matches_scipy_on_larger_tables(table: tuple[int, int, int, int]) -> None:
    assert_close(boschloo_exact_one_sided(*table), boschloo_by_scipy(*table), MAXIMISED, f"Boschloo{table}")


# --------------------------------------------------------------------------------------------------
# Barnard (scipy.stats.barnard_exact): our non-inferiority test at max_drop = 0 is the same test
# --------------------------------------------------------------------------------------------------


def pooled_z_exact(s_new: int, n_new: int, s_base: int, n_base: int) -> Fraction:
    """Signed square of the pooled z for "new is lower", in exact arithmetic (0 when the rates tie)."""
    diff = Fraction(s_base, n_base) - Fraction(s_new, n_new)
    if diff == 0:
        return Fraction(0)
    pooled = Fraction(s_new + s_base, n_new + n_base)
    variance = pooled * (1 - pooled) * (Fraction(1, n_new) + Fraction(1, n_base))
    return (1 if diff > 0 else -1) * diff * diff / variance


def has_exact_tie(s_new: int, n_new: int, s_base: int, n_base: int) -> bool:
    """Whether another table's statistic equals the observed one in exact arithmetic."""
    observed = pooled_z_exact(s_new, n_new, s_base, n_base)
    return any(
        (x, y) != (s_new, s_base) and pooled_z_exact(x, n_new, y, n_base) == observed
        for x, y in itertools.product(range(n_new + 1), range(n_base + 1))
    )


def barnard_by_scipy(s_new: int, n_new: int, s_base: int, n_base: int) -> float:
    table = two_sample_table(s_new, n_new, s_base, n_base)
    return sp.barnard_exact(table, alternative="less", pooled=True).pvalue


def test_noninferiority_at_zero_margin_matches_scipy_barnard() -> None:
    # With max_drop = 0 the Farrington-Manning score is the pooled z, so this is Barnard's test.
    # Tables whose statistic ties another table's in exact arithmetic are left out: scipy compares
    # the floating-point statistics with no tolerance and drops such ties (scipy issue #18798);
    # the next test checks those tables against exact arithmetic instead.
    tables = [*all_tables(3, min_n=1), *random_tables(40, max_n=10, seed=7)]
    compared = 0
    for table in tables:
        if has_exact_tie(*table):
            continue
        compared += 1
        assert_close(
            unpaired_noninferiority_exact(*table, 0.0), barnard_by_scipy(*table), MAXIMISED, f"Barnard{table}"
        )
    assert compared >= 60  # the filter must not quietly empty the comparison (77 of 121 tables today)


@pytest.mark.parametrize("table", [(0, 6, 5, 6), (1, 3, 3, 3), (1, 2, 5, 7)])
def test_noninferiority_keeps_tables_that_tie_in_exact_arithmetic(table: tuple[int, int, int, int]) -> None:
    # Each of these has another table with exactly the same pooled z, e.g. new 0/6 vs base 5/6 and
    # new 1/6 vs base 6/6 (both z^2 = 60/7). scipy 1.17 drops the twin and reports a p-value too
    # small (0.00194 for the first; the right answer is 13/4096 = 0.00317).
    s_new, n_new, s_base, n_base = table
    assert has_exact_tie(*table)
    observed = pooled_z_exact(*table)
    region = [
        (x, y)
        for x, y in itertools.product(range(n_new + 1), range(n_base + 1))
        if pooled_z_exact(x, n_new, y, n_base) >= observed
    ]
    rates = np.linspace(0.0, 1.0, 20_001)
    size = sum(sp.binom.pmf(x, n_new, rates) * sp.binom.pmf(y, n_base, rates) for x, y in region)
    ours = unpaired_noninferiority_exact(*table, 0.0)
    assert_close(ours, float(np.max(size)), MAXIMISED, f"exact region{table}")
    # scipy's region is a subset of the exact one, so its p-value can only be smaller (or, once
    # #18798 is fixed, the same).
    assert ours >= barnard_by_scipy(*table) * (1.0 - MAXIMISED)


# --------------------------------------------------------------------------------------------------
# Wilson interval (scipy.stats.binomtest(...).proportion_ci(method="wilson"))
# --------------------------------------------------------------------------------------------------


def wilson_by_scipy(successes: int, n: int, confidence: float) -> tuple[float, float]:
    ci = sp.binomtest(successes, n).proportion_ci(confidence_level=confidence, method="wilson")
    return float(ci.low), float(ci.high)


def test_wilson_matches_scipy_on_a_grid() -> None:
    for n in range(1, 26):  # scipy takes ~1 ms an interval
        for successes in range(n + 1):
            for confidence in (0.5, 0.95, 0.999):
                ours, theirs = wilson_interval(successes, n, confidence), wilson_by_scipy(successes, n, confidence)
                # Ends lie in [0, 1], so an absolute tolerance is the honest one; 0/n and n/n are pinned.
                assert ours == pytest.approx(theirs, rel=0, abs=1e-12), (successes, n, confidence)


@RANDOM
@given(n=st.integers(1, 100_000), fraction=st.floats(0.0, 1.0), confidence=st.floats(0.5, 0.9999))
def test_wilson_matches_scipy_at_large_n(n: int, fraction: float, confidence: float) -> None:
    successes = round(fraction * n)
    assert wilson_interval(successes, n, confidence) == pytest.approx(
        wilson_by_scipy(successes, n, confidence), rel=0, abs=1e-12
    )


# --------------------------------------------------------------------------------------------------
# Holm: no scipy equivalent (statsmodels has one, but is no dependency), so check the definition
# --------------------------------------------------------------------------------------------------


def holm_by_closed_testing(pvalues: dict[str, float]) -> dict[str, float]:
    """Adjusted p-values of closed testing with Bonferroni local tests, which Holm's procedure is.

    H_i is rejected at alpha iff every intersection hypothesis containing it is: for every subset S
    holding i, ``|S| * min(p_j, j in S) <= alpha``. The adjusted p-value is the largest of those.
    """
    keys = list(pvalues)
    return {
        key: max(
            min(1.0, len(subset) * min(pvalues[j] for j in subset))
            for size in range(1, len(keys) + 1)
            for subset in itertools.combinations(keys, size)
            if key in subset
        )
        for key in keys
    }


# Ties among the p-values are where a step-down implementation slips, so draw many from a small set.
pvalue = st.one_of(st.sampled_from([0.0, 0.001, 0.01, 0.0125, 0.02, 0.025, 0.05, 0.2, 1.0]), st.floats(0.0, 1.0))


@RANDOM
@given(pvalues=st.dictionaries(st.sampled_from("abcdefg"), pvalue, max_size=7), alpha=st.floats(0.001, 0.2))
def test_holm_is_closed_testing_with_bonferroni(pvalues: dict[str, float], alpha: float) -> None:
    expected = holm_by_closed_testing(pvalues)
    assert holm_adjusted(pvalues) == pytest.approx(expected, rel=1e-12, abs=0)
    assert holm(pvalues, alpha) == {key: expected[key] <= alpha for key in pvalues}


# --------------------------------------------------------------------------------------------------
# robustness levels against their reference (compare_levels): the same tests scipy runs, then Holm
# --------------------------------------------------------------------------------------------------


def test_compare_levels_matches_scipy_paired_and_unpaired_tests_with_holm() -> None:
    from pytest_hud.stats import compare_levels

    rng = np.random.default_rng(5)
    for _ in range(20):
        n = int(rng.integers(4, 25))
        reference = {s: bool(rng.random() < 0.9) for s in range(n)}
        paired = {s: bool(rng.random() < rng.uniform(0.2, 1.0)) for s in range(n)}
        unpaired = {1000 + s: bool(rng.random() < 0.5) for s in range(int(rng.integers(3, 20)))}
        out = compare_levels(reference, {"paired": paired, "unpaired": unpaired})
        worse = sum(reference[s] and not paired[s] for s in range(n))
        better = sum(paired[s] and not reference[s] for s in range(n))
        p_paired = 1.0 if worse == 0 else sp.binomtest(worse, worse + better, 0.5, alternative="greater").pvalue
        p_unpaired = boschloo_by_scipy(sum(unpaired.values()), len(unpaired), sum(reference.values()), n)
        assert out["paired"].test == "paired-mcnemar" and out["unpaired"].test == "unpaired-boschloo"
        assert_close(out["paired"].p_value, p_paired, EXACT, "paired level")
        assert_close(out["unpaired"].p_value, p_unpaired, MAXIMISED, "unpaired level")
        low, high = sorted([out["paired"].p_value, out["unpaired"].p_value])
        holm_low, holm_high = min(1.0, 2 * low), min(1.0, max(2 * low, high))  # Holm by its definition
        assert sorted([out["paired"].adjusted_p, out["unpaired"].adjusted_p]) == pytest.approx([holm_low, holm_high])
