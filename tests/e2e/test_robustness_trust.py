"""Sensitivity tables a reader can trust, through the real plugin: the errors column and the coverage
rule per level, the pooled row stratified by task, and per-task tables labelled exploratory."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.timeout(240)

SIMS = '''
import gymnasium as gym
import numpy as np


class NoisyCartPole(gym.Wrapper):
    """CartPole with Gaussian noise on its observations, drawn from the episode's seed."""

    def __init__(self, sigma, max_episode_steps):
        super().__init__(gym.make("CartPole-v1", max_episode_steps=max_episode_steps))
        self.sigma = float(sigma)
        self.rng = np.random.default_rng(0)

    def reset(self, *, seed=None, options=None):
        self.rng = np.random.default_rng([0 if seed is None else seed, 7])
        obs, info = self.env.reset(seed=seed, options=options)
        return (obs + self.rng.normal(0.0, self.sigma, obs.shape)).astype(np.float32), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        info["is_success"] = bool(truncated and not terminated)
        return (obs + self.rng.normal(0.0, self.sigma, obs.shape)).astype(np.float32), reward, terminated, truncated, info


def cartpole(sigma=0.0, max_episode_steps=200):
    return NoisyCartPole(sigma, max_episode_steps)
'''

POLICIES = '''
def balance():
    return lambda obs: int(obs["state"][2] + 0.5 * obs["state"][3] > 0)
'''

# The "high" level's harness falls over exactly where the policy failed: every failure there is an error.
SUITE = '''
import pytest

pytestmark = [pytest.mark.hud(sim="sims.py:cartpole", policy="policies:balance"),
              pytest.mark.hud_axis("noise", reference="none")]

LEVELS = {"none": 0.0, "high": 0.5}


@pytest.fixture(params=[pytest.param(name, marks=pytest.mark.hud(build={"sigma": sigma}))
                        for name, sigma in LEVELS.items()])
def noise(request):
    return request.param


@pytest.mark.parametrize("seed", range(10))
def test_balance(shared_sim, robot_agent, noise, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed))
    if noise == "high" and not result.success:
        raise RuntimeError("the harness fell over")
    assert result.success
'''


def table_rows(lines: list[str], axis: str) -> dict[str, list[str]]:
    head = next(i for i, line in enumerate(lines) if line.startswith(f"robustness: {axis} (reference"))
    rows = {}
    for line in lines[head + 3:]:
        if line.startswith("robustness:"):
            break
        rows[line.split()[0]] = line.split()
    return rows


def test_a_level_that_errs_where_it_would_fail_shows_its_errors_and_is_not_judged(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(sims=SIMS, policies=POLICIES, test_suite=SUITE)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(pytester.path / "summary.md"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--hud-width=2",
                                           "--hud-results=results.jsonl", timeout=200)
    out = result.stdout.str()
    rows = table_rows(result.stdout.lines, "noise")
    assert rows["none"][1:5] == ["10", "0", "10", "100.0%"], out
    n, errors, successes = map(int, rows["high"][1:4])
    assert errors >= 2 and n + errors == 10 and successes == n, out  # only its successes were graded
    assert rows["high"][-2:] == ["LOW", "COVERAGE"], out
    assert f"high ({n}/10 graded)" in out and "no level significantly worse" not in out
    summary = json.loads((pytester.path / "results.jsonl").read_text().splitlines()[-1])
    (pooled,) = [t for t in summary["sensitivity"] if t["scope"] == "pooled"]
    high = pooled["rows"][1]
    assert (high["errors"], high["status"]) == (errors, "low coverage") and pooled["low_coverage"] == ["high"]
    md = (pytester.path / "summary.md").read_text()
    assert f"| `high` | {n} | {errors} | {successes} |" in md and "⚠️ low coverage" in md


# The perturbed level drops the pole at once from seed FAIL_FROM on (the environment variable
# stands in for a perturbation whose strength a baseline and a candidate may disagree on).
GATE_SUITE = '''
import os

import pytest

pytestmark = [pytest.mark.hud(sim="sims.py:cartpole", policy="policies:balance"),
              pytest.mark.hud_axis("p", reference="none")]


@pytest.fixture(params=["none", "perturbed"])
def p(request):
    return request.param


@pytest.mark.parametrize("seed", range(30))
def test_balance(shared_sim, robot_agent, p, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed))
    fails_from = int(os.environ.get("FAIL_FROM", "30")) if p == "perturbed" else 30
    assert result.success and seed < fails_from
'''


def test_the_gate_tells_a_levels_own_baseline_from_the_reference(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """Baseline: reference 30/30, perturbed 5/30; now the same: it passes against its own level, and the
    same run fails against a baseline whose perturbed level did as well as the reference."""
    pytester.makepyfile(sims=SIMS, policies=POLICIES, test_suite=GATE_SUITE)
    run = ("-p", "no:cacheprovider", "-n", "2", "--hud-width=2")
    monkeypatch.setenv("FAIL_FROM", "5")
    assert pytester.runpytest_subprocess(*run, "--hud-results=own.jsonl", timeout=200).ret == 1
    monkeypatch.setenv("FAIL_FROM", "30")
    assert pytester.runpytest_subprocess(*run, "--hud-results=reference.jsonl", timeout=200).ret == 0
    monkeypatch.setenv("FAIL_FROM", "5")
    task = "test_suite.py::test_balance[p=perturbed]"
    passed = pytester.runpytest_subprocess(*run, "--hud-baseline=own.jsonl", "--hud-results=a.jsonl", timeout=200)
    assert passed.ret == 0, passed.stdout.str()
    gate = {g["task"]: g for g in json.loads((pytester.path / "a.jsonl").read_text().splitlines()[-1])["gate"]}
    assert gate[task]["baseline_rate"] == gate[task]["current_rate"] == 5 / 30
    failed = pytester.runpytest_subprocess(*run, "--hud-baseline=reference.jsonl", "--hud-results=b.jsonl",
                                           timeout=200)
    assert failed.ret == 1
    gate = {g["task"]: g for g in json.loads((pytester.path / "b.jsonl").read_text().splitlines()[-1])["gate"]}
    assert gate[task]["verdict"] == "regression" and gate[task]["baseline_rate"] == 1.0, gate[task]
    assert gate["test_suite.py::test_balance[p=none]"]["verdict"] != "regression"


# Two tasks, the hard one failing two seeds in three at every level; the "errs" level's harness falls
# over on the easy task's odd seeds: no task's rate changes, only the mix of graded episodes.
MIX_SUITE = '''
import pytest

pytestmark = [pytest.mark.hud(sim="sims.py:cartpole", policy="policies:balance"),
              pytest.mark.hud_axis("level", reference="none")]


@pytest.mark.parametrize("level", ["none", "errs"])
@pytest.mark.parametrize("task", ["easy", "hard"])
@pytest.mark.parametrize("seed", range(10))
def test_balance(shared_sim, robot_agent, task, level, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed))
    if level == "errs" and task == "easy" and seed % 2:
        raise RuntimeError("the harness fell over")
    assert result.success and (task == "easy" or seed % 3 == 0)
'''


def test_the_pooled_row_of_an_error_shifted_mix_is_stratified_by_task(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(sims=SIMS, policies=POLICIES, test_suite=MIX_SUITE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--hud-width=2",
                                           "--hud-results=results.jsonl", timeout=200)
    out = result.stdout.str()
    rows = table_rows(result.stdout.lines, "level")
    assert rows["none"][1:4] == ["20", "0", "14"], out  # easy 10/10, hard 4/10
    assert rows["errs"][1:4] == ["15", "5", "9"] and rows["errs"][8] == "stratified", out  # easy 5/5, hard 4/10
    assert rows["errs"][7] == "+0.0", out  # the same rate in each task: no difference once stratified
    summary = json.loads((pytester.path / "results.jsonl").read_text().splitlines()[-1])
    pooled, *per_task = summary["sensitivity"]
    assert pooled["family"] == "axis" and pooled["rows"][1]["test"] == "unpaired-stratified"
    assert pooled["worse"] == [] and pooled["rows"][1]["p_value"] > 0.5 and pooled["rows"][1]["difference"] == 0
    assert [t["family"] for t in per_task] == ["exploratory", "exploratory"]
