"""The gate on a continuous score through the real plugin: ``hud(metric="score")`` makes the gate
compare each episode's graded score (here CartPole's fraction of the episode survived) with the
signed-rank test, and the results file keeps every episode's score."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.timeout(240)

SIMS = '''
import gymnasium as gym


class GradedCartPole(gym.Wrapper):
    """CartPole graded by the fraction of its steps the pole stayed up; a success when it lasts them all."""

    def __init__(self, max_episode_steps):
        super().__init__(gym.make("CartPole-v1", max_episode_steps=max_episode_steps))
        self.max_steps, self.t = max_episode_steps, 0

    def reset(self, **kwargs):
        self.t = 0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.t += 1
        info["is_success"] = bool(truncated and not terminated)
        info["score"] = self.t / self.max_steps
        return obs, reward, terminated, truncated, info


def cartpole(max_episode_steps=100):
    return GradedCartPole(max_episode_steps)
'''

POLICIES = '''
def balance():
    return lambda obs: int(obs["state"][2] + 0.5 * obs["state"][3] > 0)


def angle_only():
    """A regressed checkpoint: it ignores the pole's velocity and drops it within about 40 steps."""
    return lambda obs: int(obs["state"][2] > 0)
'''

SUITE = '''
import pytest


@pytest.mark.hud(sim="sims.py:cartpole", policy="policies:balance", metric="score")
@pytest.mark.parametrize("seed", range(8))
def test_balance(shared_sim, robot_agent, seed):
    assert robot_agent.run(shared_sim.episode(seed=seed)).success
'''


def test_a_task_gated_on_its_score_is_compared_with_the_signed_rank_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(sims=SIMS, policies=POLICIES, test_suite=SUITE)
    run = ("-p", "no:cacheprovider", "-n", "2", "--hud-width=2")
    base = pytester.runpytest_subprocess(*run, "--hud-results=base.jsonl", timeout=200)
    assert base.ret == 0, base.stdout.str()
    result = pytester.runpytest_subprocess(*run, "--hud-policy=policies:angle_only", "--hud-baseline=base.jsonl",
                                           "--hud-results=candidate.jsonl", timeout=200)
    out = result.stdout.str()
    assert result.ret == 1, out
    result.stdout.fnmatch_lines(["gate: REGRESSION test_suite.py::test_balance: dropped: mean score 0.* vs baseline"
                                 " 1.000 (paired-signed-rank, drop 0.*, p=0.00391, Holm-adjusted 0.00391)"])
    lines = [json.loads(line) for line in (pytester.path / "candidate.jsonl").read_text().splitlines()]
    (verdict,) = lines[-1]["gate"]
    assert verdict["metric"] == "score" and verdict["test"] == "paired-signed-rank" and verdict["baseline_score"] == 1.0
    scores = [e["score"] for e in lines if e["record"] == "episode"]
    assert len(scores) == 8 and all(0.0 < s < 1.0 for s in scores)
    assert verdict["current_score"] == pytest.approx(sum(scores) / 8)


def test_a_metric_that_is_none_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(sims=SIMS, policies=POLICIES, test_suite=SUITE.replace('metric="score"', 'metric="coverage"'))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*test_suite.py::test_balance: hud(metric='coverage'): the metric must be 'success'"
                                 " (the test's outcome) or 'score'*"])
