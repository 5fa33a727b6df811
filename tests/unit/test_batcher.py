"""The policy server's batching rules as plain calls: which requests share a forward, who a failure
is pinned on, how long a batch gathers.

No sockets and no threads: a fake model records every call it gets. ``tests/e2e/test_policy_server.py``
drives the same rules end to end through a real server.
"""

from __future__ import annotations

import numpy as np
import pytest

from pytest_hud.serving.batcher import Batcher, Outcome, RequestError


class Recording:
    """A batched model that records its calls; it raises on any batch holding an observation of id 13."""

    def __init__(self) -> None:
        self.calls: list[list[float]] = []  # each call's observations, by their "id"

    def predict_batch(self, observations, prompts):
        self.calls.append([float(o["id"][0]) for o in observations])
        if any(o["id"][0] == 13 for o in observations):
            raise RuntimeError("the policy chokes on 13")
        return [np.full((2, 1), o["id"][0]) for o in observations]


def obs(i: int, *, width: int = 1, dtype=np.float32) -> dict:
    return {"id": np.full(width, i, dtype)}


def ids(rows) -> list:
    """Each row's id (from its action chunk), or the exception's type name."""
    return [type(r).__name__ if isinstance(r, BaseException) else float(r[0, 0]) for r in rows]


# --------------------------------------------------------------------------------- forward
def test_stackable_observations_share_one_forward_and_each_caller_gets_its_own_row():
    model = Recording()
    outcome = Batcher(model).forward([obs(1), obs(2), obs(3)], [None, "p", None])
    assert model.calls == [[1.0, 2.0, 3.0]]
    assert outcome.forwards == 1
    assert ids(outcome.rows) == [1.0, 2.0, 3.0]
    assert all(r.dtype == np.float32 and r.shape == (2, 1) for r in outcome.rows)


def test_observations_of_different_shapes_or_dtypes_never_share_a_forward():
    model = Recording()
    batch = [obs(1), obs(2, width=3), obs(3), obs(4, dtype=np.float64), obs(5, width=3)]
    outcome = Batcher(model).forward(batch, [None] * len(batch))
    assert sorted(model.calls) == [[1.0, 3.0], [2.0, 5.0], [4.0]]  # one call per signature
    assert outcome.forwards == 3
    assert ids(outcome.rows) == [1.0, 2.0, 3.0, 4.0, 5.0]  # rows back in the callers' order


def test_a_batch_that_raises_is_retried_one_by_one_and_only_the_culprit_fails():
    model = Recording()
    outcome = Batcher(model).forward([obs(1), obs(13), obs(3)], [None] * 3)
    assert model.calls == [[1.0, 13.0, 3.0], [1.0], [13.0], [3.0]]  # the batch, then each one alone
    assert outcome.forwards == 4
    assert ids(outcome.rows) == [1.0, "RuntimeError", 3.0]
    assert "chokes on 13" in str(outcome.rows[1])


def test_a_lone_request_that_raises_fails_without_a_retry():
    model = Recording()
    outcome = Batcher(model).forward([obs(13), obs(2, width=2)], [None, None])
    assert sorted(model.calls) == [[2.0], [13.0]]  # two groups of one: nothing to retry
    assert outcome.forwards == 2
    assert ids(outcome.rows) == ["RuntimeError", 2.0]


def test_predict_batch_returning_the_wrong_number_of_rows_fails_as_a_request_error():
    class Short:
        def predict_batch(self, observations, prompts):
            return [np.zeros(1)]  # one row, whatever the batch

    outcome = Batcher(Short()).forward([obs(1), obs(2)], [None, None])
    # The batch of two returned one row: retried one by one, where one row is right.
    assert outcome.forwards == 3
    assert [r.shape for r in outcome.rows] == [(1, 1), (1, 1)]
    outcome = Batcher(type("Empty", (), {"predict_batch": lambda self, o, p: []})()).forward([obs(1)], [None])
    assert isinstance(outcome.rows[0], RequestError)


def test_a_model_without_predict_batch_is_called_once_per_request():
    calls = []

    class Plain:
        def predict(self, observation, prompt):
            calls.append((float(observation["id"][0]), prompt))
            if prompt == "bad":
                raise ValueError("no")
            return np.float64(observation["id"][0])  # a scalar: a chunk of one

    outcome = Batcher(Plain()).forward([obs(1), obs(2), obs(3)], ["a", "bad", None])
    assert calls == [(1.0, "a"), (2.0, "bad"), (3.0, None)]
    assert outcome.forwards == 3
    assert ids(outcome.rows) == [1.0, "ValueError", 3.0]
    assert outcome.rows[0].shape == (1, 1) and outcome.rows[0].dtype == np.float32


# ------------------------------------------------------------------------------- decisions
def test_a_batch_gathers_until_every_connection_waits_max_batch_waits_or_the_deadline():
    batcher = Batcher(Recording(), max_batch=4)
    assert batcher.waits(1, connections=3, now=0.0, deadline=1.0)
    assert not batcher.waits(3, connections=3, now=0.0, deadline=1.0)  # nobody else can join
    assert not batcher.waits(4, connections=9, now=0.0, deadline=1.0)  # max_batch
    assert not batcher.waits(1, connections=3, now=1.0, deadline=1.0)  # the window is over
    assert batcher.take(9) == 4 and batcher.take(2) == 2
    unlimited = Batcher(Recording())
    assert unlimited.waits(100, connections=101, now=0.0, deadline=1.0)
    assert unlimited.take(100) == 100


def test_the_window_stretches_to_a_share_of_a_recent_forward_up_to_its_cap():
    batcher = Batcher(Recording(), batch_window_s=0.002, window_share=0.1, max_window_s=0.020)
    assert batcher.window_s() == 0.002  # no forward yet
    batcher.timed(Outcome([], forwards=2, forward_s=0.100))  # 50 ms a forward
    assert batcher.window_s() == pytest.approx(0.005)
    batcher.timed(Outcome([], forwards=1, forward_s=1.0))  # moving average: 0.8 * 50 + 0.2 * 1000 ms
    assert batcher.forward_s == pytest.approx(0.240)
    assert batcher.window_s() == 0.020  # capped
    batcher.timed(Outcome([], forwards=0, forward_s=0.0))  # a batch that never ran counts for nothing
    assert batcher.forward_s == pytest.approx(0.240)
    assert Batcher(Recording(), window_share=0.0).window_s() == 0.002


@pytest.mark.parametrize("kwargs", [{"batch_window_s": -1}, {"window_share": 1.5}, {"max_batch": -1}])
def test_bad_settings_are_refused_up_front(kwargs):
    with pytest.raises(ValueError):
        Batcher(Recording(), **kwargs)
