"""The plugin when things break: a worker killed, a service that dies or never starts, a policy that
errs or hangs, a run killed midway; real bridges, xdist workers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest

from pluginkit import BALANCE, project, run  # noqa: F401 - project is a fixture
from pytest_hud.core.results import load_results

pytestmark = pytest.mark.timeout(240)


def test_a_killed_worker_is_an_error_its_slot_is_freed_and_the_rest_pass(project):
    # One worker on one bridge of one slot: the replacement worker shares the bridge (one worker per
    # bridge group) and every episode after the crash claims the very slot the dead worker held.
    # Freed when the dead worker's control connection closed, it is claimed again at once; left held,
    # those claims would wait for the bridge's 600 s slot wait, and --timeout fails them instead.
    project.makepyfile(test_crash='''
import os, time, pytest

@pytest.mark.parametrize("seed", range(6))
def test_episode(shared_sim, robot_agent, seed):
    if seed == 2:
        with shared_sim.episode(seed=seed) as ep:
            with open("crash.txt", "w") as fh:
                fh.write(f"{time.time()}\\n")
            os._exit(1)   # the worker dies holding a claimed slot
    with shared_sim.episode(seed=seed) as ep:
        with open("claims.txt", "a") as fh:
            fh.write(f"{time.time()}\\n")
        result = robot_agent.run(ep)
    assert result.success
''')
    result = run(project, "-n", "1", "--hud-width=1", "--hud-results=r.jsonl", "--timeout=30")
    result.assert_outcomes(passed=5, errors=1)
    crashed = float((project.path / "crash.txt").read_text())
    claims = [float(t) for t in (project.path / "claims.txt").read_text().split()]
    after = sorted(t for t in claims if t > crashed)
    assert len(after) == 3, (crashed, claims)  # one worker runs the seeds in order: 3, 4 and 5 came after
    result.stdout.fnmatch_lines(["*coverage: 6/6 declared episodes reported, 5 graded, 1 errors*"])
    records = {r.episode: r for r in load_results(project.path / "r.jsonl").episodes}
    assert records["2"].outcome == "error" and "crashed" in records["2"].error
    assert all(records[s].outcome == "passed" for s in "01345")


def test_a_sim_or_policy_server_that_exits_while_starting_is_started_once_and_every_episode_gets_its_error(project):
    project.makepyfile(test_cartpole=BALANCE, broken="""
import os

def sim():
    with open(os.path.join(os.path.dirname(__file__), "starts.txt"), "a") as fh:
        fh.write("start\\n")
    raise RuntimeError("this env cannot be built")
""", test_broken="""
import pytest

@pytest.mark.parametrize("seed", range(4))
def test_broken(shared_sim, robot_agent, seed):
    robot_agent.run(shared_sim.episode(seed=seed))
""")
    result = run(project, "test_broken.py", "-n", "2", "--hud-sim=broken:sim")
    result.assert_outcomes(errors=4)
    result.stdout.fnmatch_lines(["*RuntimeError: this env cannot be built*"])
    assert "not again: it exited while starting" in result.stdout.str()
    assert (project.path / "starts.txt").read_text().count("start") == 1
    # a policy server that cannot load its policy: the same, once per run
    project.makepyfile(bad_policy="""
import os

def policy():
    with open(os.path.join(os.path.dirname(__file__), "loads.txt"), "a") as fh:
        fh.write("load\\n")
    raise RuntimeError("these weights are corrupt")
""")
    served = run(project, "test_cartpole.py", "-n", "2", "--hud-policy-server", "--hud-policy=bad_policy:policy")
    served.assert_outcomes(errors=6)
    served.stdout.fnmatch_lines(["*no policy server for 'bad_policy:policy'*"])
    assert (project.path / "loads.txt").read_text().count("load") == 1
    # in the workers: loaded once per worker, every episode names the policy
    (project.path / "loads.txt").unlink()
    local = run(project, "test_cartpole.py", "-n", "2", "--hud-policy=bad_policy:policy")
    local.assert_outcomes(errors=6)
    local.stdout.fnmatch_lines(["*cannot load policy 'bad_policy:policy': RuntimeError: these weights are corrupt*"])
    assert "not loaded again" in local.stdout.str()
    assert (project.path / "loads.txt").read_text().count("load") <= 2  # one per worker


def test_results_file_keeps_every_finished_episode_when_the_run_is_killed(project):
    project.makepyfile(test_slow='''
import time, pytest

@pytest.mark.parametrize("seed", range(40))
def test_slow(shared_sim, robot_agent, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed))
    time.sleep(0.15)
    assert result.success
''')
    results = project.path / "r.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", f"--hud-results={results}", "-v"],
        cwd=project.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    passed = 0
    deadline = time.monotonic() + 120
    while passed < 5 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        passed += " PASSED" in line
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    loaded = load_results(results)
    assert not loaded.complete
    assert len(loaded.episodes) >= passed >= 5
    assert all(r.outcome == "passed" for r in loaded.episodes)


def test_a_policy_error_is_an_error_not_a_failure(project):
    # (A policy that names nothing is a usage error before anything runs; this one fails to load.)
    project.makepyfile(broken_policies='def broken():\n    raise RuntimeError("no checkpoint here")\n')
    project.makepyfile(test_bad='''
import pytest

@pytest.mark.hud(policy="broken_policies:broken")
def test_bad(shared_sim, robot_agent):
    robot_agent.run(shared_sim.episode(seed=0))

def test_failed_assertion_is_a_failure(shared_sim, robot_agent):
    result = robot_agent.run(shared_sim.episode(seed=0))
    assert result.steps > 1000
''')
    result = run(project, "-p", "no:xdist", "--junitxml=j.xml")
    result.assert_outcomes(failed=1, errors=1)
    root = ET.parse(project.path / "j.xml").getroot()
    assert len(root.findall(".//error")) == 1 and len(root.findall(".//failure")) == 1


def test_a_dead_bridge_is_replaced_and_later_episodes_run(project):
    project.makepyfile(test_replace='''
import os, signal, pytest

@pytest.mark.parametrize("seed", range(4))
def test_episode(shared_sim, robot_agent, seed):
    if seed == 1:
        with shared_sim.episode(seed=seed) as ep:
            os.kill(shared_sim.stats()["pid"], signal.SIGKILL)
            robot_agent.run(ep)
    assert robot_agent.run(shared_sim.episode(seed=seed)).success
''')
    result = run(project, "-p", "no:xdist", "--hud-results=r.jsonl")
    result.assert_outcomes(passed=3, errors=1)
    records = {r.episode: r for r in load_results(project.path / "r.jsonl").episodes}
    assert records["1"].outcome == "error" and "slot" in records["1"].error


def test_a_policy_that_never_returns_does_not_hang_the_worker(project):
    project.makepyfile(test_hang='''
import time

def test_hang(shared_sim, robot_agent):
    robot_agent.policy = "test_hang:forever"
    robot_agent.run(shared_sim.episode(seed=0))

def forever():
    def act(obs):
        time.sleep(3600)
    return act

def test_after(shared_sim, robot_agent):
    assert robot_agent.run(shared_sim.episode(seed=1)).success
''')
    t0 = time.monotonic()
    result = run(project, "-p", "no:xdist", "-p", "no:timeout", "--hud-first-action-timeout=1",
                 "--hud-results=r.jsonl")
    assert time.monotonic() - t0 < 60
    result.assert_outcomes(passed=1, errors=1)
    hung = {r.task: r for r in load_results(project.path / "r.jsonl").episodes}["test_hang.py::test_hang"]
    assert hung.outcome == "error" and "--hud-first-action-timeout" in hung.error
