"""PointReach seen through a 64x64 camera only: the image path end to end.

The policy finds the red agent and the green goal in the image and maps their offset to a velocity
with a head fitted by behaviour cloning on scripted-expert demonstrations.
"""

from pathlib import Path

import pytest

HERE = Path(__file__).parent

pytestmark = pytest.mark.hud(
    sim=f"{HERE / 'sims' / 'reach_pixels.py'}:reach_pixels",
    policy=f"{HERE / 'policies' / 'numpy_policies.py'}:reach_pixels",
    min_success=0.9,  # the gate's floor (24 of 24)
)


@pytest.mark.parametrize("seed", range(24))
def test_reach_the_goal(shared_sim, robot_agent, seed):
    assert shared_sim.contract.cameras == ["pixels"]
    result = robot_agent.run(shared_sim.episode(seed=seed))
    assert result.success, f"goal not reached in {result.steps} steps"
