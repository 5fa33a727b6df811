"""The statistics the gate rests on, pure (numpy only; imports nothing else of the project).

Cut by role: :mod:`.binomial` (exact binomial building blocks in log space), :mod:`.rates` (the
exact tests, Holm's procedure), :mod:`.levels` (robustness levels against their reference),
:mod:`.power` (power, minimum detectable drop, episodes needed), :mod:`.strata` (the exact test
stratified by task), :mod:`.scores` (rank tests of continuous scores) and :mod:`.sequential` (the
anytime-valid sequential test); :mod:`.wilson` has the Wilson interval without numpy. Every public
name is importable from here, each from its module on first use (only the Wilson interval at import:
the controller's progress line and summary table need no numpy).
"""

from typing import Any

from .wilson import wilson_interval

_WHERE = {  # each public name and the module it lives in
    "Decision": "sequential", "LevelTest": "levels", "PAIRED_MIN_OVERLAP": "levels",
    "SequentialTest": "sequential", "binom_cdf": "binomial", "binom_logpmf": "binomial",
    "binom_pmf": "binomial", "binom_sf": "binomial", "boschloo_exact_one_sided": "rates",
    "compare_level_scores": "levels", "compare_levels": "levels", "episodes_needed": "power",
    "episodes_needed_for_floor": "power", "fisher_exact_one_sided": "rates", "holm": "rates",
    "holm_adjusted": "rates", "mcnemar_exact_one_sided": "rates", "minimum_detectable_drop": "power",
    "paired_noninferiority_exact": "rates", "paired_power": "power", "rank_sum_one_sided": "scores",
    "score_detectable_drop": "scores", "score_episodes_needed": "scores", "sequential_decision": "sequential",
    "sequential_log_evalues": "sequential", "shared_pairs": "levels", "signed_rank_exact_one_sided": "scores",
    "stratified_difference": "strata", "stratified_exact_one_sided": "strata",
    "stratified_rank_sum_one_sided": "scores", "unpaired_noninferiority_exact": "rates",
    "unpaired_power": "power", "wilson_interval": "wilson",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    """Every name but the Wilson interval from its module on first use: those import numpy, which
    the controller needs only once a gate or a sensitivity table is computed."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
