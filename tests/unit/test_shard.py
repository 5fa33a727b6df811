"""The pure shard partition: every episode in exactly one shard, balanced, the same in every process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from pytest_hud.controller.ledger import Ledger
from pytest_hud.core.results import EpisodeRecord, Results
from pytest_hud.core.shard import (
    Shard, episode_key, parse_shard, partition, suite_fingerprint, suite_tasks,
)

REPO = Path(__file__).resolve().parents[2]

SUITE = ([("evals/test_a.py::test_reach", str(s)) for s in range(50)]
         + [("evals/test_a.py::test_push[arm=left]", str(s)) for s in range(7)]
         + [("evals/test_b.py::test_one", "0")]
         + [(f"evals/test_c.py::test_many[obj={o}]", str(s)) for o in "abcd" for s in range(3)])


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 58, 100])
def test_every_episode_is_in_exactly_one_shard_and_shards_are_balanced(count):
    where = partition(SUITE, count)
    assert set(where) == set(SUITE)  # the union is the suite; a dict gives each episode one shard
    assert set(where.values()) <= set(range(1, count + 1))
    sizes = Counter(where.values())
    assert max(sizes.values()) - min(sizes[i] for i in range(1, count + 1)) <= 1
    for task in {t for t, _ in SUITE}:  # and each task is spread evenly too
        per_task = Counter(i for (t, _), i in where.items() if t == task)
        assert max(per_task.values()) - min(per_task[i] for i in range(1, count + 1)) <= 1


def test_the_partition_ignores_collection_order_and_duplicates():
    assert partition(list(reversed(SUITE)) + SUITE[:5], 3) == partition(SUITE, 3)


def test_consecutive_seeds_are_not_dealt_in_order():
    where = partition([("t", str(s)) for s in range(30)], 3)
    assert [where[("t", str(s))] for s in range(6)] != [1, 2, 3, 1, 2, 3]


PRINT_PARTITION = """
import json, sys
from pytest_hud.core.shard import partition
suite = json.loads(sys.argv[1])
print(json.dumps(sorted([t, e, i] for (t, e), i in partition([tuple(p) for p in suite], 4).items())))
"""


def test_the_partition_is_the_same_in_every_process_whatever_the_hash_seed():
    outputs = set()
    for seed in ("0", "1", "12345", "random"):
        done = subprocess.run([sys.executable, "-c", PRINT_PARTITION, json.dumps(SUITE)], capture_output=True,
                              text=True, timeout=60, cwd=REPO,
                              env=dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(REPO)))
        assert done.returncode == 0, done.stderr
        outputs.add(done.stdout)
    assert len(outputs) == 1
    here = sorted([t, e, i] for (t, e), i in partition(SUITE, 4).items())
    assert json.loads(outputs.pop()) == here


def test_a_golden_partition_so_that_shards_of_two_versions_still_agree():
    # If this changes, shards made by different pytest-hud versions no longer partition one suite.
    assert episode_key("t", "0") == "bfc594055659fc618535cfa89c41be8f99d8f624e9d40224fb707f7297da4a75"
    where = partition([("evals/test_x.py::test_reach", str(s)) for s in range(8)], 3)
    assert [where[("evals/test_x.py::test_reach", str(s))] for s in range(8)] == [2, 3, 1, 2, 2, 3, 1, 1]


@pytest.mark.parametrize("text, shard", [("1/1", Shard(1, 1)), ("2/3", Shard(2, 3)), (" 4/4 ", Shard(4, 4))])
def test_parse_shard_reads_i_of_n(text, shard):
    assert parse_shard(text) == shard and str(shard) == text.strip()


@pytest.mark.parametrize("text, says", [
    ("0/3", "I must be between 1 and N=3"), ("4/3", "I must be between 1 and N=3"), ("-1/3", "between 1 and N"),
    ("1/0", "N (the number of shards) must be at least 1"), ("3", "is not I/N"), ("a/b", "is not I/N"),
    ("", "is not I/N"), ("1/2/3", "is not I/N"), ("1.5/3", "is not I/N"),
])
def test_parse_shard_names_the_problem_and_the_fix(text, says):
    with pytest.raises(ValueError, match="e.g. --hud-shard 2/4") as err:
        parse_shard(text)
    assert says in str(err.value)


def test_the_suite_fingerprint_depends_on_the_episodes_only():
    tasks = suite_tasks(SUITE)
    assert suite_fingerprint(tasks) == suite_fingerprint(suite_tasks(reversed(SUITE)))
    assert suite_fingerprint(tasks) != suite_fingerprint(suite_tasks(SUITE[:-1]))


def record(task: str, episode: str, success: bool) -> EpisodeRecord:
    return EpisodeRecord(task=task, episode=episode, nodeid=f"{task}[{episode}]",
                         outcome="passed" if success else "failed", success=success)


def test_a_shards_gate_compares_with_the_same_episodes_of_the_baseline():
    suite = [("t.py::test_a", str(s)) for s in range(12)] + [("t.py::test_b", "0")]
    base = Results(run={}, episodes=[record(t, e, True) for t, e in suite], summary=None)
    where = partition(suite, 3)
    mine = [(t, e) for (t, e), i in where.items() if i == 2]
    ledger = Ledger(baseline=base)
    ledger.declare([{"nodeid": f"{t}[{e}]", "task": t, "episode": e} for t, e in mine],
                   shard={"index": 2, "count": 3, "suite": suite_tasks(suite)})
    assert ledger.other_shards() == {key for key, i in where.items() if i != 2}
    for t, e in mine:
        ledger.add(record(t, e, True))
    verdicts = {v.task: v for v in ledger.verdicts()}
    assert verdicts["t.py::test_a"].n_baseline == 4 and verdicts["t.py::test_a"].test == "paired-mcnemar"
    assert ("t.py::test_b" in verdicts) == (where[("t.py::test_b", "0")] == 2)
    assert all(v.verdict != "insufficient coverage" for v in verdicts.values())
