"""The gate through the plugin: exit status, JUnit gate cases, markdown, floors, sequential, resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest

from pytest_hud.results import load_results
from test_plugin import INI, SIMS

pytestmark = pytest.mark.timeout(240)

POLICIES = '''
def balance():
    return lambda obs: int(obs["state"][2] + 0.5 * obs["state"][3] > 0)

def tilt():
    """About half of the 60-step episodes fail, depending on the seed."""
    return lambda obs: int(obs["state"][3] - 1.5 * obs["state"][1] > 0)

def falls():
    return lambda obs: 0
'''

SUITE = '''
import pytest

@pytest.mark.parametrize("seed", range({n}))
def test_balance(shared_sim, robot_agent, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed))
    assert result.success
'''


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(sims=SIMS, policies=POLICIES)
    pytester.makeini(INI)
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist", *args, timeout=180)


def baseline(project: pytest.Pytester, policy: str = "policies:balance", n: int = 30) -> str:
    project.makepyfile(test_suite=SUITE.format(n=n))
    run(project, f"--hud-policy={policy}", "--hud-results=baseline.jsonl")
    return str(project.path / "baseline.jsonl")


def test_a_worse_policy_is_a_regression_with_exit_status_1(project, monkeypatch):
    base = baseline(project)
    summary = project.path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    result = run(project, "--hud-policy=policies:falls", f"--hud-baseline={base}", "--junitxml=j.xml",
                 "--hud-results=new.jsonl")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*gate: REGRESSION test_suite.py::test_balance*paired-mcnemar*",
                                 "*gate against*FAILED (1 regression)*"])
    cases = {c.get("classname"): c for c in ET.parse(project.path / "j.xml").getroot().iter("testcase")}
    gate_case = cases["hud-gate.test_suite.py"]
    assert gate_case.find("failure") is not None
    props = {p.get("name"): p.get("value") for p in gate_case.iter("property")}
    assert props["verdict"] == "regression" and props["test"] == "paired-mcnemar"
    text = summary.read_text()
    assert text.startswith("### pytest-hud results") and "test_suite.py::test_balance" in text and "regression" in text
    gate = load_results(project.path / "new.jsonl").summary["gate"]
    assert gate[0]["verdict"] == "regression"


def test_failed_episodes_are_data_the_same_policy_passes_against_itself(project):
    base = baseline(project, policy="policies:tilt")
    result = run(project, "--hud-policy=policies:tilt", f"--hud-baseline={base}")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) > 0 and outcomes.get("passed", 0) > 0  # some episodes fail...
    assert result.ret == 0  # ...and the gate still passes: no drop
    result.stdout.fnmatch_lines(["*gate against*PASSED*"])


def test_a_floor_from_the_marker_fails_a_task_far_below_it(project):
    project.makepyfile(test_floor='''
import pytest

@pytest.mark.hud(policy="policies:falls", min_success=0.8)
@pytest.mark.parametrize("seed", range(10))
def test_floor(shared_sim, robot_agent, seed):
    assert robot_agent.run(shared_sim.episode(seed=seed)).success
''')
    result = run(project)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*gate: REGRESSION test_floor.py::test_floor*floor*"])


def test_a_gate_file_with_an_unknown_key_is_a_usage_error(project):
    project.makepyfile(test_suite=SUITE.format(n=2))
    (project.path / "gate.yaml").write_text("alpha: 0.05\nmax_dorp: 0.1\n")
    result = run(project, "--hud-gate=gate.yaml")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--hud-gate*max_dorp*"])


def test_a_missing_baseline_is_a_usage_error(project):
    project.makepyfile(test_suite=SUITE.format(n=2))
    result = run(project, "--hud-baseline=nope.jsonl")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--hud-baseline*does not exist*"])


def test_sequential_mode_skips_the_rest_of_a_decided_task(project):
    base = baseline(project, n=60)
    result = run(project, "--hud-policy=policies:falls", f"--hud-baseline={base}", "--hud-sequential",
                 "--hud-results=seq.jsonl")
    assert result.ret == 1
    outcomes = result.parseoutcomes()
    assert outcomes["skipped"] >= 30 and outcomes["failed"] < 30
    result.stdout.fnmatch_lines(["*gate: REGRESSION*sequential test decided after*"])
    records = load_results(project.path / "seq.jsonl").episodes
    assert sum(r.outcome == "skipped" for r in records) == outcomes["skipped"]


def _per_episode(path) -> dict:
    return {(r.task, r.episode): (r.outcome, r.steps, r.total_reward) for r in load_results(path).latest_episodes()}


def test_a_killed_run_resumed_ends_like_an_uninterrupted_one(project):
    project.makepyfile(test_suite=SUITE.format(n=30).replace(
        "    assert result.success", "    import time; time.sleep(0.1)\n    assert result.success"))
    run(project, "--hud-policy=policies:tilt", "--hud-results=full.jsonl")
    partial = project.path / "partial.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", "-v",
         "--hud-policy=policies:tilt", f"--hud-results={partial}"],
        cwd=project.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    done = 0
    deadline = time.monotonic() + 120
    while done < 10 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        done += (" PASSED" in line) or (" FAILED" in line)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    before = len(load_results(partial).episodes)
    assert 10 <= before < 30
    result = run(project, "--hud-policy=policies:tilt", f"--hud-resume={partial}", f"--hud-results={partial}")
    resumed = load_results(partial)
    assert resumed.complete
    assert sum(r.reused for r in resumed.latest_episodes()) == before
    assert _per_episode(partial) == _per_episode(project.path / "full.jsonl")
    assert result.parseoutcomes().get("passed", 0) + result.parseoutcomes().get("failed", 0) == 30


def test_resume_reruns_episodes_of_another_policy(project):
    base = baseline(project, n=4)
    result = run(project, "--hud-policy=policies:falls", f"--hud-resume={base}", "--hud-results=new.jsonl")
    assert not any(r.reused for r in load_results(project.path / "new.jsonl").episodes)
    result.assert_outcomes(failed=4)
