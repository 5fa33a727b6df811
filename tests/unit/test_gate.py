"""The gate's verdicts: one scenario per rule, hand-computed p-values, and the gate file's errors."""

from __future__ import annotations

import json

import pytest

from pytest_hud.gate import (
    GateConfig, TaskOutcomes, Verdict, evaluate_gate, floor_for, gate_passed, load_gate_file,
    nothing_compared, outcomes_from_records,
)
from pytest_hud.stats import boschloo_exact_one_sided, unpaired_power


def episodes(
    pattern: str, *, prefix: str = "seed", errors: int = 0, declared: int | None = None
) -> TaskOutcomes:
    """Outcomes from a string like "1101": episode ids seed0, seed1, ...; 1 = success."""
    successes = {f"{prefix}{i}": c == "1" for i, c in enumerate(pattern)}
    if declared is None:
        declared = len(successes) + errors
    return TaskOutcomes(successes, errors=errors, declared=declared)


def only(verdicts: list[Verdict], task: str = "t") -> Verdict:
    (verdict,) = [v for v in verdicts if v.task == task]
    return verdict


# --------------------------------------------------------------------------------------------------
# comparison with a baseline
# --------------------------------------------------------------------------------------------------


def test_a_paired_drop_is_a_regression_with_the_exact_mcnemar_p() -> None:
    base = {"t": episodes("1" * 10)}
    cur = {"t": episodes("1" * 2 + "0" * 8)}
    v = only(evaluate_gate(cur, base))
    assert v.verdict == "regression" and v.test == "paired-mcnemar"
    assert v.discordant == (8, 0) and v.n_pairs == 10
    assert v.p_value == 2.0**-8 and v.adjusted_p == 2.0**-8  # one task: Holm changes nothing
    assert v.drop == pytest.approx(0.8)
    assert not gate_passed([v])


def test_an_unchanged_policy_with_enough_episodes_passes() -> None:
    # 100 seeds, 80% success; 3 episodes flipped each way between the runs.
    base_pattern = "1" * 80 + "0" * 20
    cur_pattern = "0" * 3 + "1" * 77 + "1" * 3 + "0" * 17
    v = only(evaluate_gate({"t": episodes(cur_pattern)}, {"t": episodes(base_pattern)}))
    assert v.verdict == "pass" and v.test == "paired-mcnemar"
    assert v.discordant == (3, 3) and v.p_value == pytest.approx(42 / 64)
    assert v.min_detectable_drop is not None and v.min_detectable_drop <= 0.10
    assert v.more_episodes_needed is None
    assert gate_passed([v])


def test_too_few_episodes_to_see_a_drop_is_inconclusive_not_pass() -> None:
    v = only(evaluate_gate({"t": episodes("1" * 9 + "0")}, {"t": episodes("1" * 9 + "0")}))
    assert v.verdict == "inconclusive"
    assert v.min_detectable_drop is not None and v.min_detectable_drop > 0.10
    assert v.more_episodes_needed is not None and v.more_episodes_needed > 10
    assert "more" in v.reason
    assert gate_passed([v]) and not gate_passed([v], strict=True)


def test_different_episode_ids_are_compared_unpaired_with_boschloo() -> None:
    base = {"t": episodes("1" * 45 + "0" * 5, prefix="old")}
    cur = {"t": episodes("1" * 30 + "0" * 20, prefix="new")}
    v = only(evaluate_gate(cur, base))
    assert v.test == "unpaired-boschloo" and v.discordant is None and v.n_pairs == 0
    assert v.p_value == pytest.approx(boschloo_exact_one_sided(30, 50, 45, 50))
    assert v.verdict == "regression"
    assert v.current_rate == pytest.approx(0.6) and v.baseline_rate == pytest.approx(0.9)


def test_a_perfect_baseline_does_not_lend_an_unpaired_run_power_it_lacks() -> None:
    """32/32 before, 20/20 now on other seeds: a 10-point drop would be flagged only if 3 or more of
    the 20 failed, which happens 32% of the time; the normal approximation used to claim 80% and say
    pass ("would have been caught")."""
    base = {"t": episodes("1" * 32, prefix="old")}
    cur = {"t": episodes("1" * 20, prefix="new")}
    v = only(evaluate_gate(cur, base))
    assert v.test == "unpaired-boschloo" and v.verdict == "inconclusive"
    assert v.min_detectable_drop > 0.10 and v.more_episodes_needed is not None
    assert boschloo_exact_one_sided(17, 20, 32, 32) <= 0.05 < boschloo_exact_one_sided(18, 20, 32, 32)
    assert unpaired_power(20, 32, 0.10, baseline_rate=1.0) == pytest.approx(0.3231, abs=1e-4)  # P(Bin(20, .1) >= 3)


def test_pairing_needs_most_episodes_shared_on_both_sides() -> None:
    base = episodes("1" * 20)
    # 18 of 20 ids shared (90%): paired on the 18, the two unmatched dropped.
    cur_ids = {f"seed{i}": i >= 6 for i in range(18)} | {"extra0": False, "extra1": False}
    v = only(evaluate_gate({"t": TaskOutcomes(cur_ids, declared=20)}, {"t": base}))
    assert v.test == "paired-mcnemar" and v.n_pairs == 18 and v.discordant == (6, 0)
    # The baseline's 20 shared among 40 (50%): unpaired over all episodes.
    cur_ids = {f"seed{i}": True for i in range(20)} | {f"other{i}": False for i in range(20)}
    v = only(evaluate_gate({"t": TaskOutcomes(cur_ids, declared=40)}, {"t": base}))
    assert v.test == "unpaired-boschloo" and v.n_current == 40 and v.n_baseline == 20
    # Half the baseline's episodes no longer collected: they count against coverage, by name.
    cur_ids = {f"seed{i}": True for i in range(10)} | {f"other{i}": False for i in range(10)}
    v = only(evaluate_gate({"t": TaskOutcomes(cur_ids, declared=20, episodes=frozenset(cur_ids))}, {"t": base}))
    assert v.verdict == "insufficient coverage" and v.coverage == pytest.approx(20 / 30)
    assert v.not_graded == {"not collected now": [f"seed{i}" for i in range(10, 20)]}


def test_holm_correction_spreads_alpha_over_tasks() -> None:
    # 5 worse, 0 better: p = 1/32 = 0.03125 < 0.05 on its own...
    base = episodes("1" * 5 + "0" * 5)
    cur = episodes("0" * 10)
    alone = only(evaluate_gate({"a": cur}, {"a": base}), "a")
    assert alone.p_value == 1 / 32 and alone.verdict == "regression"
    # ...but two such tasks: Holm-adjusted 2/32 = 0.0625 > 0.05 for both.
    both = evaluate_gate({"a": cur, "b": cur}, {"a": base, "b": base})
    assert [v.adjusted_p for v in both] == [pytest.approx(1 / 16)] * 2
    assert all(v.verdict != "regression" for v in both)


def test_a_drop_within_max_drop_is_never_a_regression() -> None:
    # 400 seeds; 16 that used to succeed now fail, nothing improved: a 4-point drop, p ~ 1.5e-5.
    base = episodes("1" * 360 + "0" * 40)
    cur = episodes("0" * 16 + "1" * 344 + "0" * 40)
    strict = only(evaluate_gate({"t": cur}, {"t": base}, GateConfig(max_drop=0.0)))
    assert strict.verdict == "regression" and strict.p_value < 1e-4
    tolerant = only(evaluate_gate({"t": cur}, {"t": base}, GateConfig(max_drop=0.05)))
    assert tolerant.test == "paired-noninferiority"
    assert tolerant.verdict != "regression" and tolerant.p_value > 0.5
    # A drop well beyond the tolerance is still caught.
    worse = episodes("0" * 60 + "1" * 300 + "0" * 40)
    beyond = only(evaluate_gate({"t": worse}, {"t": base}, GateConfig(max_drop=0.05)))
    assert beyond.verdict == "regression" and "tolerance" in beyond.reason


def test_unpaired_tolerance_uses_the_noninferiority_test() -> None:
    base = {"t": episodes("1" * 47 + "0" * 3, prefix="old")}
    cur = {"t": episodes("1" * 45 + "0" * 5, prefix="new")}
    v = only(evaluate_gate(cur, base, GateConfig(max_drop=0.05)))
    assert v.test == "unpaired-noninferiority" and v.verdict != "regression"


# --------------------------------------------------------------------------------------------------
# coverage
# --------------------------------------------------------------------------------------------------


def test_too_many_errors_is_insufficient_coverage_even_when_the_rest_succeed() -> None:
    base = {"t": episodes("1" * 10)}
    cur = {"t": episodes("1" * 8, errors=2)}  # 8 of 10 finished: 80% < 90%
    v = only(evaluate_gate(cur, base))
    assert v.verdict == "insufficient coverage" and v.test == "coverage"
    assert v.coverage == pytest.approx(0.8) and "2 errors" in v.reason
    assert not gate_passed([v])
    assert only(evaluate_gate(cur, base, GateConfig(min_coverage=0.8))).verdict != "insufficient coverage"


def test_declared_episodes_that_never_reported_count_against_coverage() -> None:
    v = only(evaluate_gate({"t": episodes("1" * 5, declared=10)}, None))
    assert v.verdict == "insufficient coverage" and v.coverage == pytest.approx(0.5)


def test_a_baseline_task_missing_now_is_insufficient_coverage() -> None:
    ten = episodes("1" * 10)
    verdicts = evaluate_gate({"kept": ten}, {"kept": ten, "gone": ten})
    gone = only(verdicts, "gone")
    assert gone.verdict == "insufficient coverage" and gone.n_current == 0 and gone.n_baseline == 10
    assert "not run" in gone.reason
    assert not gate_passed(verdicts)


def test_a_task_with_no_finished_episode_is_insufficient_coverage() -> None:
    config = GateConfig(min_coverage=0.0)
    v = only(evaluate_gate({"t": episodes("", errors=4)}, {"t": episodes("1111")}, config))
    assert v.verdict == "insufficient coverage" and v.current_rate is None


# --------------------------------------------------------------------------------------------------
# no baseline, floors
# --------------------------------------------------------------------------------------------------


def test_a_task_without_baseline_or_floor_is_no_baseline_never_pass() -> None:
    for baseline in (None, {}):
        v = only(evaluate_gate({"t": episodes("0" * 10)}, baseline))
        assert v.verdict == "no baseline" and v.p_value is None and not v.failed
        assert "no baseline" in v.reason


def test_a_new_task_beside_compared_ones_is_no_baseline_and_the_gate_passes() -> None:
    ten = episodes("1" * 10)
    verdicts = evaluate_gate({"old": ten, "new": ten}, {"old": ten})
    assert only(verdicts, "new").verdict == "no baseline" and "not in the baseline" in only(verdicts, "new").reason
    assert only(verdicts, "old").verdict == "inconclusive"  # compared (too few episodes to say pass)
    assert gate_passed(verdicts) and nothing_compared(verdicts) is None


def test_a_baseline_task_with_only_errors_is_no_baseline_not_pass() -> None:
    v = only(evaluate_gate({"t": episodes("0" * 10)}, {"t": episodes("", errors=10)}))
    assert v.verdict == "no baseline" and "none of its 10 baseline episodes" in v.reason


def test_a_gate_that_compared_nothing_while_episodes_ran_fails() -> None:
    verdicts = evaluate_gate({"a": episodes("1" * 10), "b": episodes("0" * 5)}, {})
    assert {v.verdict for v in verdicts} == {"no baseline"}
    assert not gate_passed(verdicts) and "nothing was compared" in nothing_compared(verdicts)


def skipped(n: int, reason: str = "LeRobot is not installed") -> TaskOutcomes:
    return TaskOutcomes({}, 0, 0, skipped=n, skip_reason=reason)


def test_a_task_skipped_on_both_sides_is_skipped_with_its_reason_and_does_not_fail() -> None:
    ten = episodes("1" * 10)
    verdicts = evaluate_gate({"ran": ten, "opt": skipped(24)}, {"ran": ten, "opt": skipped(24)})
    v = only(verdicts, "opt")
    assert v.verdict == "skipped" and "LeRobot is not installed" in v.reason and "both runs" in v.reason
    assert not v.failed and gate_passed(verdicts)


def test_a_task_graded_in_the_baseline_but_skipped_now_fails_and_says_skipped() -> None:
    v = only(evaluate_gate({"opt": skipped(24)}, {"opt": episodes("1" * 24)}), "opt")
    assert v.verdict == "insufficient coverage" and v.failed
    assert v.reason.startswith("skipped in this run (LeRobot is not installed) but graded in the baseline")


def test_a_baseline_task_deselected_now_fails_and_says_deselected() -> None:
    ten = episodes("1" * 10)
    dropped = only(evaluate_gate({"kept": ten}, {"kept": ten, "gone": ten}, deselected={"gone"}), "gone")
    assert dropped.verdict == "insufficient coverage" and "deselected in this run" in dropped.reason
    renamed = only(evaluate_gate({"kept": ten}, {"kept": ten, "gone": ten}), "gone")
    assert "not collected in this run" in renamed.reason and "deselected" not in renamed.reason


def test_a_baseline_task_that_was_only_skipped_there_and_is_absent_now_does_not_fail() -> None:
    ten = episodes("1" * 10)
    verdicts = evaluate_gate({"kept": ten}, {"kept": ten, "opt": skipped(4)})
    assert only(verdicts, "opt").verdict == "skipped" and gate_passed(verdicts)


def test_skipped_records_carry_their_reason_into_the_outcomes() -> None:
    from types import SimpleNamespace as R

    recs = [R(task="t", episode=str(i), outcome="skipped", success=None, skip_reason="no GPU") for i in range(3)]
    out = outcomes_from_records(recs, {"t": 3})["t"]
    assert out.all_skipped and out.skipped == 3 and out.skip_reason == "no GPU" and out.declared == 0


def test_floor_clearly_missed_is_a_regression() -> None:
    # 3/30 = 10%, Wilson 95% [3.5%, 25.6%], well below 60%.
    v = only(evaluate_gate({"t": episodes("111" + "0" * 27)}, None, GateConfig(floors={"t": 0.6})))
    assert v.verdict == "regression" and v.test == "floor" and v.floor == 0.6
    assert v.current_interval is not None and v.current_interval[1] < 0.6


def test_floor_missed_within_the_interval_is_inconclusive() -> None:
    # 5/10 = 50%, Wilson 95% [23.7%, 76.3%] reaches the 60% floor.
    v = only(evaluate_gate({"t": episodes("1" * 5 + "0" * 5)}, None, GateConfig(floors={"t": 0.6})))
    assert v.verdict == "inconclusive" and v.test == "floor"
    assert v.more_episodes_needed is not None and v.more_episodes_needed > 50


def test_floor_met_passes_even_if_the_interval_dips_below() -> None:
    v = only(evaluate_gate({"t": episodes("1" * 7 + "0" * 3)}, None, GateConfig(floors={"t": 0.6})))
    assert v.verdict == "pass" and v.test == "floor"


def test_floors_match_exact_ids_before_globs() -> None:
    floors = {"evals/test_push.py::*": 0.3, "evals/test_push.py::test_hard": 0.1, "*": 0.9}
    assert floor_for("evals/test_push.py::test_hard", floors) == 0.1
    assert floor_for("evals/test_push.py::test_easy", floors) == 0.3
    assert floor_for("evals/other.py::test_x", floors) == 0.9
    assert floor_for("x", {}) is None


def test_a_floor_regression_wins_over_a_passing_comparison() -> None:
    same = episodes("1" * 20 + "0" * 80)
    v = only(evaluate_gate({"t": same}, {"t": same}, GateConfig(floors={"t": 0.5})))
    assert v.verdict == "regression" and v.test == "floor"
    assert v.p_value == 1.0  # the comparison still ran and is reported
    assert "floor" in v.reason and "paired-mcnemar" in v.reason


# --------------------------------------------------------------------------------------------------
# records and configuration
# --------------------------------------------------------------------------------------------------


def test_verdicts_serialise_to_builtin_types_only() -> None:
    verdicts = evaluate_gate(
        {"a": episodes("1" * 9 + "0"), "b": episodes("1" * 2 + "0" * 8)},
        {"a": episodes("1" * 10), "b": episodes("1" * 10)},
        GateConfig(max_drop=0.05),
    )
    for v in verdicts:
        d = v.to_dict()
        assert json.loads(json.dumps(d, allow_nan=False)) == d

        def check(value: object) -> None:
            assert type(value) in (str, int, float, bool, list, dict, type(None)), (d["task"], value)
            if isinstance(value, list):
                for item in value:
                    check(item)
            if isinstance(value, dict):
                for key, item in value.items():
                    assert type(key) is str
                    check(item)

        for value in d.values():
            check(value)
    assert only(verdicts, "b").to_dict()["discordant"] == [8, 0]


def test_gate_passed_ignores_passes_and_inconclusives_by_default() -> None:
    kinds = ["pass", "inconclusive", "pass"]
    verdicts = [Verdict(task=str(i), verdict=k) for i, k in enumerate(kinds)]  # type: ignore[arg-type]
    assert gate_passed(verdicts)
    assert not gate_passed(verdicts, strict=True)
    assert not gate_passed([*verdicts, Verdict(task="x", verdict="insufficient coverage")])
    assert gate_passed([])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"alpha": 0.0}, "alpha"),
        ({"alpha": "0.05"}, "alpha"),
        ({"max_drop": 1.0}, "max_drop"),
        ({"min_coverage": 1.5}, "min_coverage"),
        ({"power": 1.0}, "power"),
        ({"max_drop": 0.1, "detect_drop": 0.05}, "detect_drop"),
        ({"floors": {"t": 1.2}}, "'t'"),
    ],
)
def test_gate_config_rejects_bad_values(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GateConfig(**kwargs)


def test_detect_drop_defaults_to_ten_points_beyond_the_tolerance() -> None:
    assert GateConfig().target_drop == pytest.approx(0.10)
    assert GateConfig(max_drop=0.05).target_drop == pytest.approx(0.15)
    assert GateConfig(detect_drop=0.2).target_drop == 0.2


# --------------------------------------------------------------------------------------------------
# gate file
# --------------------------------------------------------------------------------------------------


def test_gate_file_becomes_gate_config_arguments() -> None:
    text = """
alpha: 0.01
max_drop: 0.05
min_coverage: 0.8
tasks:
  "evals/test_push.py::test_push": {min_success: 0.6}
  "evals/test_aloha.py::*":
    min_success: 0
"""
    parsed = load_gate_file(text)
    assert parsed == {
        "alpha": 0.01,
        "max_drop": 0.05,
        "min_coverage": 0.8,
        "floors": {"evals/test_push.py::test_push": 0.6, "evals/test_aloha.py::*": 0.0},
    }
    config = GateConfig(**parsed)
    assert config.alpha == 0.01 and floor_for("evals/test_aloha.py::test_fold", config.floors) == 0.0


def test_an_empty_gate_file_changes_nothing() -> None:
    assert load_gate_file("") == {}
    assert load_gate_file("# only a comment\n") == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("alpah: 0.05", r"unknown key 'alpah' \(did you mean 'alpha'\?\); known keys are alpha, max_drop"),
        ("alpha: '0.05'", r"alpha must be a number, got str"),
        ("alpha: true", r"alpha must be a number, got bool"),
        ("alpha: 2", r"alpha=2.0 must be strictly between 0 and 1"),
        ("max_drop: 0.2\ndetect_drop: 0.1", r"detect_drop"),
        ("tasks: [a, b]", r"tasks must map task ids"),
        ("tasks: {t: 0.6}", r"tasks\['t'\] must be a mapping like \{min_success: 0.6\}"),
        (
            "tasks: {t: {min_sucess: 0.6}}",
            r"tasks\['t'\]: unknown key 'min_sucess' \(did you mean 'min_success'\?\)",
        ),
        ("tasks: {t: {min_success: high}}", r"tasks\['t'\].min_success must be a number, got str"),
        ("tasks: {t: {min_success: 1.5}}", r"'t'.*min_success must be a number in \[0, 1\]"),
        ("tasks: {1: {min_success: 0.5}}", r"task key 1 must be a string"),
        ("- alpha: 0.05", r"must be a mapping of settings"),
        ("alpha: [0.05", r"not valid YAML"),
    ],
)
def test_gate_file_errors_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        load_gate_file(text, source="gate.yaml")
    assert str(info.value).startswith("gate.yaml")
