"""The exact test stratified by task: against scipy, and by Monte Carlo on error-shifted task mixes
(the family-wise false-alarm rate stays under alpha; power on a real drop is kept)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats as sp

from pytest_hud.stats import compare_levels, stratified_difference, stratified_exact_one_sided


def test_one_task_is_fishers_exact_test():
    for s_new, n_new, s_base, n_base in itertools.product(range(0, 9, 2), (8,), range(0, 11, 3), (10,)):
        table = [[s_new, n_new - s_new], [s_base, n_base - s_base]]
        expected = sp.fisher_exact(table, alternative="less").pvalue
        assert stratified_exact_one_sided([(s_new, n_new, s_base, n_base)]) == pytest.approx(expected, rel=1e-9)


def brute_force(tables):
    """P(sum X_k <= observed) over every combination of each task's hypergeometric outcome (scipy's pmf)."""
    supports = []
    for s_new, n_new, s_base, n_base in tables:
        dist = sp.hypergeom(n_new + n_base, s_new + s_base, n_new)  # successes drawn into the level's n_new
        xs = range(max(0, s_new + s_base - n_base), min(n_new, s_new + s_base) + 1)
        supports.append([(x, dist.pmf(x)) for x in xs])
    observed = sum(t[0] for t in tables)
    return sum(np.prod([p for _, p in combo]) for combo in itertools.product(*supports)
               if sum(x for x, _ in combo) <= observed)


def test_several_tasks_are_the_convolution_of_their_hypergeometric_laws():
    rng = np.random.default_rng(7)
    for _ in range(60):
        tables = []
        for _ in range(int(rng.integers(2, 4))):
            n_new, n_base = int(rng.integers(1, 9)), int(rng.integers(1, 9))
            tables.append((int(rng.integers(0, n_new + 1)), n_new, int(rng.integers(0, n_base + 1)), n_base))
        assert stratified_exact_one_sided(tables) == pytest.approx(brute_force(tables), rel=1e-9, abs=1e-15)


def test_a_task_on_one_side_only_carries_nothing_and_nothing_left_is_p_one():
    assert stratified_exact_one_sided([(0, 5, 5, 5), (3, 4, 0, 0)]) == stratified_exact_one_sided([(0, 5, 5, 5)])
    assert stratified_exact_one_sided([(0, 0, 5, 5)]) == 1.0
    assert stratified_difference([(0, 0, 5, 5)]) is None
    with pytest.raises(ValueError, match="s_new"):
        stratified_exact_one_sided([(6, 5, 5, 5)])


def test_the_stratified_difference_is_the_same_drop_in_every_task():
    assert stratified_difference([(6, 10, 9, 10), (0, 20, 6, 20)]) == pytest.approx(0.3)


EASY, HARD, SEEDS = 0.9, 0.3, 20


def run(rng, level_rates, errors, paired, stratum):
    """One table's tests: the reference and each level at (easy, hard) rates; ``errors[level]`` of the
    easy task's episodes errored (left out) at that level. Returns the levels flagged worse."""
    ref = {(task, s): rng.random() < p for task, p in (("easy", EASY), ("hard", HARD)) for s in range(SEEDS)}
    levels = {level: {(task, s): rng.random() < p for task, p in (("easy", easy), ("hard", hard))
                      for s in range(SEEDS) if not (task == "easy" and s < errors.get(level, 0))}
              for level, (easy, hard) in level_rates.items()}
    return {name for name, t in compare_levels(ref, levels, paired=paired, stratum=stratum).items()
            if t.significantly_worse}


def by_task(key):
    return key[0]


@pytest.mark.parametrize("paired", [True, False])
def test_errors_that_shift_the_task_mix_do_not_raise_false_alarms(paired):
    # no task's rate changes at any level; one level errs on half of the easy task's episodes, which
    # drops pairing under 80% (paired) and leaves a mix of more hard episodes: pooled counts are fooled
    rng = np.random.default_rng(2026)
    rates = {"errs": (EASY, HARD)}
    stratified = np.mean([bool(run(rng, rates, {"errs": 10}, paired, by_task)) for _ in range(400)])
    rng = np.random.default_rng(2026)
    pooled = np.mean([bool(run(rng, rates, {"errs": 10}, paired, None)) for _ in range(400)])
    assert stratified <= 0.05 < pooled  # 0.01 against 0.11 with these seeds


def test_the_family_wise_rate_of_a_table_with_several_error_shifted_levels_stays_under_alpha():
    rng = np.random.default_rng(11)
    rates = {"a": (EASY, HARD), "b": (EASY, HARD), "c": (EASY, HARD)}
    flagged = np.mean([bool(run(rng, rates, {"a": 10, "b": 6}, False, by_task)) for _ in range(300)])
    assert flagged <= 0.05


def test_power_on_a_real_drop_is_kept():
    # the level drops in both tasks (0.9 -> 0.6, 0.3 -> 0.05), no errors, other seeds (unpaired)
    rates = {"drop": (0.6, 0.05)}
    rng = np.random.default_rng(5)
    stratified = np.mean(["drop" in run(rng, rates, {}, False, by_task) for _ in range(200)])
    rng = np.random.default_rng(5)
    pooled = np.mean(["drop" in run(rng, rates, {}, False, None) for _ in range(200)])
    assert stratified >= 0.85 and stratified >= pooled - 0.02  # 0.90 against Boschloo's 0.865 on pooled counts
