"""CartPole-v1 (Discrete actions): a linear policy trained by the cross-entropy method.

Success: the pole is still up when the 500-step limit ends the episode.
"""

from pathlib import Path

import pytest

HERE = Path(__file__).parent

pytestmark = pytest.mark.hud(
    sim=f"{HERE / 'sims' / 'classic.py'}:cartpole",
    policy=f"{HERE / 'policies' / 'numpy_policies.py'}:cartpole",
    min_success=0.9,  # the gate's floor: the final checkpoint balances 32/32, an earlier one 22/32
)


@pytest.mark.parametrize("seed", range(32))
def test_balance(shared_sim, robot_agent, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed))
    assert result.success, f"pole fell after {result.steps} steps"
