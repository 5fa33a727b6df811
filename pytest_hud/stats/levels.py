"""Levels of one robustness axis against its reference level: exact one-sided tests, Holm-adjusted.

Pure functions on outcomes: no pytest, no I/O, numpy only (through :mod:`.rates`). The sensitivity
table (:mod:`pytest_hud.core.sensitivity`) is built from :func:`compare_levels`.

A *level* is one value of a perturbation parameter (``obs_noise_0.05``, ``libero_spatial_swap``); the
*reference* is the unperturbed level. Each level's outcomes are a mapping from an episode key (the
task without the axis, and the episode id) to success. The question asked of every level is one-sided,
"is the success rate at this level *lower* than at the reference?", because a robustness table is read
for degradation; a level that does better is reported with its difference and a p-value near 1.

Which test, and why:

- **Paired, exact McNemar** when the level and the reference ran the same episodes: the episode keys
  graded at both are at least :data:`PAIRED_MIN_OVERLAP` (80%) of each side's graded episodes. A seed
  fixes the initial state in seeded sims, so the episodes of two levels that share a seed are paired,
  and hard initial states fail at every level; conditioning on the discordant pairs removes that
  seed-to-seed variance and is exact with no nuisance parameter. The unmatched few are dropped.
- **Unpaired, Boschloo's exact test** otherwise (other seeds per level, many errors, or an axis
  declared ``paired=False``, whose levels do not share initial states by seed): exact, never
  above its level, and uniformly more powerful than Fisher's exact test, whose p-value it never
  exceeds (Fisher conditions on the total successes and is conservative at the small n of an eval).
- **Unpaired and stratified** when the episodes come from several tasks (a table pooled over
  tasks, ``stratum`` given): the exact conditional test over the tasks' 2x2 tables
  (:mod:`.strata`). Pooled counts would compare task mixes: a level that errs on half of an easy
  task's episodes looks worse pooled although no task changed. Pairs are always within a task
  (the key holds the task), so the paired test needs no stratifying.

These are the rules of the regression gate (:mod:`pytest_hud.gate.evaluation`, rules 2 and 3), so a
level and a baseline are judged alike. The choice depends on which episodes were graded, never on
their outcomes, so it does not bias the test.

**Holm** over the levels of one table (its family: every level other than the reference that has
graded episodes): a level is *significantly worse* when its Holm-adjusted p-value is at most
``alpha``. The chance that any level of a table is flagged although none is worse is at most alpha.

    >>> ref = {("t", str(s)): True for s in range(10)}
    >>> noisy = {("t", str(s)): s < 2 for s in range(10)}        # 8 seeds now fail
    >>> same = dict(ref)
    >>> out = compare_levels(ref, {"noise": noisy, "same": same})
    >>> out["noise"].test, out["noise"].p_value, out["noise"].significantly_worse   # 1 / 2**8
    ('paired-mcnemar', 0.00390625, True)
    >>> out["same"].adjusted_p, out["same"].significantly_worse
    (1.0, False)
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from pytest_hud.stats.rates import boschloo_exact_one_sided, holm_adjusted, mcnemar_exact_one_sided
from pytest_hud.stats.scores import signed_rank_exact_one_sided, stratified_rank_sum_one_sided
from pytest_hud.stats.strata import stratified_difference, stratified_exact_one_sided

__all__ = ["PAIRED_MIN_OVERLAP", "LevelTest", "compare_level_scores", "compare_levels", "shared_pairs"]

#: Shared episodes (of each side's graded ones) from which a level is compared paired; the gate's rule.
PAIRED_MIN_OVERLAP = 0.8


def shared_pairs(a: Mapping[Hashable, Any], b: Mapping[Hashable, Any]) -> set[Hashable] | None:
    """The episodes both sides have, when they are at least :data:`PAIRED_MIN_OVERLAP` of each
    side's (then the two are compared pair by pair), else None (compared unpaired)."""
    shared = a.keys() & b.keys()
    return shared if shared and len(shared) >= PAIRED_MIN_OVERLAP * max(len(a), len(b)) else None


@dataclass(frozen=True)
class LevelTest:
    """One level against the reference.

    ``drop`` is the reference's rate minus the level's, as the test estimates it (paired: over the
    shared episodes): positive means worse. ``worse``/``better`` count discordant pairs (paired only).
    ``p_value`` is None (and the level is outside the Holm family) when either side has no graded episode.
    """

    level: str
    test: str  # "paired-mcnemar", "unpaired-boschloo", "unpaired-stratified" or "none"
    paired: bool
    drop: float | None
    p_value: float | None
    adjusted_p: float | None
    significantly_worse: bool
    n_pairs: int = 0
    worse: int = 0
    better: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _tables(ref: Mapping[Hashable, bool], cur: Mapping[Hashable, bool],
            stratum: Callable[[Hashable], Hashable]) -> list[tuple[int, int, int, int]]:
    """One ``(s_level, n_level, s_ref, n_ref)`` per stratum."""
    counts: dict[Hashable, list[int]] = {}
    for side, outcomes in ((0, cur), (2, ref)):
        for key, ok in outcomes.items():
            row = counts.setdefault(stratum(key), [0, 0, 0, 0])
            row[side] += bool(ok)
            row[side + 1] += 1
    return [(a, b, c, d) for a, b, c, d in counts.values()]


def _one(level: str, ref: Mapping[Hashable, bool], cur: Mapping[Hashable, bool], paired: bool = True,
         stratum: Callable[[Hashable], Hashable] | None = None) -> LevelTest:
    if not ref or not cur:
        return LevelTest(level, "none", False, None, None, None, False)
    shared = shared_pairs(ref, cur) if paired else None
    if shared:
        worse = sum(1 for k in shared if ref[k] and not cur[k])
        better = sum(1 for k in shared if cur[k] and not ref[k])
        return LevelTest(level, "paired-mcnemar", True, (worse - better) / len(shared),
                         mcnemar_exact_one_sided(worse, better), None, False, len(shared), worse, better)
    tables = _tables(ref, cur, stratum) if stratum is not None else []
    if len(tables) > 1:
        return LevelTest(level, "unpaired-stratified", False, stratified_difference(tables),
                         stratified_exact_one_sided(tables), None, False)
    s_ref, s_cur = sum(map(bool, ref.values())), sum(map(bool, cur.values()))
    p = boschloo_exact_one_sided(s_cur, len(cur), s_ref, len(ref))
    return LevelTest(level, "unpaired-boschloo", False, s_ref / len(ref) - s_cur / len(cur), p, None, False)


def compare_levels(reference: Mapping[Hashable, bool], levels: Mapping[str, Mapping[Hashable, bool]],
                   alpha: float = 0.05, paired: bool = True,
                   stratum: Callable[[Hashable], Hashable] | None = None) -> dict[str, LevelTest]:
    """Each level of ``levels`` against ``reference``, Holm-adjusted over the levels that were tested.

    ``reference`` and each level map an episode key to success (graded episodes only: errors and
    skips are left out by the caller). Returns a :class:`LevelTest` per level, in the given order.
    ``paired=False`` says that a key does not fix the same initial state at every level (a variant
    suite with initial states of its own): every level is then tested unpaired. ``stratum`` maps an
    episode key to its stratum (its task, for a table pooled over tasks): an unpaired level whose
    episodes fall in more than one stratum is tested with the exact conditional test stratified by
    it (:func:`~pytest_hud.stats.strata.stratified_exact_one_sided`), never on pooled counts.

        >>> compare_levels({"a": True}, {"x": {}})["x"].test
        'none'
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha={alpha} must be strictly between 0 and 1")
    tests = {name: _one(name, reference, outcomes, paired, stratum) for name, outcomes in levels.items()}
    return _holm(tests, alpha)


def _holm(tests: dict[str, LevelTest], alpha: float) -> dict[str, LevelTest]:
    """The tests with their Holm-adjusted p-values and verdicts (the family: the tested levels)."""
    adjusted = holm_adjusted({name: t.p_value for name, t in tests.items() if t.p_value is not None})
    out: dict[str, LevelTest] = {}
    for name, t in tests.items():
        if name in adjusted:
            p = adjusted[name]
            t = LevelTest(**{**asdict(t), "adjusted_p": p,
                             "significantly_worse": p <= alpha and (t.drop or 0.0) > 0.0})
        out[name] = t
    return out


def _one_score(level: str, ref: Mapping[Hashable, float], cur: Mapping[Hashable, float], paired: bool,
               stratum: Callable[[Hashable], Hashable] | None) -> LevelTest:
    if not ref or not cur:
        return LevelTest(level, "none", False, None, None, None, False)
    shared = sorted(shared_pairs(ref, cur) or (), key=str) if paired else []
    if shared:
        diffs = [ref[k] - cur[k] for k in shared]
        return LevelTest(level, "paired-signed-rank", True, sum(diffs) / len(diffs),
                         signed_rank_exact_one_sided(diffs), None, False, len(shared),
                         sum(1 for d in diffs if d > 0), sum(1 for d in diffs if d < 0))
    groups: dict[Hashable, tuple[list[float], list[float]]] = {}
    for side, outcomes in ((0, ref), (1, cur)):
        for key, score in outcomes.items():
            groups.setdefault(stratum(key) if stratum else None, ([], []))[side].append(float(score))
    # the drop on what the test compared: the mean of the tasks' differences, each task weighted as in strata
    weights = {g: len(b) * len(c) / (len(b) + len(c)) for g, (b, c) in groups.items() if b and c}
    drop = (sum(w * (sum(groups[g][0]) / len(groups[g][0]) - sum(groups[g][1]) / len(groups[g][1]))
                for g, w in weights.items()) / sum(weights.values())) if weights else None
    test = "unpaired-rank-sum" if len(groups) == 1 else "unpaired-stratified-rank-sum"
    return LevelTest(level, test, False, drop, stratified_rank_sum_one_sided(list(groups.values())), None, False)


def compare_level_scores(reference: Mapping[Hashable, float], levels: Mapping[str, Mapping[Hashable, float]],
                         alpha: float = 0.05, paired: bool = True,
                         stratum: Callable[[Hashable], Hashable] | None = None) -> dict[str, LevelTest]:
    """:func:`compare_levels` on each episode's graded score instead of its success: the signed-rank
    test on the shared pairs (paired), else the rank-sum test, stratified by ``stratum`` when the
    episodes fall in several strata (:mod:`.scores`); ``drop`` is in score units.

        >>> ref = {("t", s): 0.9 for s in range(6)}
        >>> out = compare_level_scores(ref, {"noise": {("t", s): 0.5 for s in range(6)}})
        >>> out["noise"].test, out["noise"].p_value    # six worse pairs of six: 1 / 2**6
        ('paired-signed-rank', 0.015625)
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha={alpha} must be strictly between 0 and 1")
    tests = {name: _one_score(name, reference, scores, paired, stratum) for name, scores in levels.items()}
    return _holm(tests, alpha)
