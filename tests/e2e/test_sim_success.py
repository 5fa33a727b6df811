"""Success as the sim saw it, through the real plugin: each episode's record keeps the sim's own
success beside the test's outcome, and the summary warns when tests passed although the sim
reported no success (a test that asserts nothing)."""

from __future__ import annotations

import json
import sys

import pytest

pytestmark = pytest.mark.timeout(240)

SIMS = '''
import gymnasium as gym


class GradedCartPole(gym.Wrapper):
    """CartPole that reports is_success when the pole stays up for the whole episode."""

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        info["is_success"] = bool(truncated and not terminated)
        return obs, reward, terminated, truncated, info


def cartpole(max_episode_steps=100):
    return GradedCartPole(gym.make("CartPole-v1", max_episode_steps=max_episode_steps))
'''

POLICIES = '''
def balance():
    return lambda obs: int(obs["state"][2] + 0.5 * obs["state"][3] > 0)


def push_left():
    return lambda obs: 0
'''

SUITE = '''
import pytest

pytestmark = pytest.mark.hud(sim="sims.py:cartpole")


@pytest.mark.hud(policy="policies:push_left")
@pytest.mark.parametrize("seed", range(4))
def test_runs_only(shared_sim, robot_agent, seed):
    robot_agent.run(shared_sim.episode(seed=seed))  # asserts nothing


@pytest.mark.hud(policy="policies:balance")
@pytest.mark.parametrize("seed", range(4))
def test_balances(shared_sim, robot_agent, seed):
    assert robot_agent.run(shared_sim.episode(seed=seed)).success
'''


def test_tests_that_pass_without_the_sims_success_are_flagged(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(sims=SIMS, policies=POLICIES, test_suite=SUITE)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(pytester.path / "summary.md"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--hud-width=2",
                                           "--hud-results=results.jsonl", timeout=200)
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["warning: test_suite.py::test_runs_only: 4 passed, the sim reported success in 0 of 4:"
                                 " does the test assert `result.success`?"])
    assert "warning: test_suite.py::test_balances" not in result.stdout.str()
    lines = [json.loads(line) for line in (pytester.path / "results.jsonl").read_text().splitlines()]
    episodes = {(e["task"], e["episode"]): e for e in lines if e["record"] == "episode"}
    runs_only = [e for (task, _), e in episodes.items() if task.endswith("test_runs_only")]
    assert [(e["success"], e["sim_success"], e["score"]) for e in runs_only] == [(True, False, 0.0)] * 4
    balances = [e for (task, _), e in episodes.items() if task.endswith("test_balances")]
    assert all(e["success"] and e["sim_success"] for e in balances) and len(balances) == 4
    assert lines[-1]["tasks"]["test_suite.py::test_runs_only"]["sim_successes"] == 0
    assert "⚠️ test\\_suite.py::test\\_runs\\_only: 4 passed, the sim reported success in 0 of 4" in (
        pytester.path / "summary.md").read_text()
    report = pytester.run(sys.executable, "-m", "pytest_hud", "report", "results.jsonl")
    assert "warning: test_suite.py::test_runs_only: 4 passed" in report.stdout.str()


SMOKE_SUITE = '''
import pytest

pytestmark = pytest.mark.hud(sim="sims.py:cartpole", policy="policies:push_left")


@pytest.mark.hud(graded=False)
@pytest.mark.parametrize("seed", range(3))
def test_smoke(shared_sim, robot_agent, seed):
    assert robot_agent.run(shared_sim.episode(seed=seed)).steps > 0  # the path works; no success asserted


@pytest.mark.parametrize("seed", range(3))
def test_runs_only(shared_sim, robot_agent, seed):
    robot_agent.run(shared_sim.episode(seed=seed))
'''


def test_a_suite_marked_graded_false_is_not_warned_about_and_says_so_in_its_records(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(sims=SIMS, policies=POLICIES, test_suite=SMOKE_SUITE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--hud-width=2",
                                           "--hud-results=results.jsonl", timeout=200)
    assert result.ret == 0, result.stdout.str()
    out = result.stdout.str()
    assert "warning: test_suite.py::test_runs_only: 3 passed, the sim reported success in 0 of 3" in out
    assert "warning: test_suite.py::test_smoke" not in out
    lines = [json.loads(line) for line in (pytester.path / "results.jsonl").read_text().splitlines()]
    smoke = [e for e in lines if e["record"] == "episode" and e["task"].endswith("test_smoke")]
    assert [(e["success"], e["sim_success"], e["identity"].get("graded")) for e in smoke] == [(True, False, False)] * 3
    assert lines[-1]["tasks"]["test_suite.py::test_smoke"]["sim_checked"] == 0
    report = pytester.run(sys.executable, "-m", "pytest_hud", "report", "results.jsonl")
    assert "test_smoke: 3 passed" not in report.stdout.str() and "test_runs_only: 3 passed" in report.stdout.str()


def test_a_graded_value_other_than_true_or_false_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(sims=SIMS, policies=POLICIES, test_suite=SMOKE_SUITE.replace("graded=False", 'graded="no"'))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--hud-results=results.jsonl", timeout=200)
    assert result.ret == 4, result.stdout.str()
    result.stderr.fnmatch_lines(["*hud(graded='no'): graded must be True*or False*"])
    assert not (pytester.path / "results.jsonl").exists()
