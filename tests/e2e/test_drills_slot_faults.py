"""Drill: an env raises mid-run under ``pytest -n 2 --hud-width=2``, in each tick mode.

The suite's envs are independent (one gymnasium env per slot), and two of its seeds fault on
purpose: 13 in its reset, 21 at its tenth step. Those two episodes must be errors naming the
exception and their slot; every other episode must pass with exactly the result a clean run gives
(the env stepped on its own, without any bridge, and a run of the same suite without faults), and
the bridge must not be replaced. Every results line must carry what defines its episode, so one
that gave no seed can be run again from its record.
"""

from __future__ import annotations

import pytest

from conftest import SIMKIT
from pytest_hud.core.results import load_results
from simkit import FaultyEnv

pytestmark = pytest.mark.timeout(200)

SIMS = '''
from simkit import FaultyEnv

def faulty():
    return FaultyEnv(reset_faults=(13,), step_faults=(21,), delay=0.003)

def clean():
    return FaultyEnv(delay=0.003)
'''

POLICIES = '''
import numpy as np

def push():
    return lambda obs: np.array([0.5], np.float32)
'''

SUITE = '''
import pytest

@pytest.mark.parametrize("seed", [*range(8), 13, 21])
def test_walk(shared_sim, robot_agent, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed))
    assert result.steps == 30


@pytest.mark.parametrize("episode", range(2))
def test_unseeded(shared_sim, robot_agent, episode):
    result = robot_agent.run(shared_sim.episode())
    assert result.steps == 30
'''

INI = """
[pytest]
hud_policy = policies:push
hud_progress_interval = 0
asyncio_default_fixture_loop_scope = function
"""

TICKS = {
    "lockstep": ["--hud-tick=lockstep"],
    "ready": ["--hud-tick=ready"],
    "lanes": ["--hud-vectorization=processes", "--hud-tick=lanes"],
}


def reference(seed: int) -> float:
    """Seed ``seed``'s return with the suite's policy, on the env itself (no bridge, no pytest)."""
    env = FaultyEnv(delay=0.0)
    env.reset(seed=seed)
    total, done = 0.0, False
    while not done:
        _, reward, done, _, _ = env.step([0.5])
        total += reward
    return total


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(simkit=SIMKIT.read_text(), sims=SIMS, policies=POLICIES, test_suite=SUITE)
    pytester.makeini(INI)
    return pytester


def run(project: pytest.Pytester, sim: str, results: str, *args: str) -> dict[str, object]:
    project.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--hud-width=2", f"--hud-sim=sims:{sim}",
                                 f"--hud-results={results}", *args, timeout=150)
    return {r.nodeid.split("::", 1)[1]: r for r in load_results(project.path / results).latest_episodes()}


@pytest.mark.parametrize("tick", sorted(TICKS))
def test_an_env_that_raises_fails_its_own_episode_and_every_other_one_equals_a_clean_run(project, tick):
    got = run(project, "faulty", "faulty.jsonl", *TICKS[tick])
    errors = {name for name, r in got.items() if r.outcome == "error"}
    assert errors == {"test_walk[13]", "test_walk[21]"}, {n: (r.outcome, r.error) for n, r in got.items()}
    assert "env raised during reset: ValueError: reset refused seed 13 on purpose" in got["test_walk[13]"].error
    assert ("env raised during step: RuntimeError: step 10 of seed 21 exploded on purpose"
            in got["test_walk[21]"].error)
    for seed in range(8):
        record = got[f"test_walk[{seed}]"]
        assert record.outcome == "passed" and record.steps == 30
        assert record.total_reward == pytest.approx(reference(seed)), f"seed {seed} under {tick}"
        assert record.claim == {"seed": seed, "build": {}}
    if tick == "ready":  # and the same suite without faults gives the same episodes
        clean = run(project, "clean", "clean.jsonl", *TICKS[tick])
        for seed in range(8):
            assert clean[f"test_walk[{seed}]"].total_reward == got[f"test_walk[{seed}]"].total_reward
    assert not any("broken" in (r.error or "") for r in got.values())  # a slot's fault never breaks the bridge


def test_an_episode_without_a_seed_records_the_one_drawn_for_it_and_can_be_run_again(project):
    got = run(project, "clean", "r.jsonl")
    drawn = [got[f"test_unseeded[{n}]"] for n in range(2)]
    for record in drawn:
        assert record.outcome == "passed" and isinstance(record.seed, int)
        assert record.claim["seed"] == record.seed
        assert record.total_reward == pytest.approx(reference(record.seed))  # rebuilt from its record
    assert drawn[0].seed != drawn[1].seed
