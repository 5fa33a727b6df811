"""The gate never passes what it did not fully compare, and a user's slip never costs the baseline.

Each test is a CI habit or a slip run end to end (real bridges, real pytest subprocesses): a typo,
``-k`` on the failing seeds, a killed run's file, a shard's file, a suite whose task changed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_hud.core.results import load_results
from test_gate_plugin import POLICIES, SUITE
from pluginkit import INI, SIMS

pytestmark = pytest.mark.timeout(300)

TASK = "test_suite.py::test_balance"


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(sims=SIMS, policies=POLICIES)
    pytester.makeini(INI)
    pytester.makepyfile(test_suite=SUITE.format(n=12))
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist", *args, timeout=180)


def run_xdist(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", *args, timeout=180)


def hud(project: pytest.Pytester, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest_hud", *args], cwd=project.path, capture_output=True,
                          text=True, timeout=120)


def files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.suffix == ".jsonl"}


def test_the_header_declares_every_episode_before_any_runs(project):
    result = run(project, "--hud-results=r.jsonl", "-k", "not test_balance[3] and not test_balance[4]")
    assert result.ret == 0
    run_record = load_results(project.path / "r.jsonl").run
    assert run_record["declared"] == {TASK: [str(i) for i in range(12) if i not in (3, 4)]}
    assert run_record["deselected"] == {TASK: ["3", "4"]}


def test_deselecting_failing_seeds_with_k_never_passes_the_gate(project):
    run(project, "--hud-policy=policies:balance", "--hud-results=base.jsonl")
    # Deselecting seeds the baseline graded (a candidate's failing ones, say) hides them from the gate.
    result = run(project, "--hud-policy=policies:balance", "--hud-baseline=base.jsonl",
                 "-k", "not test_balance[0] and not test_balance[1]")
    assert result.ret == 1
    result.stdout.fnmatch_lines([
        f"*gate: INSUFFICIENT COVERAGE {TASK}: 2 episodes graded in the baseline were left out of this run*"
        "deselected (-k/-m): episodes 0, 1*",
        "*gate against base.jsonl: FAILED*",
    ])
    # report --compare says the same from the files alone.
    run(project, "--hud-policy=policies:balance", "--hud-results=sub.jsonl",
        "-k", "not test_balance[0] and not test_balance[1]")
    proc = hud(project, "report", "sub.jsonl", "--compare", "base.jsonl")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "deselected (-k/-m): episodes 0, 1" in proc.stdout and "gate: FAIL" in proc.stdout


def test_a_typo_in_the_policy_is_a_usage_error_that_writes_nothing(project):
    project.makeini(INI + "hud_results = hud-results.jsonl\n")
    assert run(project).ret == 0
    before = files(project.path)
    for policy in ("polices.py:balance", "policies.py:balanse", "policiez:balance"):
        result = run(project, f"--hud-policy={policy}", "--hud-baseline=hud-results.jsonl")
        assert result.ret == pytest.ExitCode.USAGE_ERROR, (policy, result.stdout.str())
        result.stderr.fnmatch_lines(["*--hud-policy*"])
        assert files(project.path) == before, policy
    result = run(project, "--hud-policy=policies.py:balanse", "--hud-baseline=hud-results.jsonl")
    result.stderr.fnmatch_lines(["*defines no 'balanse' (did you mean 'balance'?)*"])


def test_a_marker_policy_that_cannot_load_is_a_usage_error_under_xdist_too(project):
    project.makeini(INI.replace("hud_policy = policies:balance\n", "") + "hud_results = r.jsonl\n")
    project.makepyfile(test_suite='''
import pytest

@pytest.mark.hud(policy="policies:no_such_policy")
@pytest.mark.parametrize("seed", range(4))
def test_balance(shared_sim, robot_agent, seed):
    assert robot_agent.run(shared_sim.episode(seed=seed)).success
''')
    for runner in (run, run_xdist):
        result = runner(project)
        assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
        result.stderr.fnmatch_lines(["*policies:no_such_policy*defines no 'no_such_policy'*"])
        assert not (project.path / "r.jsonl").exists()


def test_a_gate_file_floor_that_matches_no_task_is_a_usage_error(project):
    (project.path / "gate.yaml").write_text('tasks:\n  "test_suite.py::test_balanse": {min_success: 0.5}\n')
    for runner in (run, run_xdist):
        result = runner(project, "--hud-gate=gate.yaml", "--hud-results=r.jsonl")
        assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str()
        result.stderr.fnmatch_lines(["*--hud-gate*test_balanse*matches no task*test_suite.py::test_balance*"])
        assert not (project.path / "r.jsonl").exists()
        assert "passed" not in result.stdout.str()  # no episode ran
    (project.path / "gate.yaml").write_text('tasks:\n  "test_suite.py::*": {min_success: 0.5}\n')
    assert run(project, "--hud-gate=gate.yaml").ret == 0


def test_a_baseline_of_another_task_definition_is_incomparable(project):
    run(project, "--hud-results=base.jsonl")
    result = run(project, "--hud-baseline=base.jsonl", "--hud-max-steps=40")
    assert result.ret == 1
    result.stdout.fnmatch_lines([
        f"*gate: INCOMPARABLE {TASK}: not the same task on both sides*max_steps is null in the baseline and 40 now*"
        "--hud-accept-difference=max_steps*",
    ])
    accepted = run(project, "--hud-baseline=base.jsonl", "--hud-max-steps=40", "--hud-accept-difference=max_steps")
    assert "INCOMPARABLE" not in accepted.stdout.str()

    # Other build arguments of the sim: the marker's build changes the scene.
    project.makepyfile(test_suite=SUITE.format(n=12).replace(
        "def test_balance", '@pytest.mark.hud(build={"max_steps": 40})\ndef test_balance'))
    result = run(project, "--hud-baseline=base.jsonl")
    assert result.ret == 1
    result.stdout.fnmatch_lines(['*INCOMPARABLE*build is {} in the baseline and {"max_steps": 40} now*'])
    proc = hud(project, "report", *_rerun(project, "new.jsonl"), "--compare", "base.jsonl")
    assert proc.returncode == 1 and "incomparable" in proc.stdout
    proc = hud(project, "report", "new.jsonl", "--compare", "base.jsonl", "--accept-difference", "build")
    assert "incomparable" not in proc.stdout


def _rerun(project: pytest.Pytester, path: str) -> list[str]:
    run(project, f"--hud-results={path}")
    return [path]


def test_a_killed_runs_file_is_incomplete(project):
    run(project, "--hud-results=base.jsonl")
    project.makepyfile(test_suite=SUITE.format(n=12).replace(
        "    assert result.success",
        "    assert result.success\n    if seed == 6:\n        import time; time.sleep(60)"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(project.path)] + sys.path))
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist",
                             "--hud-results=killed.jsonl"], cwd=project.path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    killed = project.path / "killed.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if killed.exists() and killed.read_text().count('"record": "episode"') >= 6:
            break
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    partial = load_results(killed)
    assert not partial.complete and len(partial.declared_episodes()[TASK]) == 12

    # As results: coverage against its header, so the 6 it never finished count.
    out = hud(project, "report", "killed.jsonl", "--compare", "base.jsonl")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "declared but never reported" in out.stdout and "gate: PASS" not in out.stdout
    # As a baseline: refused unless asked for, by pytest and by report alike.
    result = run(project, "--hud-baseline=killed.jsonl")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--hud-baseline*killed.jsonl is incomplete*--hud-allow-incomplete-baseline*"])
    out = hud(project, "report", "base.jsonl", "--compare", "killed.jsonl")
    assert out.returncode == 4 and "--allow-incomplete-baseline" in out.stderr
    project.makepyfile(test_suite=SUITE.format(n=12))
    allowed = run(project, "--hud-baseline=killed.jsonl", "--hud-allow-incomplete-baseline", "--hud-results=a.jsonl")
    assert allowed.ret == 0, allowed.stdout.str()
    gate = load_results(project.path / "a.jsonl").summary["gate"][0]
    assert gate["n_baseline"] == len(partial.latest_episodes()) == 6
    assert gate["verdict"] != "insufficient coverage"


def test_one_shards_file_is_never_gated(project):
    run(project, "--hud-results=base.jsonl")
    run(project, "--hud-shard=1/2", "--hud-results=shard1.jsonl")
    for args in (("shard1.jsonl", "--compare", "base.jsonl"), ("base.jsonl", "--compare", "shard1.jsonl")):
        out = hud(project, "report", *args)
        assert out.returncode == 4, out.stdout + out.stderr
        assert "one shard (1/2)" in out.stderr and "python -m pytest_hud merge" in out.stderr
        assert "gate: PASS" not in out.stdout
    result = run(project, "--hud-baseline=shard1.jsonl")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--hud-baseline*one shard (1/2)*merge*"])


def test_strict_fails_an_inconclusive_gate_on_the_pytest_side_too(project):
    run(project, "--hud-results=base.jsonl")
    lenient = run(project, "--hud-baseline=base.jsonl")
    assert lenient.ret == 0
    lenient.stdout.fnmatch_lines([f"*gate: INCONCLUSIVE {TASK}*"])
    strict = run(project, "--hud-baseline=base.jsonl", "--hud-strict", "--junitxml=j.xml")
    assert strict.ret == 1
    strict.stdout.fnmatch_lines(["*gate against base.jsonl: FAILED (1 inconclusive)*"])
    cases = {c.get("classname"): c for c in ET.parse(project.path / "j.xml").getroot().iter("testcase")}
    assert cases["hud-gate.test_suite.py"].find("failure") is not None
    assert hud(project, "report", "base.jsonl", "--compare", "base.jsonl", "--strict").returncode == 1


def test_report_says_nothing_was_compared_and_tells_deselected_from_not_collected(project):
    run(project, "--hud-results=base.jsonl")
    project.makepyfile(test_other='''
import pytest

@pytest.mark.parametrize("seed", range(3))
def test_other(shared_sim, robot_agent, seed):
    assert robot_agent.run(shared_sim.episode(seed=seed)).success
''')
    run(project, "test_other.py", "--hud-results=other.jsonl")
    out = hud(project, "report", "other.jsonl", "--compare", "base.jsonl")
    assert out.returncode == 1
    assert "nothing was compared" in out.stdout and "gate: PASS" not in out.stdout
    assert "not collected in this run" in out.stdout
    run(project, "-k", "test_other", "--hud-results=both.jsonl")
    out = hud(project, "report", "both.jsonl", "--compare", "base.jsonl")
    assert out.returncode == 1 and "deselected in this run (-k/-m)" in out.stdout


def test_policies_are_shown_and_never_make_a_task_incomparable(project):
    run(project, "--hud-results=base.jsonl")
    result = run(project, "--hud-baseline=base.jsonl", "--hud-policy=policies:tilt")
    assert "INCOMPARABLE" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*gate: policy policies:tilt (hash *) against the baseline's policies:balance*"])
