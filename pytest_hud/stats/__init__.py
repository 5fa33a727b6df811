"""The statistics the gate rests on, pure (numpy only; imports nothing else of the project).

Cut by role: :mod:`.binomial` (exact binomial building blocks in log space), :mod:`.rates` (the
Wilson interval, the exact tests, Holm's procedure), :mod:`.levels` (robustness levels against
their reference), :mod:`.power` (power, minimum detectable drop, episodes needed), :mod:`.strata` (the exact test
stratified by task), :mod:`.scores` (rank tests of continuous scores) and :mod:`.sequential` (the
anytime-valid sequential test). Every public name of the seven is importable from here.
"""

from .binomial import binom_cdf, binom_logpmf, binom_pmf, binom_sf
from .levels import PAIRED_MIN_OVERLAP, LevelTest, compare_level_scores, compare_levels, shared_pairs
from .power import episodes_needed, episodes_needed_for_floor, minimum_detectable_drop, paired_power, unpaired_power
from .rates import (boschloo_exact_one_sided, fisher_exact_one_sided, holm, holm_adjusted, mcnemar_exact_one_sided,
                    paired_noninferiority_exact, unpaired_noninferiority_exact, wilson_interval)
from .scores import (rank_sum_one_sided, score_detectable_drop, score_episodes_needed, signed_rank_exact_one_sided,
                     stratified_rank_sum_one_sided)
from .strata import stratified_difference, stratified_exact_one_sided
from .sequential import Decision, SequentialTest, sequential_decision, sequential_log_evalues

__all__ = [
    "PAIRED_MIN_OVERLAP", "Decision", "LevelTest", "SequentialTest", "binom_cdf", "binom_logpmf", "binom_pmf",
    "binom_sf", "boschloo_exact_one_sided", "compare_level_scores", "compare_levels", "episodes_needed", "episodes_needed_for_floor", "fisher_exact_one_sided", "holm", "holm_adjusted",
    "mcnemar_exact_one_sided", "minimum_detectable_drop", "paired_noninferiority_exact", "paired_power",
    "rank_sum_one_sided", "score_detectable_drop", "score_episodes_needed", "signed_rank_exact_one_sided",
    "shared_pairs", "stratified_rank_sum_one_sided",
    "sequential_decision", "sequential_log_evalues", "stratified_difference", "stratified_exact_one_sided",
    "unpaired_noninferiority_exact", "unpaired_power",
    "wilson_interval",
]
