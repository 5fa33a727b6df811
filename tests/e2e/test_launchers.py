"""Launcher backends without Ray: the lease, services that hold one, static endpoints, the Ray option's errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import SIMKIT, launch
from pytest_hud.launch.lease import Lease, LeaseHolder, LeaseLost
from pytest_hud.core.results import load_results

pytestmark = pytest.mark.timeout(240)


def eventually(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.05)
    return value


# ------------------------------------------------------------------------------ lease
def test_a_renewed_lease_holds_and_a_silent_one_expires():
    lease = Lease("127.0.0.1", "s3cret", seconds=1.0)
    holder = LeaseHolder("127.0.0.1", lease.port, "s3cret")
    try:
        for _ in range(30):  # 1.5 s of renewals: longer than the lease
            holder.renew()
            time.sleep(0.05)
            assert lease.expired() is None
        reason = eventually(lease.expired, 30, "the lease expires once renewals stop")
        assert "lease expired" in reason
    finally:
        holder.close(stop=False)
        lease.close()


def test_the_holder_leaving_ends_the_lease_at_once():
    lease = Lease("127.0.0.1", "s3cret", seconds=600.0)
    holder = LeaseHolder("127.0.0.1", lease.port, "s3cret")
    holder.renew()
    holder.close(stop=False)  # as when the controller is killed: the kernel closes its socket
    assert "closed the lease connection" in eventually(lease.expired, 30, "the lease ends")
    lease.close()


def test_a_wrong_secret_neither_renews_nor_ends_the_lease():
    lease = Lease("127.0.0.1", "s3cret", seconds=1.0)
    intruder = LeaseHolder("127.0.0.1", lease.port, "guess")
    try:
        with pytest.raises(LeaseLost, match="broke"):  # the service hangs up on it
            for _ in range(100):
                intruder.renew()
                time.sleep(0.01)
        intruder.close(stop=True)
        reason = eventually(lease.expired, 30, "the lease expires despite the intruder")
        assert "lease expired" in reason  # not "asked to stop" nor "closed"
    finally:
        lease.close()


def test_a_lease_on_a_gone_service_is_reported_lost(tmp_path):
    lease = Lease("127.0.0.1", "s", seconds=10.0)
    port = lease.port
    lease.close()
    with pytest.raises(LeaseLost, match="cannot reach the lease"):
        LeaseHolder("127.0.0.1", port, "s")


@pytest.mark.slow
def test_a_bridge_whose_controller_never_holds_its_lease_exits_by_itself(tmp_path):
    announce = tmp_path / "bridge.json"
    proc, _ = launch([sys.executable, "-m", "pytest_hud.bridge", f"{SIMKIT}:counter", "--width", "1",
                      "--lease", "1", "--announce", str(announce)], tmp_path, "bridge",
                     env=dict(os.environ, SDL_VIDEODRIVER="dummy"))
    assert "lease" in json.loads(announce.read_text())
    try:
        proc.wait(60)
    finally:
        proc.kill()
    assert "lease expired" in (tmp_path / "bridge.log").read_text()


@pytest.mark.slow
def test_a_policy_server_exits_when_its_lease_holder_leaves(tmp_path):
    from policykit import REPO

    announce = tmp_path / "policy.json"
    proc, _ = launch([sys.executable, "-m", "pytest_hud.serving", "--policy", "tests/policykit.py:echo",
                      "--port", "0", "--lease", "600", "--announce", str(announce)], tmp_path, "policy server",
                     cwd=REPO, env=dict(os.environ, PYTEST_HUD_SECRET="s3cret"))
    try:
        data = json.loads(announce.read_text())
        holder = LeaseHolder(data["host"], data["lease"], "s3cret")
        holder.renew()
        assert proc.poll() is None
        holder.close(stop=True)
        proc.wait(60)
    finally:
        proc.kill()
    assert "asked this service to stop" in (tmp_path / "policy.log").read_text()


def test_a_policy_server_lease_without_the_secret_is_refused(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_HUD_SECRET"}
    proc = subprocess.run([sys.executable, "-m", "pytest_hud.serving", "--policy", "x:y", "--lease", "5"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "PYTEST_HUD_SECRET" in proc.stderr


# ----------------------------------------------------------------- static endpoints
SUITE = f'''
import pytest

pytestmark = pytest.mark.hud(sim="{SIMKIT}:counter", policy="pols:one")

@pytest.mark.parametrize("seed", range(4))
def test_counter(shared_sim, robot_agent, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed))
    assert result.steps == 3
'''

POLICY = '''
import numpy as np

def one():
    return lambda obs: np.ones(1, np.float32)
'''


@pytest.mark.slow
def test_a_run_uses_bridges_listed_in_the_environment(pytester, tmp_path):
    announce = tmp_path / "bridge.json"
    bridge, _ = launch([sys.executable, "-m", "pytest_hud.bridge", f"{SIMKIT}:counter", "--width", "2",
                        "--announce", str(announce)], tmp_path, "bridge",
                       env=dict(os.environ, SDL_VIDEODRIVER="dummy"))
    try:
        pytester.makepyfile(test_suite=SUITE, pols=POLICY)
        os.environ["PYTEST_HUD_BRIDGES"] = str(announce)
        try:
            result = pytester.runpytest_subprocess("-n", "2", "--hud-width", "2", "--hud-results", "r.jsonl")
        finally:
            del os.environ["PYTEST_HUD_BRIDGES"]
        result.assert_outcomes(passed=4)
        records = load_results(pytester.path / "r.jsonl").episodes
        # The announce names no node: the host it was reached on stands for it.
        assert len(records) == 4 and {r.extra.get("bridge_node") for r in records} == {"127.0.0.1"}
        assert bridge.poll() is None  # not ours to stop
    finally:
        bridge.kill()
        bridge.wait(10)


@pytest.mark.slow
def test_running_out_of_listed_bridges_names_the_variable(pytester, tmp_path):
    pytester.makepyfile(test_suite=SUITE, pols=POLICY)
    os.environ["PYTEST_HUD_BRIDGES"] = "127.0.0.1:1:2"
    os.environ["PYTEST_HUD_SECRET"] = "x"
    try:
        result = pytester.runpytest_subprocess("-n", "2", "--hud-width", "1", "--hud-results", "r.jsonl")
    finally:
        del os.environ["PYTEST_HUD_BRIDGES"], os.environ["PYTEST_HUD_SECRET"]
    result.assert_outcomes(errors=4)
    text = result.stdout.str()
    assert "PYTEST_HUD_BRIDGES lists 1" in text  # the second worker group's bridge


# ------------------------------------------------------------------ --hud-ray errors
def test_hud_ray_without_ray_installed_says_how_to_install(pytester):
    pytester.makeconftest("import sys\nsys.modules['ray'] = None  # as if Ray were not installed\n")
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("--hud-ray", "auto")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "ERROR: --hud-ray needs Ray: pip install 'pytest-hud[ray]'" in result.stderr.str()


def test_ray_resources_without_hud_ray_are_a_usage_error(pytester):
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("--hud-bridge-resources", '{"sim": 1}')
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--hud-bridge-resources places services on a Ray cluster: add --hud-ray ADDRESS*"])


@pytest.mark.slow
def test_a_run_uses_a_listed_policy_server_with_its_own_key(pytester, tmp_path):
    from policykit import REPO

    announce = tmp_path / "policy.json"
    server, _ = launch([sys.executable, "-m", "pytest_hud.serving", "--policy", "tests/e2e/cluster/sleepy.py:parity",
                        "--port", "0", "--announce", str(announce)], tmp_path, "policy server", cwd=REPO,
                       env=dict(os.environ, PYTEST_HUD_POLICY_KEY="operator-key"))
    try:
        url = json.loads(announce.read_text())["url"]
        pytester.makepyfile(test_suite=SUITE, pols=POLICY)
        os.environ.update(PYTEST_HUD_POLICY_SERVERS=url, PYTEST_HUD_POLICY_KEY="operator-key")
        try:
            result = pytester.runpytest_subprocess("-n", "2", "--hud-width", "2", "--hud-policy-server",
                                                   "--hud-results", "r.jsonl")
        finally:
            del os.environ["PYTEST_HUD_POLICY_SERVERS"], os.environ["PYTEST_HUD_POLICY_KEY"]
        result.assert_outcomes(passed=4)
        records = load_results(pytester.path / "r.jsonl").episodes
        assert {r.extra.get("policy_host") for r in records} == {"127.0.0.1"}
        request = urllib.request.Request(url.replace("ws://", "http://") + "/stats",
                                         headers={"Authorization": "Api-Key operator-key"})
        with urllib.request.urlopen(request, timeout=10) as reply:
            stats = json.loads(reply.read())
        assert stats["requests"] >= 4 * 3, stats  # every step of every episode asked this server
        assert server.poll() is None  # not ours to stop
    finally:
        server.kill()
        server.wait(10)


def test_hud_ray_at_an_address_where_nothing_answers_fails_fast_with_the_fix(pytester):
    import socket

    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pytester.makeconftest("import sys\nsys.modules['ray'] = None  # never reached: the address is checked first\n")
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("--hud-ray", f"127.0.0.1:{port}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert f"nothing answers at 127.0.0.1:{port}" in result.stderr.str()
