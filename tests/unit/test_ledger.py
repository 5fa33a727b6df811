"""The controller's books: declarations, records, coverage, resume matching, sequential decisions."""

from __future__ import annotations

from pytest_hud.gate import GateConfig
from pytest_hud.controller.ledger import Ledger
from pytest_hud.core.results import EpisodeRecord, Results


def declared(task: str, n: int, floor: float | None = None) -> list[dict]:
    return [dict(task=task, episode=str(i), seed=i, nodeid=f"{task}[{i}]",
                 **({"min_success": floor} if floor is not None else {})) for i in range(n)]


def record(task: str, i: int, outcome: str = "passed", **kw) -> EpisodeRecord:
    return EpisodeRecord(task=task, episode=str(i), nodeid=f"{task}[{i}]", outcome=outcome, seed=i,
                         success={"passed": True, "failed": False}.get(outcome), **kw)


def test_declarations_from_several_workers_count_once_and_coverage_names_the_missing():
    ledger = Ledger()
    ledger.declare(declared("t", 4))
    assert ledger.declare(declared("t", 4)) == 4  # another worker declares the same episodes
    ledger.add(record("t", 0))
    ledger.add(record("t", 1, "failed"))
    ledger.add(record("t", 2, "error", error="boom"))
    cov = ledger.coverage()
    assert (cov["declared"], cov["reported"], cov["graded"], cov["errors"]) == (4, 3, 2, 1)
    assert cov["missing"] == ["t[3]"]
    summary = ledger.tasks()["t"]
    assert (summary.n, summary.successes, summary.errors, summary.declared) == (2, 1, 1, 4)


def test_a_rerun_of_an_episode_replaces_its_record():
    ledger = Ledger()
    ledger.add(record("t", 0, "error", error="boom"))
    ledger.add(record("t", 0))
    assert ledger.coverage()["errors"] == 0 and ledger.tasks()["t"].successes == 1


def test_a_crashed_worker_makes_a_declared_episode_an_error_and_nothing_else():
    ledger = Ledger()
    ledger.declare(declared("t", 2))
    crashed = ledger.crashed("t[1]", "worker 'gw0' crashed while running 't[1]'")
    assert crashed.outcome == "error" and crashed.seed == 1 and "crashed" in crashed.error
    assert ledger.crashed("other::test", "x") is None


def test_ungated_runs_have_no_verdicts_and_marker_floors_gate_them():
    ledger = Ledger()
    ledger.declare(declared("t", 3))
    assert ledger.verdicts() is None
    ledger.declare(declared("f", 10, floor=0.9))
    for i in range(10):
        ledger.add(record("f", i, "failed"))
    verdicts = {v.task: v for v in ledger.verdicts()}
    assert verdicts["f"].verdict == "regression" and verdicts["f"].test == "floor"


def results(task: str, outcomes: str) -> Results:
    eps = [record(task, i, "passed" if c == "1" else "failed") for i, c in enumerate(outcomes)]
    return Results(run={"record": "run"}, episodes=eps, summary=None)


def test_resume_reuses_only_an_exact_identity_match():
    prev = record("t", 0, identity={"policy": "p", "policy_hash": "sha256:1"})
    ledger = Ledger(resumable={("t", "0"): prev})
    assert ledger.resume_lookup("t", "0", {"policy": "p", "policy_hash": "sha256:1"})["outcome"] == "passed"
    assert ledger.resume_lookup("t", "0", {"policy": "p", "policy_hash": "sha256:2"}) is None
    assert ledger.resume_lookup("t", "1", {"policy": "p", "policy_hash": "sha256:1"}) is None


def test_the_sequential_test_decides_a_clear_regression_and_its_verdict_says_so():
    ledger = Ledger(GateConfig(), results("t", "1" * 60), sequential=True)
    ledger.declare(declared("t", 60))
    decisions = []
    for i in range(60):
        ledger.add(record("t", i, "failed"))
        decisions.append(ledger.decision("t"))
        if decisions[-1] != "undecided":
            break
    assert decisions[-1] == "regression" and len(decisions) < 60  # decided before the end
    for i in range(len(decisions), 60):  # the rest are skipped by the worker's setup hook
        ledger.add(record("t", i, "skipped", skip_reason="sequential gate already decided t: regression"))
    (verdict,) = ledger.verdicts()
    assert verdict.verdict == "regression" and verdict.test == "sequential"


def test_deselected_tasks_are_passed_to_the_gate():
    ledger = Ledger(GateConfig(), Results(run={}, episodes=[record("a", i) for i in range(5)]
                                          + [record("b", i) for i in range(5)], summary=None))
    ledger.declare(declared("a", 5), deselected=["b"])
    for i in range(5):
        ledger.add(record("a", i))
    b = {v.task: v for v in ledger.verdicts()}["b"]
    assert b.verdict == "insufficient coverage" and "deselected" in b.reason


def test_used_lists_every_policy_and_sim_the_episodes_ran_with():
    ledger = Ledger()
    ledger.add(record("t", 0, identity={"policy": "p", "policy_hash": "h", "sim": "s", "build": {"k": 1}}))
    ledger.add(record("t", 1, identity={"policy": "q", "policy_hash": "h2", "sim": "s", "build": {"k": 1}}))
    policies, sims = ledger.used()
    assert {p["policy"] for p in policies} == {"p", "q"} and sims == [{"sim": "s", "build": {"k": 1}}]


def test_the_last_reported_episode_of_a_sim_says_its_bridges_have_nothing_left_to_run():
    ledger = Ledger()
    sims = [["sims:libero", {"suite": "libero_spatial"}], ["sims:libero", {"suite": "libero_goal"}]]
    episodes = [dict(ep, sim=0 if i < 2 else 1) for i, ep in enumerate(declared("t", 4))]
    episodes.append(declared("other", 1)[0])  # an episode on no bridge (no shared_sim)
    ledger.declare(episodes, sims=sims)
    # another worker's declaration lists the same sims in another order: counted once all the same
    ledger.declare([dict(ep, sim=1 - ep["sim"]) if "sim" in ep else ep for ep in episodes], sims=sims[::-1])
    spatial, goal = ("sims:libero", '{"suite": "libero_spatial"}'), ("sims:libero", '{"suite": "libero_goal"}')
    assert ledger.add(record("t", 2)) is None
    assert ledger.add(record("t", 0, "failed")) is None
    assert ledger.add(record("other", 0)) is None
    assert ledger.add(record("t", 1, "error")) == spatial  # its last one, whatever the outcome
    assert ledger.add(record("t", 1)) is None  # a rerun: said once
    assert ledger.add(record("undeclared", 7)) is None
    assert ledger.add(record("t", 3, "skipped")) == goal
