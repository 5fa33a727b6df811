"""Drills: a worker, a bridge or a policy fails mid-run (DESIGN §6, §9).

Each drill is a real ``pytest -n 2 --hud-width=2`` run of a small project in a subprocess, on a
CounterSim (episodes of a known length, observations that carry the seed and step) so that every
episode's result is known in advance. What the user must see: the failed episode reported as an
*error* naming the cause, every other episode completed, a freed slot or a replaced bridge, the
results file complete, and no wait longer than the configured timeouts.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import SIMKIT
from pytest_hud.client.bridge import BridgeAddress, BridgeError, ControlClient
from pytest_hud.core.results import load_results

LENGTH = 40  # steps per CounterSim episode

SIMS = f'''
from pathlib import Path
from simkit import CounterSim

def counter(num_envs):
    return CounterSim(num_envs, length={LENGTH})

def exploding(num_envs):
    """The first bridge of the run raises in step() at tick 60; its replacement does not."""
    flag = Path("exploded.flag")
    first = not flag.exists()
    flag.touch()
    return CounterSim(num_envs, length={LENGTH}, explode_at=60 if first else -1)
'''

POLICIES = '''
import threading
import time

import numpy as np

def zero():
    return lambda obs: np.zeros(1, np.float32)

def hang():
    """Never answers."""
    def act(obs):
        threading.Event().wait()
    return act

def slow():
    """A 3 s first forward (model warm-up), then 2 s per forward: slower than a 1 s step timeout."""
    calls = []
    def act(obs):
        time.sleep(3.0 if not calls else 2.0)
        calls.append(1)
        return np.zeros(1, np.float32)
    return act
'''

INI = """
[pytest]
hud_sim = sims:counter
hud_policy = policies:zero
hud_progress_interval = 0
asyncio_default_fixture_loop_scope = function
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(simkit=SIMKIT.read_text(), sims=SIMS, policies=POLICIES)
    pytester.makeini(INI)
    return pytester


def run(pytester: pytest.Pytester, *args: str, timeout: float = 120) -> tuple[pytest.RunResult, float]:
    started = time.monotonic()
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--hud-width=2",
                                           "--hud-results=r.jsonl", "-v", *args, timeout=timeout)
    return result, time.monotonic() - started


def records(pytester: pytest.Pytester) -> dict[str, object]:
    return {r.nodeid.split("::", 1)[1]: r for r in load_results(pytester.path / "r.jsonl").latest_episodes()}


# =========================================================================== 1. worker killed
KILLED = f'''
import json, os, signal, time
from pathlib import Path

import numpy as np
import pytest

from pytest_hud.client.bridge import SlotClient

KILL_AT = {{100: 0, 101: 3, 102: 20}}  # seed -> the step at which the worker kills itself

@pytest.mark.parametrize("seed", sorted(KILL_AT))
def test_killed(shared_sim, seed):
    with shared_sim.episode(seed=seed) as ep:
        with SlotClient(ep.address, ep.token, recv_timeout=60) as slot:
            for _ in range(KILL_AT[seed]):
                frame = slot.step(np.zeros(1, np.float32))
            # Let xdist finish handing this worker its next items: a worker that dies while the
            # controller writes to it can turn into an INTERNALERROR of the whole run (a known
            # xdist race, pytest-dev/pytest-xdist#204), which is not what this drill is about.
            time.sleep(0.5)
            Path(f"kill-{{seed}}.tmp").write_text(json.dumps({{
                "slot": ep.slot, "steps": KILL_AT[seed], "t": time.time(), "address": ep.address.to_dict(),
            }}))
            os.replace(f"kill-{{seed}}.tmp", f"kill-{{seed}}.json")  # the watcher never reads half a file
            os.kill(os.getpid(), signal.SIGKILL)  # mid-episode: a claimed, live slot

@pytest.mark.parametrize("seed", range(12))
def test_episode(shared_sim, robot_agent, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed))
    assert result.steps == {LENGTH} and result.total_reward == pytest.approx(seed)
'''


def watch_kills(path: Path, seen: dict[int, float | str], stop: threading.Event) -> None:
    """For each kill file: how long until the bridge shows the killed worker's slot as let go.

    The slot was live with ``steps`` steps when its worker died; it cannot change until the bridge
    frees it (after that, a new claim may take it, but that needs the free first). A watch that
    could not see the slot change (the bridge unreachable, the slot still held after 10 s) records
    why, as a string, never a time: the test fails on it.
    """
    while not stop.is_set():
        for kill in path.glob("kill-*.json"):
            seed = int(kill.stem.split("-")[1])
            if seed in seen:
                continue
            info = json.loads(kill.read_text())
            before = {"slot": info["slot"], "state": "live", "steps": info["steps"], "connected": True}
            try:
                with ControlClient(BridgeAddress.from_dict(info["address"]), timeout=5) as control:
                    while control.stats()["slots"][info["slot"]] == before:
                        if time.time() - info["t"] >= 10:
                            raise TimeoutError("the slot was still held 10 s after its worker died")
                        time.sleep(0.005)
                seen[seed] = time.time() - info["t"]
            except Exception as exc:  # noqa: BLE001 - reported by the test, never counted as a time
                seen[seed] = f"{type(exc).__name__}: {exc}"
        time.sleep(0.01)


@pytest.mark.timeout(150)
def test_a_killed_worker_is_an_error_its_slot_is_freed_at_once_and_the_rest_complete(project):
    project.makepyfile(test_drill=KILLED)
    freed_after: dict[int, float | str] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=watch_kills, args=(project.path, freed_after, stop), daemon=True)
    watcher.start()
    try:
        result, took = run(project)
    finally:
        stop.set()
        watcher.join(15)
    print(f"\nworker-killed drill: {took:.1f} s; slot freed after {freed_after}")
    result.assert_outcomes(passed=12, errors=3)
    got = records(project)
    for seed in (100, 101, 102):
        r = got[f"test_killed[{seed}]"]
        assert r.outcome == "error"
        assert "crashed" in r.error and f"test_killed[{seed}]" in r.error, r.error
        took_to_free = freed_after[seed]
        # a bounded wait (the watcher's 10 s), far inside the step timeout (30 s) and the first-action
        # timeout (300 s): the slot was freed by its worker's death, not by a clock running out
        assert isinstance(took_to_free, float), f"the slot killed at {seed} was not seen free: {took_to_free}"
    passed = [got[f"test_episode[{s}]"] for s in range(12)]
    assert all(r.outcome == "passed" and r.steps == LENGTH for r in passed)
    # three workers died: replacements (gw2, gw3, ...) ran the episodes after them, normally
    assert {r.worker for r in passed} - {"gw0", "gw1"}, {r.worker for r in passed}
    result.stdout.fnmatch_lines(["*coverage: 15/15 declared episodes reported, 12 graded, 3 errors*"])


# ========================================================= 2. bridge killed, sim exception
BROKEN = f'''
import os, signal
from pathlib import Path

import numpy as np
import pytest

from pytest_hud.client.bridge import SlotClient

@pytest.mark.hud(sim="sims:exploding")
@pytest.mark.parametrize("seed", range(8))
def test_sim_raises(shared_sim, robot_agent, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed))
    with open("pids.txt", "a") as fh:
        fh.write(f"{{shared_sim.stats()['pid']}}\\n")
    assert result.steps == {LENGTH} and result.total_reward == pytest.approx(seed)

@pytest.mark.parametrize("seed", range(8))
def test_bridge_killed(shared_sim, robot_agent, seed):
    if seed == 3:  # kill the bridge 5 steps into this episode, then keep stepping
        with shared_sim.episode(seed=seed) as ep:
            with SlotClient(ep.address, ep.token, recv_timeout=60) as slot:
                for _ in range(5):
                    slot.step(np.zeros(1, np.float32))
                os.kill(shared_sim.stats()["pid"], signal.SIGKILL)
                for _ in range(5):
                    slot.step(np.zeros(1, np.float32))
    result = robot_agent.run(shared_sim.episode(seed=seed))
    with open("pids.txt", "a") as fh:
        fh.write(f"{{shared_sim.stats()['pid']}}\\n")
    assert result.steps == {LENGTH} and result.total_reward == pytest.approx(seed)
'''


@pytest.mark.timeout(150)
@pytest.mark.parametrize("how", ["sim_raises", "bridge_killed"])
def test_a_broken_bridge_fails_its_episodes_readably_and_is_replaced(project, how):
    project.makepyfile(test_drill=BROKEN)
    result, took = run(project, "-k", how)
    print(f"\n{how} drill: {took:.1f} s")
    got = records(project)
    assert len(got) == 8, sorted(got)  # every episode finished and is in the results file
    errors = {k: r for k, r in got.items() if r.outcome == "error"}
    passed = {k: r for k, r in got.items() if r.outcome == "passed"}
    # the episodes in flight when it broke (one per worker at most) are errors; the rest pass
    assert 1 <= len(errors) <= 2 and len(passed) == 8 - len(errors), {k: r.outcome for k, r in got.items()}
    result.assert_outcomes(passed=len(passed), errors=len(errors))
    readable = {"sim_raises": ["exploded on purpose", "bridge is broken"],
                # on this host the slot connection is on the Unix socket, so the client can tell
                "bridge_killed": ["has exited", "cannot reach"]}[how]
    for name, r in errors.items():  # the first line (what a summary shows) names the cause
        assert any(text in r.error.splitlines()[0] for text in readable), f"{name}: {r.error}"
    for name, r in passed.items():
        assert r.steps == LENGTH, name
    pids = set((project.path / "pids.txt").read_text().split())
    assert len(pids) == 2, pids  # the first bridge, then its replacement
    for line in result.outlines:  # what was printed as passed is in the file as passed
        if " PASSED " in line:
            assert got[line.split("::", 1)[1].split()[0]].outcome == "passed", line


# ================================================================ 3. hung and slow policies
HUNG = f'''
import pytest

@pytest.mark.hud(policy="policies:hang")
def test_hung(shared_sim, robot_agent):
    robot_agent.run(shared_sim.episode(seed=50))

@pytest.mark.parametrize("seed", range(6))
def test_peer(shared_sim, robot_agent, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed))
    assert result.steps == {LENGTH} and result.total_reward == pytest.approx(seed)
'''

SLOW = HUNG.replace("policies:hang", "policies:slow").replace("test_hung", "test_slow")


@dataclass
class Finished:
    ret: int
    output: str
    took: float
    records: dict


@pytest.fixture(scope="module")
def hung_run(tmp_path_factory: pytest.TempPathFactory) -> Finished:
    """One run with a policy that never answers, shared by the assertions below."""
    path = tmp_path_factory.mktemp("hung")
    for name, text in {"simkit.py": SIMKIT.read_text(), "sims.py": SIMS, "policies.py": POLICIES,
                       "pytest.ini": INI, "test_drill.py": HUNG}.items():
        (path / name).write_text(text)
    started = time.monotonic()
    # pytest-timeout is the user's net for a policy call that never returns: nothing in the worker
    # can interrupt a Python call that blocks forever
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--hud-width=2", "-v",
         "--hud-results=r.jsonl", "--hud-first-action-timeout=2", "--hud-step-timeout=1", "--timeout=8"],
        cwd=path, capture_output=True, text=True, timeout=90,
    )
    took = time.monotonic() - started
    print(f"\nhung-policy drill: {took:.1f} s")
    got = {r.nodeid.split("::", 1)[1]: r for r in load_results(path / "r.jsonl").latest_episodes()}
    return Finished(proc.returncode, proc.stdout + proc.stderr, took, got)


@pytest.mark.timeout(120)
def test_a_hung_policy_is_failed_by_the_bridge_and_its_peers_keep_stepping(hung_run):
    got = hung_run.records
    assert all(got[f"test_peer[{s}]"].outcome == "passed" for s in range(6)), {k: r.outcome
                                                                             for k, r in got.items()}
    hung = got["test_hung"]
    assert hung.outcome in ("error", "failed") and hung.steps == 0, hung
    # The peers on the other worker share the bridge with the hung slot: they could only step once
    # the bridge's 2 s first-action timeout failed that slot, so they all finished before the hung
    # test itself ended (by pytest-timeout's 8 s); waiting for that slot, they would finish after it.
    beside = [r for k, r in got.items() if k.startswith("test_peer") and r.worker != hung.worker]
    assert len(beside) >= 3, {k: r.worker for k, r in got.items()}
    assert max(r.finished_at for r in beside) < hung.finished_at, (
        [r.finished_at for r in beside], hung.finished_at)


@pytest.mark.timeout(120)
def test_a_hung_policy_is_an_error_that_names_the_first_action_timeout(hung_run):
    hung = hung_run.records["test_hung"]
    assert hung.outcome == "error", hung
    assert "--hud-first-action-timeout" in (hung.error or ""), hung.error


@pytest.mark.timeout(120)
def test_a_slow_policy_fails_on_the_step_timeout_after_a_slow_first_forward(project):
    project.makepyfile(test_drill=SLOW)
    result, took = run(project, "--hud-first-action-timeout=5", "--hud-step-timeout=1")
    print(f"\nslow-policy drill: {took:.1f} s")
    got = records(project)
    assert all(got[f"test_peer[{s}]"].outcome == "passed" for s in range(6)), {k: r.outcome
                                                                             for k, r in got.items()}
    slow = got["test_slow"]
    assert slow.outcome == "error", slow
    # the 3 s warm-up was inside the first-action timeout; the 2 s second forward was not inside the step's
    assert "sent no action within 1 s (--hud-step-timeout)" in slow.error.splitlines()[0], slow.error
    assert "first-action" not in slow.error
    result.assert_outcomes(passed=6, errors=1)


# ============================================================ found on the way (drill 2 with -k)
@pytest.mark.timeout(60)
def test_episodes_deselected_with_k_are_not_reported_missing(project):
    project.makepyfile(test_drill=KILLED)
    result = project.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist",
                                          "-k", "test_episode and 1", timeout=60)
    result.assert_outcomes(passed=3)  # seeds 1, 10, 11
    result.stdout.fnmatch_lines(["*coverage: 3/3 declared episodes reported, 3 graded, 0 errors*"])
