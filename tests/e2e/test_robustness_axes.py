"""Robustness axes through the real plugin: each level of a perturbation parameter on its own bridge,
the sensitivity table in the terminal, the results file's summary, and ``python -m pytest_hud report``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pytest_hud.core.results import load_results

pytestmark = pytest.mark.timeout(240)

SIMS = '''
import gymnasium as gym
import numpy as np


class NoisyCartPole(gym.Wrapper):
    """CartPole whose observations carry Gaussian noise, drawn from the episode's seed."""

    def __init__(self, sigma, max_episode_steps):
        super().__init__(gym.make("CartPole-v1", max_episode_steps=max_episode_steps))
        self.sigma = float(sigma)
        self.hud_instruction = f"balance with noise {self.sigma:g}"  # each level's prompt says its noise
        self.rng = np.random.default_rng(0)

    def _noisy(self, obs):
        return (obs + self.rng.normal(0.0, self.sigma, obs.shape)).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        self.rng = np.random.default_rng([0 if seed is None else seed, 7])
        obs, info = self.env.reset(seed=seed, options=options)
        return self._noisy(obs), info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        info["is_success"] = bool(truncated and not terminated)
        return self._noisy(obs), reward, terminated, truncated, info


def cartpole(sigma=0.0, max_episode_steps=200):
    return NoisyCartPole(sigma, max_episode_steps)
'''

POLICIES = '''
def balance():
    """Pushes the cart under the pole: balances 200 steps from every seed without noise."""
    return lambda obs: int(obs["state"][2] + 0.5 * obs["state"][3] > 0)


class BrittleAtLow:
    """A checkpoint that regressed at one level only: the same as balance, except that under the
    instruction of the 0.05 noise level it pushes left at every step (and drops the pole)."""

    def predict(self, observation, prompt=None):
        if prompt == "balance with noise 0.05":
            return 0
        return int(observation["state"][2] + 0.5 * observation["state"][3] > 0)


def brittle_at_low():
    return BrittleAtLow()
'''

# The level is a parametrized fixture whose params carry the hud marker that picks the sim's build:
# each level runs on a bridge of its own (as a suite per level would).
SUITE = '''
import pytest

pytestmark = [pytest.mark.hud(sim="sims.py:cartpole", policy="policies:balance"),
              pytest.mark.hud_axis("noise", reference="none")]

LEVELS = {"none": 0.0, "low": 0.05, "high": 0.5}


@pytest.fixture(params=[pytest.param(name, marks=pytest.mark.hud(build={"sigma": sigma}))
                        for name, sigma in LEVELS.items()])
def noise(request):
    return request.param


@pytest.mark.parametrize("seed", range(10))
def test_balance(shared_sim, robot_agent, noise, seed):
    assert robot_agent.run(shared_sim.episode(seed=seed)).success
'''


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(sims=SIMS, policies=POLICIES, test_suite=SUITE)
    return pytester


def test_the_summary_has_a_sensitivity_table_that_flags_the_large_noise(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--hud-width=2",
                                          "--hud-results=results.jsonl", timeout=200)
    out = result.stdout.str()
    assert result.ret == 1, out  # the failed episodes fail their tests; no gate here
    lines = result.stdout.lines
    head = next(i for i, line in enumerate(lines) if line.startswith("robustness: noise (reference none"))
    assert "pooled over 1 task;" in lines[head]
    assert "Holm over 2 levels" in lines[head]
    rows = {line.split()[0]: line.split() for line in lines[head + 3:head + 6]}
    assert list(rows) == ["none", "low", "high"]  # reference first, then the parameter's order
    assert rows["none"][1:5] == ["10", "0", "10", "100.0%"] and rows["none"][8] == "ref"
    assert rows["low"][1:4] == ["10", "0", "10"] and rows["low"][-1] != "WORSE"
    assert rows["high"][-1] == "WORSE" and int(rows["high"][3]) <= 4
    assert rows["high"][8] == "paired"  # the same seeds at every level
    assert "robustness: noise: significantly worse than none: high" in out
    # the summary table comes first, then the sensitivity table
    assert out.index("pytest-hud summary") < out.index("robustness: noise")

    records = [json.loads(line) for line in (project.path / "results.jsonl").read_text().splitlines()]
    summary = records[-1]
    assert summary["record"] == "summary"
    (pooled,) = [t for t in summary["sensitivity"] if t["scope"] == "pooled"]
    assert pooled["axis"] == "noise" and pooled["reference"] == "none" and pooled["worse"] == ["high"]
    by_level = {row["level"]: row for row in pooled["rows"]}
    high = by_level["high"]
    assert high["test"] == "paired-mcnemar" and high["n_pairs"] == 10
    assert high["adjusted_p"] <= 0.05 and high["significantly_worse"]
    assert high["difference"] == pytest.approx(high["successes"] / 10 - 1.0)
    episodes = [r for r in records if r["record"] == "episode"]
    assert {e["axes"]["noise"]["level"] for e in episodes} == {"none", "low", "high"}
    assert {e["axes"]["noise"]["task"] for e in episodes} == {"test_suite.py::test_balance"}
    # the level is part of the task id, so the gate holds each level to its own baseline
    assert {e["task"] for e in episodes} == {f"test_suite.py::test_balance[noise={lv}]" for lv in ("none", "low", "high")}

    report = subprocess.run([sys.executable, "-m", "pytest_hud", "report", "results.jsonl", "--markdown"],
                            cwd=project.path, capture_output=True, text=True, timeout=60)
    assert report.returncode == 0, report.stderr
    assert "#### Robustness: noise (reference none" in report.stdout
    assert "| `high` |" in report.stdout and "❌ worse" in report.stdout


def test_a_marker_on_a_parameter_the_test_lacks_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(sims=SIMS, policies=POLICIES, test_typo='''
import pytest

@pytest.mark.hud(sim="sims.py:cartpole", policy="policies:balance")
@pytest.mark.hud_axis("nosie", reference="none")
@pytest.mark.parametrize("noise", ["none", "high"])
def test_balance(shared_sim, robot_agent, noise):
    assert robot_agent.run(shared_sim.episode(seed=0)).success
''')
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*hud_axis('nosie') names no parameter of this test (its parameters: noise)*"])


def test_the_gate_holds_each_level_to_its_own_baseline(project: pytest.Pytester) -> None:
    base = project.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--hud-width=2",
                                        "--hud-results=base.jsonl", timeout=200)
    assert base.ret == 1, base.stdout.str()  # the high level's failed episodes (no gate yet)
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--hud-width=2",
                                          "--hud-policy=policies:brittle_at_low", "--hud-baseline=base.jsonl",
                                          "--hud-results=candidate.jsonl", timeout=200)
    out = result.stdout.str()
    assert result.ret == 1, out
    verdicts = {g["task"]: g for g in load_results(project.path / "candidate.jsonl").summary["gate"]}
    task = "test_suite.py::test_balance[noise={}]".format
    assert verdicts[task("low")]["verdict"] == "regression", verdicts[task("low")]
    assert verdicts[task("low")]["current_rate"] == 0 and verdicts[task("low")]["n_current"] == 10
    assert verdicts[task("low")]["test"] == "paired-mcnemar"
    # the other levels are the same episodes as in their baselines: not regressions
    for level in ("none", "high"):
        assert verdicts[task(level)]["verdict"] in ("pass", "inconclusive"), verdicts[task(level)]
    # and the sensitivity table of this run sees the collapse at its level
    assert "robustness: noise: significantly worse than none: low" in out


def test_a_hud_axis_typo_or_an_unknown_reference_is_a_usage_error(project: pytest.Pytester) -> None:
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "--hud-axis=nosie", timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--hud-axis 'nosie' names no parameter of the collected tests"
                                 " (their parameters: noise, seed)*"])
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "--hud-axis=noise=nnone", timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*robustness axis 'noise': the reference level 'nnone' is none of its "
                                 "values (high, low, none)*"])
    # a marker's reference as well; deselected levels still count as values (-k)
    project.makepyfile(test_suite=SUITE.replace('reference="none"', 'reference="zero"'))
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-k", "high", timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*the reference level 'zero' is none of its values (high, low, none)*"])
    assert not (project.path / "hud-results.jsonl").exists()


def test_an_axis_whose_seeds_are_not_the_same_scene_is_compared_unpaired(project: pytest.Pytester) -> None:
    # e.g. benchmark variants that ship initial states of their own: seed s differs between levels
    project.makepyfile(test_suite=SUITE.replace('reference="none"', 'reference="none", paired=False'))
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--hud-width=2",
                                          "--hud-results=results.jsonl", timeout=200)
    lines = result.stdout.lines
    head = next(i for i, line in enumerate(lines) if line.startswith("robustness: noise (reference none"))
    rows = {line.split()[0]: line.split() for line in lines[head + 3:head + 6]}
    assert rows["low"][8] == rows["high"][8] == "unpaired", result.stdout.str()
    summary = load_results(project.path / "results.jsonl").summary
    (pooled,) = [t for t in summary["sensitivity"] if t["scope"] == "pooled"]
    assert {row["level"]: row["test"] for row in pooled["rows"]}["high"] == "unpaired-boschloo"
    project.makepyfile(test_suite=SUITE.replace('reference="none"', 'reference="none", paired="no"'))
    result = project.runpytest_subprocess("-p", "no:cacheprovider", timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*paired=True|False*"])
