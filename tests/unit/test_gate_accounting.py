"""The gate's episode-level accounting, identity check and input checks, as plain function calls."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_hud.agent.model import PolicyError, check_policy_spec
from pytest_hud.controller.hooks import results_paths
from pytest_hud.gate import (
    SEQUENTIAL_SKIP, GateConfig, evaluate_gate, gate_passed, load_gate_file, outcomes_from_records,
    outcomes_from_results, unmatched_floors,
)
from pytest_hud.core.results import (
    EpisodeRecord, ResultsWriter, aggregate, gate_input_problem, load_results,
)


def rec(episode: int | str, outcome: str = "passed", task: str = "t", contract: str | None = None,
        **identity) -> EpisodeRecord:
    return EpisodeRecord(task=task, episode=str(episode), nodeid=f"{task}[{episode}]", outcome=outcome,
                         success={"passed": True, "failed": False}.get(outcome),
                         skip_reason="the extra is missing" if outcome == "skipped" else None,
                         identity={"sim": "sims:cartpole", "build": {}, "max_steps": 60, **identity},
                         contract=contract)


def only(verdicts, task: str = "t"):
    (verdict,) = [v for v in verdicts if v.task == task]
    return verdict


def outcomes(records, episodes=None, deselected=None):
    return outcomes_from_records(records, episodes=episodes, deselected=deselected)


BASE = outcomes([rec(i) for i in range(10)], episodes={"t": [str(i) for i in range(10)]})


def test_deselecting_baseline_episodes_fails_whatever_the_fraction() -> None:
    # 19 of 20 graded (95% > 90%), but the missing one was graded in the baseline and deselected now.
    base = outcomes([rec(i) for i in range(20)], episodes={"t": [str(i) for i in range(20)]})
    cur = outcomes([rec(i) for i in range(19)], episodes={"t": [str(i) for i in range(19)]},
                   deselected={"t": ["19"]})
    v = only(evaluate_gate(cur, base))
    assert v.verdict == "insufficient coverage" and not gate_passed([v])
    assert v.not_graded == {"deselected (-k/-m)": ["19"]}
    assert "1 episode graded in the baseline was left out" in v.reason and "episode 19" in v.reason
    assert v.coverage == pytest.approx(19 / 20)


def test_skipping_a_baseline_episode_now_fails_and_says_why() -> None:
    cur = outcomes([rec(i) for i in range(9)] + [rec(9, "skipped")], episodes={"t": [str(i) for i in range(10)]})
    v = only(evaluate_gate(cur, BASE))
    assert v.verdict == "insufficient coverage"
    assert v.not_graded == {"skipped (the extra is missing)": ["9"]}


def test_errored_and_unreported_episodes_count_against_coverage_by_name() -> None:
    cur = outcomes([rec(i) for i in range(8)] + [rec(8, "error")], episodes={"t": [str(i) for i in range(10)]})
    v = only(evaluate_gate(cur, BASE))
    assert v.verdict == "insufficient coverage" and v.coverage == pytest.approx(0.8)
    assert v.not_graded == {"errored": ["8"], "declared but never reported (an interrupted run?)": ["9"]}
    # Within the tolerance they pass, and are still named.
    v = only(evaluate_gate(cur, BASE, GateConfig(min_coverage=0.8)))
    assert v.verdict != "insufficient coverage" and "not graded now: errored: episode 8" in v.reason


def test_a_suite_on_new_seeds_is_a_fresh_sample_not_missing_episodes() -> None:
    cur = outcomes([rec(i) for i in range(100, 120)], episodes={"t": [str(i) for i in range(100, 120)]})
    v = only(evaluate_gate(cur, BASE))
    assert v.test == "unpaired-boschloo" and v.not_graded == {} and v.coverage == 1.0


def test_sequential_skips_are_not_expected() -> None:
    skipped = [EpisodeRecord(task="t", episode=str(i), nodeid=f"t[{i}]", outcome="skipped",
                             skip_reason=f"{SEQUENTIAL_SKIP} t: pass") for i in range(5, 10)]
    cur = outcomes([rec(i) for i in range(5)] + skipped, episodes={"t": [str(i) for i in range(10)]})
    v = only(evaluate_gate(cur, BASE))
    assert v.verdict != "insufficient coverage" and v.not_graded == {} and v.declared == 5


@pytest.mark.parametrize("field, ours, theirs", [
    ("build", {"task": "push"}, {"task": "reach"}),
    ("max_steps", 40, 60),
    ("sim", "sims:other", "sims:cartpole"),
    ("contract", "action box float32(2) #a", "action box float32(3) #b"),
    ("n_action_steps", 8, None),
])
def test_a_different_task_definition_is_incomparable(field, ours, theirs) -> None:
    base = outcomes([rec(i, **{field: theirs}) for i in range(10)])
    cur = outcomes([rec(i, **{field: ours}) for i in range(10)])
    v = only(evaluate_gate(cur, base))
    assert v.verdict == "incomparable" and v.test == "identity" and not gate_passed([v])
    assert f"{field} is " in v.reason and f"--hud-accept-difference={field}" in v.reason
    accepted = only(evaluate_gate(cur, base, GateConfig(accept=(field,))))
    assert accepted.verdict == "inconclusive" or accepted.verdict == "pass"


def test_an_incomparable_task_is_left_out_of_the_holm_family() -> None:
    base = {**outcomes([rec(i, max_steps=60) for i in range(10)]),
            **outcomes([rec(i, task="u") for i in range(10)])}
    cur = {**outcomes([rec(i, max_steps=40) for i in range(10)]),
           **outcomes([rec(i, "failed", task="u") for i in range(10)])}
    verdicts = evaluate_gate(cur, base)
    assert only(verdicts, "t").verdict == "incomparable"
    u = only(verdicts, "u")
    assert u.verdict == "regression" and u.adjusted_p == u.p_value  # a family of one


def test_a_field_only_one_side_recorded_is_not_checked() -> None:
    old = outcomes([EpisodeRecord(task="t", episode=str(i), nodeid=f"t[{i}]", outcome="passed", success=True,
                                  identity={"max_steps": 60}) for i in range(10)])
    cur = outcomes([rec(i, contract="action box float32(2) #a") for i in range(10)])
    assert only(evaluate_gate(cur, old)).verdict != "incomparable"


def test_unknown_accepted_fields_are_rejected_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match="'max_step'.*did you mean 'max_steps'.*sim, build"):
        GateConfig(accept=("max_step",))
    assert load_gate_file("accept_differences: [build]\n") == {"accept": ("build",)}


def test_a_task_without_baseline_episodes_says_so() -> None:
    base = outcomes_from_records([], episodes={"t": []})
    v = only(evaluate_gate(outcomes([rec(i) for i in range(3)]), base, GateConfig(min_coverage=0.5)))
    assert v.verdict == "no baseline" and "has no episode of this task" in v.reason
    assert "0 baseline" not in v.reason


def test_floors_that_match_no_task_are_found() -> None:
    floors = {"t.py::test_a": 0.5, "t.py::test_b*": 0.5, "t.py::*": 0.1, "u.py::x": 0.2}
    assert unmatched_floors(floors, ["t.py::test_a", "t.py::test_c[arm=l]"]) == ["t.py::test_b*", "u.py::x"]


def write(path: Path, records, *, summary=True, declared=None, shard=None) -> Path:
    provenance = {"shard": shard} if shard else {}
    writer = ResultsWriter(path, provenance, "r", declared=declared)
    for r in records:
        writer.episode(r)
    if summary:
        writer.summary(aggregate(records), {}, provenance)
    writer.close()
    return path


def test_an_incomplete_file_counts_its_header_as_results_and_is_refused_as_a_baseline(tmp_path: Path) -> None:
    killed = load_results(write(tmp_path / "k.jsonl", [rec(i) for i in range(4)], summary=False,
                                declared={"t": [str(i) for i in range(10)]}))
    assert not killed.complete
    assert killed.tasks()["t"].declared == 10
    as_results = outcomes_from_results(killed)["t"]
    assert as_results.ran() == {str(i) for i in range(10)}
    v = only(evaluate_gate(outcomes_from_results(killed), BASE))
    assert v.verdict == "insufficient coverage"
    assert v.not_graded["declared but never reported (an interrupted run?)"] == [str(i) for i in range(4, 10)]

    problem = gate_input_problem(killed, "baseline")
    assert problem and "incomplete" in problem and "--hud-allow-incomplete-baseline" in problem
    assert gate_input_problem(killed, "baseline", allow_incomplete=True) is None
    assert gate_input_problem(killed, "results") is None
    # Accepted as a baseline, only its episodes count.
    assert outcomes_from_results(killed, as_baseline=True)["t"].ran() == {"0", "1", "2", "3"}


def test_a_shards_file_is_refused_on_either_side(tmp_path: Path) -> None:
    shard = load_results(write(tmp_path / "s.jsonl", [rec(0)], shard={"index": 2, "count": 3, "suite": {}}))
    for side in ("results", "baseline"):
        problem = gate_input_problem(shard, side)
        assert problem and "one shard (2/3)" in problem and "merge" in problem


def test_the_results_file_that_is_the_baseline_goes_beside_it(tmp_path: Path) -> None:
    results = tmp_path / "hud-results.jsonl"
    assert results_paths(results, "hud-results.jsonl", tmp_path) == (
        tmp_path / "hud-results.candidate.jsonl", results)
    assert results_paths(results, "other.jsonl", tmp_path) == (results, None)
    assert results_paths(results, None, tmp_path) == (results, None)


def test_policy_specs_are_checked_without_running_them(tmp_path: Path) -> None:
    (tmp_path / "pol.py").write_text("import os\n\ndef balance():\n    return 1\n\nfast = balance\n")
    (tmp_path / "star.py").write_text("from os.path import *\n")
    assert check_policy_spec("pol.py:balance", tmp_path).kind == "file"
    assert check_policy_spec("pol.py:fast", tmp_path).kind == "file"
    assert check_policy_spec("star.py:anything", tmp_path).kind == "file"  # names known only at run time
    with pytest.raises(PolicyError, match="'nope.py' .*does not exist"):
        check_policy_spec("nope.py:balance", tmp_path)
    with pytest.raises(PolicyError, match="defines no 'balanse' \\(did you mean 'balance'\\?\\)"):
        check_policy_spec("pol.py:balanse", tmp_path)
    with pytest.raises(PolicyError, match="no module 'no_such_module_hud'"):
        check_policy_spec("no_such_module_hud:f", tmp_path)
    assert check_policy_spec("ws://127.0.0.1:1", tmp_path).kind == "url"


@pytest.mark.parametrize(("spec", "expected"), [
    ("/ci/build/evals/sims/classic.py:cartpole", "evals/sims/classic.py:cartpole"),
    ("/ci/build/../build/evals/p.py:act", "evals/p.py:act"),
    ("/elsewhere/sims.py:task", "/elsewhere/sims.py:task"),          # outside the project: as written
    ("/ci/buildings/sims.py:task", "/ci/buildings/sims.py:task"),     # a sibling, not under the root
    ("sims.py:task", "sims.py:task"),                                 # already relative
    ("/ci/build/evals/checkpoints/act/final", "evals/checkpoints/act/final"),  # a checkpoint folder
    ("lerobot/act_aloha_sim", "lerobot/act_aloha_sim"),               # a hub id
    ("CartPole-v1", "CartPole-v1"),
    ("gym_pusht/PushT-v0", "gym_pusht/PushT-v0"),
    ("my_pkg.sims:make", "my_pkg.sims:make"),
    (None, None),
])
def test_a_sim_or_policy_file_is_recorded_relative_to_the_rootdir(spec, expected):
    from pytest_hud.core.specs import portable_spec

    assert portable_spec(spec, ["/ci/build", "/ci/build/evals"]) == expected
