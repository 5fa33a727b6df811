"""Outcome classification and the episode record, by exception type; plain function calls."""

from __future__ import annotations

import pytest

from pytest_hud.core.classify import classify, episode_identity, episode_record, skip_reason


class Failed(Exception):
    """Stands in for pytest's ``Failed`` (what ``pytest.fail`` and pytest-timeout raise)."""


FAILURES = (AssertionError, Failed)


@pytest.mark.parametrize("kw, expected", [
    (dict(when="call", passed=True, skipped=False, exc=None, bridge_error=None), "passed"),
    (dict(when="call", passed=False, skipped=False, exc=AssertionError("no"), bridge_error=None), "failed"),
    (dict(when="call", passed=False, skipped=False, exc=Failed("policy fell"), bridge_error=None), "failed"),
    (dict(when="call", passed=False, skipped=False, exc=RuntimeError("boom"), bridge_error=None), "error"),
    (dict(when="setup", passed=False, skipped=False, exc=AssertionError("in a fixture"), bridge_error=None), "error"),
    (dict(when="call", passed=True, skipped=False, exc=None, bridge_error="slot 2 timed out"), "error"),
    (dict(when="call", passed=False, skipped=False, exc=AssertionError("no"), bridge_error="sim raised"), "error"),
    (dict(when="call", passed=False, skipped=False, exc=Failed("Timeout >5.0s"), bridge_error=None), "error"),
    (dict(when="setup", passed=False, skipped=True, exc=None, bridge_error=None), "skipped"),
])
def test_an_assertion_is_a_failure_anything_else_or_a_bridge_verdict_is_an_error(kw, expected):
    assert classify(**kw, failure_types=FAILURES) == expected


def test_identity_separates_the_episode_parameter_from_the_task():
    ident = episode_identity("t.py::test_x[3-a]", {"seed": 3, "arm": "a"})
    assert ident == {"task": "t.py::test_x[arm=a]", "episode": "3", "seed": 3, "nodeid": "t.py::test_x[3-a]"}
    assert episode_identity("t.py::test_y[e1]", {"episode": "e1", "seed": 9})["episode"] == "e1"
    assert episode_identity("t.py::test_z", None) == {"task": "t.py::test_z", "episode": "0", "seed": None,
                                                     "nodeid": "t.py::test_z"}


def test_long_parameter_values_that_share_a_prefix_stay_two_tasks():
    # robustness levels and build strings are often long and alike; the gate pairs by task id
    a = "perturbation_object_positions_shifted_by_2cm_left"
    b = "perturbation_object_positions_shifted_by_2cm_right"
    task_a = episode_identity("t.py::test_p[0-a]", {"seed": 0, "level": a})["task"]
    task_b = episode_identity("t.py::test_p[0-b]", {"seed": 0, "level": b})["task"]
    assert task_a != task_b
    assert task_a == episode_identity("t.py::test_p[1-a]", {"seed": 1, "level": a})["task"]  # stable
    assert len(task_a) < len("t.py::test_p[level=]") + len(a)  # still cut to keep tables readable
    assert episode_identity("t.py::test_p[0]", {"seed": 0, "level": "x" * 40})["task"].endswith("x" * 40 + "]")


def test_skip_reasons_come_from_the_report():
    assert skip_reason(("t.py", 3, "Skipped: LeRobot is not installed")) == "LeRobot is not installed"
    assert skip_reason(None) is None


def test_the_record_carries_the_bridge_error_and_builtin_numbers():
    import numpy as np

    from pytest_hud.core.results import EpisodeResult

    result = EpisodeResult(score=np.float32(1.0), total_reward=np.float64(60.0), steps=np.int64(60),
                           duration_s=0.5, slot=1, artefacts={}, success=True, success_at_reset=False,
                           inference_s=0.1, terminated=False, truncated=True, seed=4)
    rec = episode_record({"task": "t", "episode": "4", "seed": None, "nodeid": "n"}, outcome="error",
                         identity={}, worker="gw0", duration_s=1.0, exc=AssertionError("x"),
                         bridge_error="slot 1: no action within 30 s", result=result).to_dict()
    assert rec["error"] == "slot 1: no action within 30 s" and rec["success"] is None and rec["seed"] == 4
    assert type(rec["steps"]) is int and type(rec["score"]) is float
    failed = episode_record({"task": "t", "episode": "4", "seed": 4, "nodeid": "n"}, outcome="failed",
                            identity={}, worker="gw0", duration_s=1.0, exc=AssertionError("x"))
    assert failed.success is False and failed.error is None


def test_one_result_type_from_the_bridges_grade_to_the_results_line():
    import json
    from dataclasses import fields

    from pytest_hud.bridge.slots import Slot
    from pytest_hud.core.classify import episode_record
    from pytest_hud.core.results import EpisodeRecord, EpisodeResult

    slot = Slot(2, seed=7, prompt="push", steps=30, total_reward=4.5, success=True, terminated=True)
    grade = slot.result()
    assert isinstance(grade, EpisodeResult) and grade.score == 1.0 and grade.slot == 2
    wire = json.loads(json.dumps({**grade.to_dict(), "task": {"seed": 7}}))  # what result(token) sends
    assert EpisodeResult.from_dict(wire) == grade
    done = EpisodeResult.from_dict(wire).completed(duration_s=1.5, inference_s=0.25, artefacts={"video": "v.mp4"})
    assert (done.success, done.steps, done.duration_s, done.artefacts) == (True, 30, 1.5, {"video": "v.mp4"})
    assert not grade.completed(duration_s=1.0, error="EpisodeError: boom").success  # the agent's error wins
    done.replay_s = 0.75  # the agent replayed it for its video
    record = episode_record({"task": "t.py::test_x", "episode": "7", "nodeid": "t.py::test_x[7]", "seed": 7},
                            outcome="passed", identity={}, worker="gw0", duration_s=2.0, result=done)
    assert isinstance(record, EpisodeRecord)  # the worker's grade is the record itself, no dict built by hand
    # every field of the result lands under its own name, or in extra, of the record
    landed = {f.name for f in fields(EpisodeRecord)} | set(record.extra) | {"success", "error", "prompt"}
    assert {f.name for f in fields(EpisodeResult)} <= landed
    line = EpisodeRecord.from_dict(json.loads(json.dumps(record.to_dict())))  # the xdist channel, the file
    assert line == record
    assert (line.steps, line.total_reward, line.duration_s, line.slot) == (30, 4.5, 1.5, 2)
    assert line.extra["inference_s"] == 0.25 and line.artefacts == {"video": "v.mp4"}
    assert line.extra["replay_s"] == 0.75
    graded = episode_record({"task": "t", "episode": "1", "nodeid": "t[1]"}, outcome="error", identity={},
                            worker="gw0", duration_s=3.0, grade=wire, bridge_error="boom")
    assert graded.duration_s == 3.0 and graded.steps == 30 and graded.extra == {"env_success": True}
