"""The ledger's running tallies: the same table as aggregating every record, without keeping them."""

from __future__ import annotations

import random
from dataclasses import asdict

import pytest

from pytest_hud.controller.ledger import Ledger
from pytest_hud.core.results import EpisodeRecord, aggregate


def random_records(rng: random.Random, n: int) -> list[EpisodeRecord]:
    out = []
    for i in range(n):
        task = rng.choice(["a.py::t", "b.py::t[arm=1]"])
        episode = str(rng.randrange(n // 2))  # some episodes report twice: the last record wins
        outcome = rng.choice(["passed", "passed", "failed", "error", "skipped"])
        stamped = rng.random() > 0.1
        out.append(EpisodeRecord(
            task=task, episode=episode, nodeid=f"{task}[{episode}]", outcome=outcome,
            success={"passed": True, "failed": False}.get(outcome),
            total_reward=rng.choice([None, rng.uniform(0, 500)]), steps=rng.choice([None, rng.randrange(500)]),
            duration_s=rng.uniform(0.1, 2.0) if stamped else None, finished_at=1000.0 + i if stamped else None,
            reused=rng.random() < 0.1))
    return out


def same_tables(got: dict, want: dict) -> bool:
    """Equal field for field; floats to rounding (Python 3.12's ``sum`` compensates, a tally adds)."""
    assert got.keys() == want.keys()
    for task in want:
        mine, theirs = asdict(got[task]), asdict(want[task])
        for key, value in theirs.items():
            if isinstance(value, float):
                assert mine[key] == pytest.approx(value, rel=1e-12), (task, key)
            else:
                assert mine[key] == value, (task, key)
    return True


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("read_back", [False, True], ids=["kept", "read-back"])
def test_the_tallies_equal_the_aggregate_of_the_latest_records(seed, read_back):
    rng = random.Random(seed)
    records = random_records(rng, 60)
    written: list[EpisodeRecord] = []
    ledger = Ledger(read_back=(lambda: list(written)) if read_back else None)
    declared = [{"nodeid": r.nodeid, "task": r.task, "episode": r.episode} for r in records]
    ledger.declare(declared[:40])
    for rec in records:
        ledger.add(rec)
        written.append(rec)
    latest = {r.nodeid: r for r in records}
    counts: dict[str, int] = {}
    for d in {d["nodeid"]: d for d in declared[:40]}.values():
        counts[d["task"]] = counts.get(d["task"], 0) + 1
    assert same_tables(ledger.tasks(wall_s=7.0), aggregate(latest.values(), counts, wall_s=7.0))
    coverage = ledger.coverage()
    assert coverage["graded"] == sum(r.outcome in ("passed", "failed") for r in latest.values())
    assert coverage["errors"] == sum(r.outcome == "error" for r in latest.values())


def test_with_a_read_back_the_table_coverage_and_progress_never_read_the_records():
    reads = []

    def read_back():
        reads.append(1)
        return []

    ledger = Ledger(read_back=read_back)
    ledger.declare([{"nodeid": f"t[{i}]", "task": "t", "episode": str(i), "min_success": 0.5} for i in range(500)])
    for i in range(400):
        ledger.add(EpisodeRecord(task="t", episode=str(i), nodeid=f"t[{i}]", outcome="passed", success=True,
                                 duration_s=1.0, finished_at=1000.0 + i))
    ledger.tasks(), ledger.coverage(), ledger.progress(now=2000.0)
    assert reads == [] and ledger.coverage()["missing"] == [f"t[{i}]" for i in range(400, 500)]
    ledger.verdicts()  # the gate reads the records back, once
    assert reads == [1]
