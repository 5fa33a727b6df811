"""Which sims' bridges a run starts before its first test: those of the episodes each worker
begins with, as pytest-xdist's load scheduling hands tests out (then one more, booting ahead)."""

from __future__ import annotations

import pytest

from pytest_hud.controller.bridges import first_sims


@pytest.mark.parametrize(("episode_sims", "workers", "expected"), [
    ([0, 0, 1, 1, 2, 2, 3, 3], 2, [0, 1]),  # 8 tests, 2 workers: chunks of 2 (items 0-1 and 2-3)
    ([0] * 500 + [1] * 500 + [2] * 500 + [3] * 500, 8, [0]),  # the protocol: every worker starts on suite 0
    ([0] * 10 + [1] * 10 + [2] * 10, 3, [0]),  # chunks of 2 (a quarter of 10): items 0, 2 and 4 first
    ([0, 1, 2], 2, [0, 1]),  # fewer than two tests a worker: one each, round-robin
    ([0, 1, 2], 8, [0, 1, 2]),
    ([None, None, 0, 1], 1, []),  # the first test steps no bridge: none to begin with
    ([], 2, []),
    ([0, 1], 0, [0]),  # no xdist: one worker
], ids=["smoke", "protocol", "three-sims", "round-robin", "more-workers", "no-bridge", "none", "no-xdist"])
def test_the_sims_each_worker_begins_with(episode_sims, workers, expected):
    assert first_sims(episode_sims, workers) == expected
