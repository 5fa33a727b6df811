"""The project the plugin's end-to-end tests run in: a CartPole sim with success, three policies,
an ini that names them, and the suites several test files run."""

from __future__ import annotations

import pytest


SIMS = '''
import gymnasium as gym

class Success(gym.Wrapper):
    """CartPole succeeds when it is still up at the time limit."""
    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        info["is_success"] = bool(truncated and not terminated)
        return obs, reward, terminated, truncated, info

def cartpole(max_steps=60):
    return Success(gym.make("CartPole-v1", max_episode_steps=max_steps))
'''

POLICIES = '''
import numpy as np

def balance():
    return lambda obs: int(obs["state"][2] + 0.5 * obs["state"][3] > 0)

def tilt():
    """Weak on purpose: episode lengths then depend on the seed."""
    return lambda obs: int(obs["state"][2] > 0)

def pendulum_zero():
    return lambda obs: np.zeros(1, np.float32)
'''

INI = """
[pytest]
hud_sim = sims:cartpole
hud_policy = policies:balance
hud_inline = never
"""  # (these files drive real bridges: CartPole's cheap steps would otherwise run in the workers)


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(sims=SIMS, policies=POLICIES)
    pytester.makeini(INI)
    return pytester


def run(pytester: pytest.Pytester, *args: str, timeout: float = 180) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=timeout)


BALANCE = '''
import pytest

@pytest.mark.parametrize("seed", range(6))
def test_balance(shared_sim, robot_agent, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed))
    assert result.success
'''


# BALANCE, each episode also noting which worker ran it on which bridge process
BALANCE_NOTING_THE_BRIDGE = BALANCE.replace("import pytest\n", "import os\nimport pytest\n", 1) + '''
    with open("bridges.txt", "a") as fh:
        fh.write(f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')} {shared_sim.stats()['pid']}\\n")
'''


def bridges_noted(pytester: pytest.Pytester) -> list[tuple[str, int]]:
    """(worker, bridge pid) of every episode of BALANCE_NOTING_THE_BRIDGE (read after the run ended)."""
    lines = (pytester.path / "bridges.txt").read_text().splitlines()
    return [(worker, int(pid)) for worker, pid in (line.split() for line in lines)]
