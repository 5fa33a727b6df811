"""The CartPole example eval (real gymnasium env, trained linear policy), for the Ray tests."""

from pathlib import Path

import pytest

EVALS = Path(__file__).resolve().parents[4] / "evals"

pytestmark = pytest.mark.hud(
    sim=f"{EVALS / 'sims' / 'classic.py'}:cartpole",
    policy=f"{EVALS / 'policies' / 'numpy_policies.py'}:cartpole",
)


@pytest.mark.parametrize("seed", range(6))
def test_balance(shared_sim, robot_agent, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed))
    assert result.success, f"pole fell after {result.steps} steps"
