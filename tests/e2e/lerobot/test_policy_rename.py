"""A LeRobot checkpoint whose input features are named otherwise than the sim's keys runs from the
command line with ``--hud-policy-rename OBS=FEATURE`` or from the marker with
``@pytest.mark.hud(rename={OBS: FEATURE})`` (in the worker and through the policy server); without
it, the episode errs with the fix named."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("lerobot.policies")  # not "lerobot": tests/e2e/lerobot itself would satisfy that

from pytest_hud.core.results import load_results  # noqa: E402

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[3]
REACH = ROOT / "evals" / "sims" / "reach.py"
FINAL = ROOT / "evals" / "checkpoints" / "reach_act" / "final"

# the reach sim with its "state" observation named "joints": the checkpoint reads observation.state
SIM = f'''
import importlib.util
import gymnasium as gym
from gymnasium import spaces

spec = importlib.util.spec_from_file_location("hud_reach", {str(REACH)!r})
reach = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reach)


class Joints(gym.ObservationWrapper):
    def __init__(self, env):
        super().__init__(env)
        self.observation_space = spaces.Dict({{"joints": env.observation_space["state"]}})

    def observation(self, obs):
        return {{"joints": obs["state"]}}


def make():
    return Joints(reach.make_reach())
'''

SUITE = f'''
import pytest

pytestmark = pytest.mark.hud(sim="sim_joints.py:make", policy={str(FINAL)!r})

@pytest.mark.parametrize("seed", range(4))
def test_reach(shared_sim, robot_agent, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed, prompt="reach the green goal"))
    assert result.success
'''


MARKED = SUITE.replace(f"policy={str(FINAL)!r})", f"policy={str(FINAL)!r}, rename=RENAME)")


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_reach=SUITE, sim_joints=SIM)
    return pytester


@pytest.mark.parametrize("server", [False, True], ids=["in-worker", "policy-server"])
def test_a_checkpoint_reads_renamed_observation_keys_given_on_the_command_line(project, server):
    extra = ["--hud-policy-server"] if server else []
    result = project.runpytest_subprocess("-n", "2", "--hud-results=r.jsonl", *extra,
                                          "--hud-policy-rename", "joints=observation.state", timeout=240)
    result.assert_outcomes(passed=4)
    assert all(r.success for r in load_results(project.path / "r.jsonl").episodes)


def test_without_the_rename_the_episode_errs_naming_the_fix(project):
    result = project.runpytest_subprocess("-p", "no:xdist", "-k", "seed0 or 0]", timeout=240)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*joints*"])


def test_a_rename_without_an_equals_sign_is_a_usage_error(project):
    result = project.runpytest_subprocess("--hud-policy-rename", "joints", timeout=120)
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*--hud-policy-rename 'joints' is not OBS=FEATURE*"])


@pytest.mark.parametrize("server", [False, True], ids=["in-worker", "policy-server"])
def test_the_marker_rename_feeds_the_checkpoint_and_wins_over_the_option_for_its_key(pytester, server):
    # the option maps "joints" to a feature the checkpoint does not have; the module's marker fixes it
    pytester.makepyfile(test_reach=MARKED.replace("RENAME", "{'joints': 'observation.state'}"), sim_joints=SIM)
    extra = ["--hud-policy-server"] if server else []
    result = pytester.runpytest_subprocess("-n", "2", "--hud-results=r.jsonl", *extra,
                                           "--hud-policy-rename", "joints=observation.nothing", timeout=240)
    result.assert_outcomes(passed=4)
    assert all(r.success for r in load_results(pytester.path / "r.jsonl").episodes)


def test_a_marker_rename_that_is_not_a_dict_is_a_usage_error_naming_the_test(pytester):
    pytester.makepyfile(test_reach=MARKED.replace("RENAME", "'joints=observation.state'"), sim_joints=SIM)
    result = pytester.runpytest_subprocess("-p", "no:xdist", timeout=120)
    assert result.ret != 0
    output = result.stdout.str() + result.stderr.str()
    assert "test_reach.py::test_reach: hud(rename='joints=observation.state') must be a dict" in output
