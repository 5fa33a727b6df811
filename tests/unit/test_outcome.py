"""Outcome classification and the episode record, by exception type; plain function calls."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pytest_hud.core.outcome import classify, episode_identity, episode_record, skip_reason


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


def test_skip_reasons_come_from_the_report():
    assert skip_reason(("t.py", 3, "Skipped: LeRobot is not installed")) == "LeRobot is not installed"
    assert skip_reason(None) is None


def test_the_record_carries_the_bridge_error_and_builtin_numbers():
    import numpy as np

    result = SimpleNamespace(score=np.float32(1.0), total_reward=np.float64(60.0), steps=np.int64(60),
                             duration_s=0.5, slot=1, artefacts={}, success=True, success_at_reset=False,
                             inference_s=0.1, terminated=False, truncated=True, seed=4)
    rec = episode_record({"task": "t", "episode": "4", "seed": None, "nodeid": "n"}, outcome="error",
                         identity={}, worker="gw0", duration_s=1.0, exc=AssertionError("x"),
                         bridge_error="slot 1: no action within 30 s", result=result)
    assert rec["error"] == "slot 1: no action within 30 s" and rec["success"] is None and rec["seed"] == 4
    assert type(rec["steps"]) is int and type(rec["score"]) is float
    failed = episode_record({"task": "t", "episode": "4", "seed": 4, "nodeid": "n"}, outcome="failed",
                            identity={}, worker="gw0", duration_s=1.0, exc=AssertionError("x"))
    assert failed["success"] is False and failed["error"] is None
