"""The pure merge of shard results: what makes files unmergeable, missing, duplicate or conflicting."""

from __future__ import annotations

import pytest

from pytest_hud.controller.merge import MergeError, merge_shards
from pytest_hud.core.results import EpisodeRecord, Results
from pytest_hud.core.shard import partition, suite_fingerprint, suite_tasks

SUITE = [("t.py::test_a", str(s)) for s in range(6)] + [("t.py::test_b", str(s)) for s in range(3)]
IDENTITY = {"plugin_version": "0.1.0", "policy": "p:f", "policy_hash": "sha256:aa", "sim": "s:f", "build": {},
            "max_steps": None}


def shard_file(index: int, count: int = 3, suite=SUITE, *, path: str | None = None, success: bool = True,
               identity: dict | None = None, policy_hash: str = "sha256:aa", drop: int = 0) -> Results:
    tasks = suite_tasks(suite)
    mine = [key for key, i in partition(suite, count).items() if i == index]
    episodes = [EpisodeRecord(task=t, episode=e, nodeid=f"{t}[{e}]", outcome="passed" if success else "failed",
                              success=success, steps=10, total_reward=10.0, seed=int(e),
                              identity=dict(identity or IDENTITY)) for t, e in mine[drop:]]
    provenance = {"plugin_version": "0.1.0", "policy": "p:f", "policy_hash": policy_hash, "sim": "s:f",
                  "shard": {"index": index, "count": count, "episodes": len(mine),
                            "suite": {"episodes": len(suite), "fingerprint": suite_fingerprint(tasks), "tasks": tasks}}}
    return Results(run={"record": "run", "run_id": f"r{index}", "started": f"2026-12-01T0{index}",
                        "provenance": provenance},
                   episodes=episodes, summary={"tasks": {}, "provenance": provenance},
                   path=path or f"shard-{index}.jsonl")


def test_all_shards_merge_into_one_results_file_of_the_whole_suite():
    found = merge_shards([shard_file(2), shard_file(1), shard_file(3)])
    assert found.complete and not found.duplicates and not found.conflicts
    run, *episodes, summary = found.lines
    assert run["record"] == "run" and "shard" not in run["provenance"]
    assert [f["shard"] for f in run["provenance"]["merged"]["files"]] == [2, 1, 3]
    assert {(e["task"], e["episode"]) for e in episodes} == set(SUITE)
    assert summary["tasks"]["t.py::test_a"]["declared"] == 6 and summary["tasks"]["t.py::test_a"]["n"] == 6
    assert summary["coverage"] == {"declared": 9, "reported": 9, "graded": 9, "errors": 0, "skipped": 0, "missing": []}


def test_a_missing_shard_and_its_episodes_are_reported():
    found = merge_shards([shard_file(1), shard_file(3, drop=1)])
    assert found.missing_shards == [2] and not found.complete
    expected = {key for key, i in partition(SUITE, 3).items() if i == 2}
    expected.add([key for key, i in partition(SUITE, 3).items() if i == 3][0])
    assert set(found.missing_episodes) == expected
    assert found.lines[-1]["coverage"]["declared"] == 9 and len(found.lines[-1]["coverage"]["missing"]) == 4


def test_identical_duplicates_are_kept_once_and_conflicts_are_named():
    found = merge_shards([shard_file(1), shard_file(2), shard_file(3), shard_file(1, path="again.jsonl")])
    assert found.complete and len(found.duplicates) == 3 and not found.conflicts
    assert "is in shard-1.jsonl and again.jsonl with the same result" in found.duplicates[0]
    assert any("shard 1/3 is given 2 times" in note for note in found.notes)

    rerun = shard_file(1, path="rerun.jsonl", success=False)
    found = merge_shards([shard_file(1), shard_file(2), shard_file(3), rerun])
    assert len(found.conflicts) == 3
    assert "in shard-1.jsonl and rerun.jsonl with different results: outcome 'passed' vs 'failed'" in found.conflicts[0]
    kept = {(e["task"], e["episode"]): e["success"] for e in found.lines if e["record"] == "episode"}
    assert all(kept.values())  # the first file's records, unless asked otherwise
    found = merge_shards([shard_file(1), shard_file(2), shard_file(3), rerun], prefer_later=True)
    kept = {(e["task"], e["episode"]): e["success"] for e in found.lines if e["record"] == "episode"}
    assert sum(1 for ok in kept.values() if not ok) == 3


@pytest.mark.parametrize("other, says", [
    (Results(run={"provenance": {}}, episodes=[], summary=None, path="plain.jsonl"),
     "plain.jsonl is not a shard's results file"),
    (shard_file(2, count=4), "shard counts (N of --hud-shard I/N) differ (3 in shard-1.jsonl; 4 in shard-2.jsonl)"),
    (shard_file(2, suite=SUITE[:-1]), "suites (the collected episodes: same commit, same -k/-m?) differ"),
    (shard_file(2, policy_hash="sha256:bb"), "policy hash differ ('sha256:aa' in shard-1.jsonl; 'sha256:bb' in"),
    (shard_file(2, identity=dict(IDENTITY, build={"level": 2})),
     "episodes ran with a different build in shard-1.jsonl (build={}) and in shard-2.jsonl (build={'level': 2})"),
])
def test_files_that_are_not_shards_of_one_suite_and_policy_are_refused(other, says):
    with pytest.raises(MergeError) as err:
        merge_shards([shard_file(1), other])
    assert says in str(err.value)


def test_an_episode_outside_the_declared_suite_is_refused():
    odd = shard_file(2)
    odd.episodes.append(EpisodeRecord(task="t.py::test_z", episode="0", nodeid="x", outcome="passed", success=True))
    with pytest.raises(MergeError, match="episode 0 of t.py::test_z is not in the suite"):
        merge_shards([shard_file(1), odd])
