"""PointReach with a LeRobot ACT policy: the checkpoint `scripts/make_lerobot_checkpoints.py` trains.

Runs when LeRobot is installed (`pip install -e ".[evals,lerobot]"`); skipped with the reason
otherwise. `evals/checkpoints/reach_act/early` is an earlier, worse checkpoint of the same run:
pass it with `--hud-policy` to see the gate flag it against a baseline of the final one.
"""

import importlib.util
from pathlib import Path

import pytest

HERE = Path(__file__).parent

pytestmark = [
    # find_spec, not an import: with --hud-policy-server, workers must not load torch at all
    pytest.mark.skipif(importlib.util.find_spec("lerobot") is None,
                       reason="LeRobot is not installed: pip install 'pytest-hud[lerobot]'"),
    pytest.mark.hud(
        sim=f"{HERE / 'sims' / 'reach.py'}:make_reach",
        policy=str(HERE / "checkpoints" / "reach_act" / "final"),
        min_success=0.9,  # the gate's floor (24 of 24)
    ),
]


@pytest.mark.parametrize("seed", range(24))
def test_reach_with_act(shared_sim, robot_agent, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed, prompt="reach the green goal"))
    assert result.success, f"goal not reached in {result.steps} steps"
