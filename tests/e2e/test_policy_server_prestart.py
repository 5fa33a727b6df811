"""Policy servers started before their contract exists (``--hud-policy-server``): the pool starts one
when a worker declares tests that will ask for it, so the server's imports overlap the sims' boot,
and hands it the contract later. Real server subprocesses, a real pool, a real pytest run."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import psutil
import pytest

from conftest import standbys, stop
from policykit import serve_waiting, wait_for, write_atomically
from pytest_hud.agent.remote import RemotePolicy
from pytest_hud.core.contract import derive_contract
from pytest_hud.launch.launcher import StaticLauncher
from pytest_hud.controller.pool import BridgeSpec, SimPool

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]

# The action width comes from the contract the server was loaded for: the reply shows which one it got.
# Imported, the module leaves NAME.imported beside itself: a waiting server has done its imports.
CONTRACTED = '''
import os
from pathlib import Path

import numpy as np

Path(__file__).with_suffix(".imported").write_text(str(os.getpid()))

class Sized:
    def __init__(self, width):
        self.width = width

    def predict(self, observation, prompt=None):
        return np.full((1, self.width), float(np.asarray(observation["state"]).sum()), np.float32)

def sized(contract):
    return Sized(contract.action_dim)
'''


def contract_dict(actions: int) -> dict:
    """A contract with a 2-number state and ``actions`` numbers per action."""
    state = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action = gym.spaces.Box(-1.0, 1.0, (actions,), np.float32)
    return derive_contract(state, action, np.zeros(2, np.float32)).to_dict()


@pytest.fixture
def spec(tmp_path: Path) -> str:
    (tmp_path / "contracted.py").write_text(CONTRACTED)
    return f"{tmp_path / 'contracted.py'}:sized"


def imported(spec: str, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> int:
    """Wait until a server has imported ``spec``'s module (CONTRACTED's marker); the importer's pid."""
    marker = Path(spec.rpartition(":")[0]).with_suffix(".imported")
    deadline = time.monotonic() + timeout
    while not marker.exists() or not marker.read_text():
        assert proc is None or proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, f"no server imported {spec} within {timeout:.0f} s"
        time.sleep(0.02)
    return int(marker.read_text())


# ------------------------------------------------------------------------------ the server
def test_a_waiting_server_announces_only_once_its_contract_arrives_and_loads_for_it(tmp_path, spec):
    proc, announce, contract = serve_waiting(tmp_path, spec)
    try:
        assert imported(spec, proc=proc) == proc.pid  # its imports are done
        time.sleep(0.5)  # a server that did not wait for its contract would exit or announce now
        assert proc.poll() is None and not announce.exists()
        write_atomically(contract, json.dumps(contract_dict(3)))  # three numbers per action
        served = wait_for(announce, proc)
        with RemotePolicy(served["url"], timeout=10) as policy:
            chunk = policy.predict({"state": np.array([1.0, 2.0, 0.5], np.float32)})
        np.testing.assert_array_equal(chunk, np.full((1, 3), 3.5, np.float32))
    finally:
        stop(proc)


def test_contract_wait_and_contract_are_exclusive_and_a_bad_contract_is_reported(tmp_path, spec):
    done = subprocess.run([sys.executable, "-m", "pytest_hud.serving", "--policy", spec, "--port", "0",
                           "--contract", "a.json", "--contract-wait", "b.json"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "not allowed with argument" in done.stderr
    proc, announce, contract = serve_waiting(tmp_path, spec)
    try:
        write_atomically(contract, "{not json")
        assert proc.wait(60) == 2
        assert "cannot load policy" in proc.stderr.read()
    finally:
        stop(proc)


def test_a_waiting_server_exits_when_its_parent_dies(tmp_path, spec):
    cmd = [sys.executable, "-m", "pytest_hud.serving", "--policy", spec, "--port", "0",
           "--contract-wait", str(tmp_path / "contract.json")]
    # The parent names itself (as pytest-hud's launcher does): by default a server watches the process
    # that started it, read once its interpreter is up, which on a loaded machine can be after the
    # parent was killed (the server would then see init and wait on, an orphan).
    parent = subprocess.Popen([sys.executable, "-c", f"import os, subprocess, time; "
                               f"subprocess.Popen({cmd!r} + ['--parent-pid', str(os.getpid())]); "
                               "time.sleep(60)"], cwd=REPO, start_new_session=True)
    server = None
    try:
        deadline = time.monotonic() + 30
        while not (children := psutil.Process(parent.pid).children()):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        (server,) = children
        time.sleep(1.0)
        assert server.is_running() and server.status() != psutil.STATUS_ZOMBIE  # waiting
        parent.kill()
        parent.wait(5)
        server.wait(15)  # psutil.TimeoutExpired if it outlives its parent
    finally:
        stop(parent)
        if server is not None and server.is_running():
            server.kill()  # failed: no orphan left behind either way


# -------------------------------------------------------------------------------- the pool
def pool_children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True)
            if "pytest_hud.serving" in " ".join(p.cmdline())]


def prestarted(pool: SimPool, spec: str) -> psutil.Process:
    """Prestart ``spec``'s server and return its process once it runs."""
    assert pool.prestart_policy_server(spec, worker=0)
    deadline = time.monotonic() + 30
    while not (children := pool_children()):
        assert time.monotonic() < deadline, "the prestarted server never started"
        time.sleep(0.05)
    (server,) = children
    return server


def test_the_pool_hands_its_prestarted_server_the_contract_and_the_boot_clock_starts_then(spec):
    # A 4 s boot timeout: the contract comes over 5 s after the prestart, which must not count. The
    # server has done its imports by then (the marker), so what the clock does time after the hand-off
    # (load the policy, listen, announce) takes far less than 4 s however loaded the machine.
    pool = SimPool("s3cret", BridgeSpec(width=1, boot_timeout=4.0, cwd=str(REPO)), workers=1)
    try:
        prestarted_at = time.monotonic()
        assert pool.prestart_policy_server(spec, worker=0)
        assert not pool.prestart_policy_server(spec, worker=0)  # one waiting server per (spec, replica)
        importer = imported(spec)
        time.sleep(max(0.0, prestarted_at + 5.0 - time.monotonic()))
        (started,) = pool_children()
        assert started.pid == importer
        reply = pool.policy_server_for(spec, contract_dict(2), worker=0)
        assert reply["url"].endswith(f":{json.loads(next(pool.workdir.glob('policy-*.json')).read_text())['ws']}")
        assert pool_children() == [started]  # the prestarted one: no second server
        with RemotePolicy(reply["url"], timeout=10, api_key="s3cret") as policy:
            chunk = policy.predict({"state": np.array([0.25, 0.5], np.float32)})
        np.testing.assert_array_equal(chunk, np.full((1, 2), 0.75, np.float32))
        # Another contract for the same policy: a server of its own, started the usual way.
        other = pool.policy_server_for(spec, contract_dict(4), worker=0)
        assert other["url"] != reply["url"] and len(pool_children()) == 2
        assert not pool.prestart_policy_server(spec, worker=0)  # it has servers now
    finally:
        pool.stop_all()
    assert not pool_children()


def test_a_prestarted_server_nobody_asks_for_is_stopped_with_the_run(spec):
    pool = SimPool("s3cret", BridgeSpec(width=1, cwd=str(REPO)), workers=1)
    try:
        prestarted(pool, spec)
    finally:
        pool.stop_all(timeout=5)
    assert not pool_children()


def test_a_prestart_the_run_ends_during_leaves_no_server_behind(spec):
    # The prestart's thread may launch after the run's end began (or register its child just after
    # the launcher listed what to stop): nothing may outlive stop_all either way.
    for _ in range(5):
        pool = SimPool("s3cret", BridgeSpec(width=1, cwd=str(REPO)), workers=1)
        assert pool.prestart_policy_server(spec, worker=0)
        (pending,) = pool.server_set._prestarts.values()
        pool.stop_all(timeout=5)
        # The prestart's thread ends once its launch was refused or its server exited; one whose
        # server outlived stop_all would wait for that server's announce (or contract) for ever.
        assert pending.done.wait(30), "the prestart's thread still waits for a server that outlived stop_all"
        assert pending.service is None and pending.error is not None, pending
        assert not pool_children()


@pytest.mark.parametrize("waiting", ["prestarted", "standby"])
def test_a_waiting_server_that_died_is_replaced_by_one_started_the_usual_way(spec, waiting):
    pool = SimPool("s3cret", BridgeSpec(width=1, cwd=str(REPO)), workers=1)
    try:
        if waiting == "prestarted":
            process, mark = prestarted(pool, spec), "--contract-wait"
        else:
            assert pool.warm_policy_server()
            (process,), mark = standbys(), "pytest_hud.launch.standby"
        process.kill()  # e.g. the OOM killer, while it imported
        process.wait(10)
        reply = pool.policy_server_for(spec, contract_dict(2), worker=0)
        with RemotePolicy(reply["url"], timeout=10, api_key="s3cret") as policy:
            chunk = policy.predict({"state": np.array([1.0, 1.0], np.float32)})
        np.testing.assert_array_equal(chunk, np.full((1, 2), 2.0, np.float32))
        (serving,) = pool_children()
        assert mark not in serving.cmdline()
    finally:
        pool.stop_all()


def test_launchers_that_cannot_hand_over_a_file_do_not_prestart(spec):
    pool = SimPool("s3cret", BridgeSpec(width=1, cwd=str(REPO)), workers=1, launcher=StaticLauncher({}))
    try:
        assert not pool.prestart_policy_server(spec, worker=0)
    finally:
        pool.stop_all()


# ------------------------------------------------------------------------------- a pytest run
PROJECT = '''
import json, os, sys

import gymnasium as gym
import numpy as np
import pytest

def cartpole():
    return gym.make("CartPole-v1", max_episode_steps=20)

class Push:
    def predict(self, observation, prompt=None):
        return np.asarray([1])

def push():
    with open("push-server.json", "w") as fh:
        json.dump({"pid": os.getpid(), "argv": sys.argv}, fh)
    return Push()

@pytest.mark.parametrize("seed", range(4))
def test_push(shared_sim, robot_agent, seed):
    assert robot_agent.run(shared_sim.episode(seed=seed)).steps > 0

@pytest.mark.hud(policy="unused_policy:factory")
def test_skipped_before_its_episode(shared_sim, robot_agent):
    pytest.skip("never asks for its policy")
'''

UNUSED = '''
import os
import socket
from pathlib import Path

Path("unused-imported.txt").write_text(str(os.getpid()))  # the waiting server imports its module

def factory():
    raise AssertionError("never loaded: no test asks for this policy")
'''


@pytest.mark.timeout(240)
def test_a_run_prestarts_its_servers_and_leaves_none_behind(pytester: pytest.Pytester):
    pytester.makepyfile(test_project=PROJECT, unused_policy=UNUSED)
    pytester.makeini("[pytest]\nhud_sim = test_project:cartpole\nhud_policy = test_project:push\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--hud-width=2",
                                           "--hud-policy-server", timeout=200)
    result.assert_outcomes(passed=4, skipped=1)
    served = json.loads((pytester.path / "push-server.json").read_text())
    assert "--contract-wait" in served["argv"]  # prestarted, then handed the contract
    # The unused policy's server was prestarted too (it imported its module) and waited for a
    # contract that never came; it was stopped with the run.
    waiting = int((pytester.path / "unused-imported.txt").read_text())
    for pid in (served["pid"], waiting):
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_the_summary_asks_stuck_bridges_for_their_notes_all_at_once_and_gives_up_in_time():
    """A bridge stuck in a sim call accepts connections but answers nothing: five of them cost the
    summary one timeout, not five, and leave no socket behind."""
    from pytest_hud.client import BridgeAddress
    from pytest_hud.controller.bridges import _Bridge

    class Alive:
        def poll(self):
            return None

    def closed(conn: socket.socket) -> bool:
        """Whether the pool hung up on ``conn`` (what it sent is read and dropped)."""
        try:
            while data := conn.recv(65536, socket.MSG_DONTWAIT):
                pass
            return data == b""
        except BlockingIOError:
            return False

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(60)  # a bounded wait: a pool that never dials fails the test, never hangs it
    port = listener.getsockname()[1]
    held: list[socket.socket] = []
    hung_up_before: list[int] = []  # per connection: how many earlier ones the pool had given up on

    def accept_all() -> None:
        for _ in range(5):
            conn, _ = listener.accept()
            hung_up_before.append(sum(closed(c) for c in held))
            held.append(conn)

    pool = SimPool("s3cret", BridgeSpec(width=1, cwd=str(REPO)), workers=1)
    for i in range(5):
        pool.bridge_set._bridges[(f"stuck{i}", "{}", 0)] = _Bridge(
            (f"stuck{i}", "{}", 0), Alive(), BridgeAddress(control=port, ws=port, secret="s3cret"), "", 0.0)
    acceptor = threading.Thread(target=accept_all, daemon=True)
    acceptor.start()
    try:
        assert pool.stepping_notes(timeout=5.0) == []
        acceptor.join(60)
        # The order, not a clock: all five were asked before the pool gave up on any (asked in turn,
        # each would be dialled only after the one before had timed out and been hung up on) ...
        assert hung_up_before == [0, 0, 0, 0, 0], hung_up_before
        # ... and by the time the summary has its notes, it has hung up on every one
        deadline = time.monotonic() + 30
        while not all(closed(c) for c in held):
            assert time.monotonic() < deadline, "a stuck bridge's connection was left open"
            time.sleep(0.05)
    finally:
        for conn in held:
            conn.close()
        listener.close()


# ------------------------------------------------------------------------------ the standby
def test_a_standby_becomes_the_first_server_with_the_runs_secret_and_the_workers_import_paths(tmp_path):
    # The policy module is importable only from a path a worker declared after the standby started:
    # the standby's interpreter must take the launch's PYTHONPATH and its secret, not just its arguments.
    (tmp_path / "late_policies.py").write_text(CONTRACTED)
    pool = SimPool("s3cret", BridgeSpec(width=1, cwd=str(REPO)), workers=1)
    try:
        assert pool.warm_policy_server()
        assert not pool.warm_policy_server()  # one standby
        (standby,) = standbys()
        pool.add_python_path([str(tmp_path)])
        assert pool.prestart_policy_server("late_policies:sized", worker=0)
        reply = pool.policy_server_for("late_policies:sized", contract_dict(3), worker=0)
        assert [p.pid for p in pool_children()] == [standby.pid]  # it serves: no other process started
        with RemotePolicy(reply["url"], timeout=10, api_key="s3cret") as policy:
            chunk = policy.predict({"state": np.array([0.5, 0.25], np.float32)})
        np.testing.assert_array_equal(chunk, np.full((1, 3), 0.75, np.float32))
        # The next server (another contract) is started the usual way.
        pool.policy_server_for("late_policies:sized", contract_dict(1), worker=0)
        assert len(pool_children()) == 2 and not standbys()[1:]
    finally:
        pool.stop_all()
    assert not pool_children()


def test_an_unused_standby_is_stopped_with_the_run():
    pool = SimPool("s3cret", BridgeSpec(width=1, cwd=str(REPO)), workers=1)
    try:
        assert pool.warm_policy_server()
        assert standbys()
    finally:
        pool.stop_all(timeout=5)
    assert not pool_children()


def test_a_standby_only_takes_the_module_it_was_started_for(tmp_path):
    from pytest_hud.launch.launcher import LocalLauncher

    launcher = LocalLauncher(lambda: tmp_path, cwd=str(REPO))
    try:
        assert launcher.warm("policy", "pytest_hud.no_such_module", "gc:collect")
        (standby,) = standbys()
        service = launcher.launch(["-m", "pytest_hud.serving", "--policy", "tests/policykit.py:echo",
                                   "--port", "0"], "policy server", role="policy",
                                  env={"PYTEST_HUD_SECRET": "s3cret"}, timeout=60)
        assert service.pid != standby.pid and not standby.is_running()
    finally:
        launcher.close()


# ------------------------------------------------------------------------ bridges at declaration
WAIT_FOR_A_BRIDGE = '''
import time

import pytest

from pytest_hud.worker.keys import SESSION_KEY


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    # Before any fixture asks for the sim: a bridge must already be on its way from the declaration.
    session = item.config.stash[SESSION_KEY]
    deadline = time.monotonic() + 90
    while not session.pool_call("bridges"):
        assert time.monotonic() < deadline, "no bridge started before a test asked for one"
        time.sleep(0.05)
'''


@pytest.mark.timeout(240)
@pytest.mark.parametrize("workers", ["2", "0"])
def test_a_declared_sim_gets_its_bridge_before_a_test_asks(pytester: pytest.Pytester, workers):
    pytester.makepyfile(test_project=PROJECT, unused_policy=UNUSED)
    pytester.makeconftest(WAIT_FOR_A_BRIDGE)
    pytester.makeini("[pytest]\nhud_sim = test_project:cartpole\nhud_policy = test_project:push\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", workers, "--hud-width=2", timeout=200)
    result.assert_outcomes(passed=4, skipped=1)
