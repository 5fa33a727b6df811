"""The score tests against scipy: the exact signed-rank and rank-sum tests, with ties by enumeration,
and the seeded Monte-Carlo permutation test beyond the exact budget."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats as sp

from pytest_hud.stats import scores
from pytest_hud.stats.scores import (rank_sum_one_sided, score_detectable_drop, score_episodes_needed,
                                     signed_rank_exact_one_sided)


def test_signed_rank_is_scipys_exact_wilcoxon_without_ties():
    rng = np.random.default_rng(3)
    for n in (1, 2, 5, 12, 25):
        for _ in range(8):
            d = rng.normal(0.1, 0.3, n)
            expected = sp.wilcoxon(d, alternative="greater", method="exact").pvalue
            assert signed_rank_exact_one_sided(d) == pytest.approx(expected, rel=1e-9)


def test_signed_rank_with_ties_and_zeros_is_the_sign_flip_enumeration_of_mid_ranks():
    d = np.array([0.2, 0.2, -0.1, 0.0, 0.5, -0.2, 0.1, 0.1])
    nonzero = d[d != 0]
    ranks = sp.rankdata(np.abs(nonzero))
    observed = ranks[nonzero > 0].sum()
    flips = [sum(r for r, s in zip(ranks, signs, strict=True) if s)
             for signs in itertools.product((0, 1), repeat=len(ranks))]
    expected = np.mean(np.array(flips) >= observed - 1e-9)
    assert signed_rank_exact_one_sided(d) == pytest.approx(expected, rel=1e-12)
    assert signed_rank_exact_one_sided([0.0, 0.0]) == 1.0


def test_rank_sum_is_scipys_exact_mann_whitney_without_ties():
    rng = np.random.default_rng(4)
    for n_base, n_cur in ((1, 1), (3, 5), (10, 7), (20, 20)):
        for _ in range(6):
            base, cur = rng.random(n_base), rng.random(n_cur) - 0.2
            expected = sp.mannwhitneyu(cur, base, alternative="less", method="exact").pvalue
            assert rank_sum_one_sided(base, cur) == pytest.approx(expected, rel=1e-9)


def test_rank_sum_with_ties_is_scipys_exact_permutation_test_on_mid_ranks():
    base = np.array([1.0, 1.0, 0.8, 0.5, 0.5, 0.0])
    cur = np.array([0.5, 0.0, 0.0, 1.0, 0.2])

    def rank_sum(x, y):
        return sp.rankdata(np.concatenate([x, y]))[:len(x)].sum()

    expected = sp.permutation_test((cur, base), rank_sum, permutation_type="independent", alternative="less",
                                   n_resamples=np.inf).pvalue
    assert rank_sum_one_sided(base, cur) == pytest.approx(expected, rel=1e-9)


def test_beyond_the_exact_budget_the_permutation_p_value_is_seeded_and_close(monkeypatch):
    rng = np.random.default_rng(5)
    base, cur = rng.random(30), rng.random(30) - 0.15
    exact = rank_sum_one_sided(base, cur)
    monkeypatch.setattr(scores, "EXACT_BUDGET", 0)
    sampled = rank_sum_one_sided(base, cur)
    assert sampled == rank_sum_one_sided(base, cur)  # the same on every run
    assert abs(sampled - exact) < 4 * np.sqrt(exact * (1 - exact) / scores.PERMUTATIONS) + 1e-4


def test_bad_scores_are_named():
    with pytest.raises(ValueError, match="not a finite number"):
        signed_rank_exact_one_sided([0.1, float("nan")])


def test_the_detectable_drop_shrinks_with_episodes_and_is_infinite_where_alpha_is_out_of_reach():
    assert score_detectable_drop(3, 0.2, alpha=0.05, power=0.8) == float("inf")  # 1/8 > 0.05
    assert score_detectable_drop(100, 0.2, alpha=0.05, power=0.8) < score_detectable_drop(25, 0.2, alpha=0.05,
                                                                                          power=0.8)
    n = score_episodes_needed(0.1, 0.2, alpha=0.05, power=0.8, paired=True)
    assert score_detectable_drop(n, 0.2, alpha=0.05, power=0.8) <= 0.1 < score_detectable_drop(
        n - 1, 0.2, alpha=0.05, power=0.8)


def test_the_signed_rank_test_keeps_its_level_and_catches_a_real_drop():
    rng = np.random.default_rng(6)
    null = np.mean([signed_rank_exact_one_sided(rng.normal(0, 0.2, 20)) <= 0.05 for _ in range(400)])
    drop = np.mean([signed_rank_exact_one_sided(rng.normal(0.15, 0.2, 20)) <= 0.05 for _ in range(200)])
    assert null <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / 400) and drop >= 0.8


def test_the_rank_sum_stratified_by_task_is_not_fooled_by_a_shifted_task_mix():
    from pytest_hud.stats import stratified_rank_sum_one_sided

    rng = np.random.default_rng(8)
    assert stratified_rank_sum_one_sided([([0.9, 0.8, 0.7], [0.1, 0.2, 0.3])]) == rank_sum_one_sided(
        [0.9, 0.8, 0.7], [0.1, 0.2, 0.3])  # one task: the exact test
    pooled = stratified = 0
    runs = 100
    for _ in range(runs):
        # an easy task (scores near 0.9) and a hard one (near 0.3); the level lost most easy episodes to errors
        easy_ref, hard_ref = rng.normal(0.9, 0.05, 20), rng.normal(0.3, 0.05, 20)
        easy_cur, hard_cur = rng.normal(0.9, 0.05, 5), rng.normal(0.3, 0.05, 20)
        pooled += rank_sum_one_sided(np.r_[easy_ref, hard_ref], np.r_[easy_cur, hard_cur]) <= 0.05
        stratified += stratified_rank_sum_one_sided([(easy_ref, easy_cur), (hard_ref, hard_cur)]) <= 0.05
    assert stratified / runs <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / runs) and pooled / runs > 0.5
