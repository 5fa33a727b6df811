"""The gate through the plugin: exit status, JUnit gate cases, markdown, floors, sequential, resume."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest

from pytest_hud.core.results import load_results
from pluginkit import INI, SIMS

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


def test_gating_against_the_results_file_the_run_writes_never_loses_the_baseline(project):
    """The natural "gate against my last run": the ini's results file is also the baseline. A run
    that fails leaves the baseline as it was (its results beside it), so re-running the failed job
    fails again; a run that passes becomes the new baseline."""
    project.makeini(INI + "hud_results = hud-results.jsonl\n")
    project.makepyfile(test_suite=SUITE.format(n=30))
    first = run(project, "--hud-policy=policies:balance")
    assert first.ret == 0
    baseline = project.path / "hud-results.jsonl"
    good = baseline.read_bytes()
    for attempt in range(2):  # CI's "re-run failed jobs"
        result = run(project, "--hud-policy=policies:falls", "--hud-baseline=hud-results.jsonl")
        assert result.ret == 1, (attempt, result.stdout.str())
        result.stdout.fnmatch_lines(["*gate: REGRESSION test_suite.py::test_balance*paired-mcnemar*",
                                     "*FAILED (1 regression)*",
                                     "*baseline*hud-results.jsonl is unchanged*hud-results.candidate.jsonl*"])
        assert baseline.read_bytes() == good
        candidate = load_results(project.path / "hud-results.candidate.jsonl")
        assert candidate.summary["gate"][0]["verdict"] == "regression"
    passing = run(project, "--hud-policy=policies:balance", "--hud-baseline=hud-results.jsonl")
    assert passing.ret == 0
    passing.stdout.fnmatch_lines(["*results are the new baseline*hud-results.jsonl*"])
    assert baseline.read_bytes() != good
    assert load_results(baseline).summary["gate"][0]["verdict"] in ("pass", "inconclusive")
    assert not (project.path / "hud-results.candidate.jsonl").exists()


OPTIONAL = '''
import os
import pytest

@pytest.mark.parametrize("seed", range(10))
def test_balance(shared_sim, robot_agent, seed):
    assert robot_agent.run(shared_sim.episode(seed=seed)).success

@pytest.mark.skipif(not os.environ.get("HAVE_EXTRA"), reason="the extra is not installed")
@pytest.mark.parametrize("seed", range(10))
def test_optional(shared_sim, robot_agent, seed):
    assert robot_agent.run(shared_sim.episode(seed=seed)).success
'''


def run_env(pytester: pytest.Pytester, env: dict[str, str], *args: str) -> pytest.RunResult:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return run(pytester, *args)
    finally:
        for key, value in saved.items():
            os.environ.pop(key, None) if value is None else os.environ.__setitem__(key, value)


def test_a_task_skipped_on_both_sides_is_shown_skipped_and_does_not_fail(project):
    project.makepyfile(test_suite=OPTIONAL)
    run(project, "--hud-policy=policies:balance", "--hud-results=base.jsonl")
    result = run(project, "--hud-policy=policies:balance", "--hud-baseline=base.jsonl")
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines([
        "*gate: SKIPPED test_suite.py::test_optional: skipped (the extra is not installed) in both runs*",
        "*gate against base.jsonl: PASSED*skipped*"])


def test_a_task_graded_in_the_baseline_and_skipped_now_fails_and_says_skipped(project):
    project.makepyfile(test_suite=OPTIONAL)
    run_env(project, {"HAVE_EXTRA": "1"}, "--hud-policy=policies:balance", "--hud-results=base.jsonl")
    result = run_env(project, {"HAVE_EXTRA": ""}, "--hud-policy=policies:balance", "--hud-baseline=base.jsonl")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*gate: INSUFFICIENT COVERAGE test_suite.py::test_optional: skipped in this run"
                                 " (the extra is not installed) but graded in the baseline (10 episodes)*"])


def test_a_task_graded_in_the_baseline_and_deselected_now_fails_and_says_deselected(project):
    project.makepyfile(test_suite=OPTIONAL)
    run_env(project, {"HAVE_EXTRA": "1"}, "--hud-policy=policies:balance", "--hud-results=base.jsonl")
    result = run_env(project, {"HAVE_EXTRA": "1"}, "--hud-policy=policies:balance", "--hud-baseline=base.jsonl",
                     "-k", "not optional")
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*gate: INSUFFICIENT COVERAGE test_suite.py::test_optional: graded in the"
                                 " baseline (10 episodes) but not run now: deselected in this run (-k/-m)*"])


def test_a_baseline_with_nothing_to_compare_never_passes(project):
    """The baseline was recorded without the extra (skipped); now the task runs: nothing is compared."""
    project.makepyfile(test_suite=OPTIONAL)
    run_env(project, {"HAVE_EXTRA": ""}, "--hud-policy=policies:balance", "--hud-results=base.jsonl", "-k", "optional")
    result = run_env(project, {"HAVE_EXTRA": "1"}, "--hud-policy=policies:balance", "--hud-baseline=base.jsonl",
                     "-k", "optional")
    assert result.ret == 1
    result.stdout.fnmatch_lines([
        "*gate: NO BASELINE test_suite.py::test_optional: no baseline: skipped there (the extra is not installed)*",
        "*gate: nothing was compared*", "*FAILED (1 no baseline)*"])
