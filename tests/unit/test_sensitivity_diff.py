"""The ``diff`` column is the difference the test judged (the shared pairs when paired), so it never
contradicts the verdict; the rate column keeps every graded episode of the level."""

from __future__ import annotations

import pytest

from pytest_hud.core.results import EpisodeRecord
from pytest_hud.core.sensitivity import sensitivity_tables
from pytest_hud.report.sensitivity import sensitivity_lines

LEVELS = ("none", "level")


def record(level: str, seed: int, success: bool, outcome: str | None = None) -> EpisodeRecord:
    outcome = outcome or ("passed" if success else "failed")
    return EpisodeRecord(
        task=f"t.py::test_x[p={level}]", episode=str(seed), nodeid=f"t.py::test_x[{level}-{seed}]", outcome=outcome,
        seed=seed, success=None if outcome == "error" else success,
        axes={"p": {"level": level, "index": LEVELS.index(level), "reference": "none", "task": "t.py::test_x"}})


def test_diff_is_over_the_shared_pairs_the_paired_test_compared():
    # reference 80/100; the level errs on the reference's 20 failures and fails 12 of its successes: 68/80
    recs = [record("none", s, s >= 20) for s in range(100)]
    recs += [record("level", s, s >= 32, outcome="error" if s < 20 else None) for s in range(100)]
    (table,) = sensitivity_tables(recs, min_coverage=0.8)
    ref, level = table.rows
    assert (ref.rate, level.rate) == (0.8, 0.85)  # all graded: the level *looks* 5 points better
    assert level.test == "paired-mcnemar" and level.n_pairs == 80 and level.significantly_worse
    assert level.difference == pytest.approx(-12 / 80)  # 80/80 against 68/80 on the shared pairs
    row = sensitivity_lines([table])[4].split()
    assert row[0] == "level" and row[4] == "85.0%" and row[7] == "-15.0" and row[-1] == "WORSE"


def test_diff_is_over_all_graded_episodes_when_the_test_was_unpaired():
    recs = [record("none", s, s < 8) for s in range(10)] + [record("level", 100 + s, s < 3) for s in range(10)]
    (table,) = sensitivity_tables(recs)
    assert table.rows[1].test == "unpaired-boschloo" and table.rows[1].difference == pytest.approx(-0.5)
