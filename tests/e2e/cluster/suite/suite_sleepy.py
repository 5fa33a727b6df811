"""An eval suite for the Ray tests: a sleep-dominated sim and a parity policy (odd seeds pass).

Episodes, length and tick sleep come from the environment (``HUD_SUITE_EPISODES``,
``HUD_SUITE_LENGTH``, ``HUD_SUITE_SLEEP_MS``) so one file serves quick and long runs.
"""

import os
from pathlib import Path

import pytest

KIT = Path(__file__).resolve().parent.parent / "sleepy.py"

pytestmark = pytest.mark.hud(
    sim=f"{KIT}:make",
    policy=f"{KIT}:parity",
    build={"length": int(os.environ.get("HUD_SUITE_LENGTH", "10")),
           "sleep_ms": float(os.environ.get("HUD_SUITE_SLEEP_MS", "5"))},
)


@pytest.mark.parametrize("seed", range(int(os.environ.get("HUD_SUITE_EPISODES", "8"))))
def test_parity(shared_sim, robot_agent, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed))
    assert result.success, f"return {result.total_reward} after {result.steps} steps"
