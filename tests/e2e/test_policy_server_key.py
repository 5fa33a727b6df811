"""The policy server's key: required beyond loopback, checked at the WebSocket handshake, sent the way
openpi-client sends it (``Authorization: Api-Key KEY``). Real server subprocesses, real clients."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import msgpack
import numpy as np
import pytest
import websockets.sync.client
from websockets.exceptions import InvalidStatus

from conftest import stop
from policykit import expected_chunk, start_server
from pytest_hud.agent.remote import API_KEY_ENV, RemotePolicy, RemotePolicyError
from pytest_hud.serving.server import PolicyServer, is_loopback
from test_policy_server import ECHO, openpi_pack, openpi_unpack

pytestmark = pytest.mark.timeout(90)

REPO = Path(__file__).resolve().parents[2]
KEY = "k3y-for-tests"


def server_env(**keys: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (API_KEY_ENV, "PYTEST_HUD_SECRET")}
    env.update(keys)
    return env


@pytest.fixture
def keyed_server(tmp_path: Path):
    """A server on every interface (0.0.0.0) with ``KEY`` from the environment; its announce dict."""
    proc, announce = start_server(tmp_path, ECHO, "--host", "0.0.0.0", env=server_env(**{API_KEY_ENV: KEY}))
    yield dict(announce, url=f"ws://127.0.0.1:{announce['ws']}")
    stop(proc)


def state_of(n: int) -> np.ndarray:
    return np.asarray([n, 1.5, -2.0], np.float32)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", ""])
def test_a_server_bound_beyond_loopback_without_a_key_refuses_to_start(tmp_path, host):
    done = subprocess.run(
        [sys.executable, "-m", "pytest_hud.serving", "--policy", ECHO, "--port", "0", "--host", host],
        cwd=REPO, env=server_env(), capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2
    assert f"refusing to serve on {host!r} without a key" in done.stderr
    assert API_KEY_ENV in done.stderr and "api_key=KEY" in done.stderr  # names the fix, both sides


def test_the_server_class_refuses_too_and_loopback_needs_no_key():
    async def main() -> None:
        server = PolicyServer(lambda obs: np.zeros(1))
        with pytest.raises(PermissionError, match="without a key"):
            await server.start("0.0.0.0", 0)
        await server.close()
        server = PolicyServer(lambda obs: np.zeros(1))
        assert await server.start("127.0.0.1", 0) > 0
        await server.close()

    asyncio.run(main())


def test_loopback_is_told_apart_from_everything_else():
    assert all(map(is_loopback, ["127.0.0.1", "127.0.0.2", "::1", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "", "10.1.2.3", "gpu-box.example", "192.168.0.7"]))


def test_a_handshake_without_the_key_gets_401_and_a_wrong_key_403(keyed_server):
    url = keyed_server["url"]
    with pytest.raises(InvalidStatus) as missing:
        websockets.sync.client.connect(url, compression=None, open_timeout=10)
    assert missing.value.response.status_code == 401
    assert b"Authorization: Api-Key KEY" in missing.value.response.body
    for header in ("Api-Key wrong", f"Bearer {KEY}", f"Api-Key {KEY}x", "Api-Key"):
        with pytest.raises(InvalidStatus) as wrong:
            websockets.sync.client.connect(url, compression=None, open_timeout=10,
                                           additional_headers={"Authorization": header})
        assert wrong.value.response.status_code == 403, header
    # /healthz stays open (load balancers); /stats needs the key.
    with urllib.request.urlopen(f"http://127.0.0.1:{keyed_server['ws']}/healthz", timeout=5) as response:
        assert response.status == 200
    with pytest.raises(urllib.error.HTTPError) as stats:
        urllib.request.urlopen(f"http://127.0.0.1:{keyed_server['ws']}/stats", timeout=5)
    assert stats.value.code == 401


# websockets >= 17 deprecates the bare connect() openpi-client calls; the wire is the same.
@pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")
def test_the_openpi_client_header_is_accepted(keyed_server):
    # openpi-client's WebsocketClientPolicy(host, port, api_key=KEY) connects exactly so
    # (packages/openpi-client/src/openpi_client/websocket_client_policy.py).
    ws = websockets.sync.client.connect(keyed_server["url"], compression=None, max_size=None,
                                        additional_headers={"Authorization": f"Api-Key {KEY}"})
    try:
        metadata = msgpack.unpackb(ws.recv(timeout=10), object_hook=openpi_unpack)
        assert metadata["server"] == "pytest-hud/policy/1"
        ws.send(msgpack.packb({"state": state_of(3), "prompt": "go"}, default=openpi_pack))
        reply = msgpack.unpackb(ws.recv(timeout=10), object_hook=openpi_unpack)
    finally:
        ws.close()
    np.testing.assert_array_equal(reply["actions"], expected_chunk(state_of(3), "go"))


def test_remote_policy_sends_its_key_and_says_what_to_do_without_one(keyed_server, monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    with RemotePolicy(keyed_server["url"], timeout=10, api_key=KEY) as policy:
        np.testing.assert_array_equal(policy.predict({"state": state_of(4)}), expected_chunk(state_of(4)))
    with pytest.raises(RemotePolicyError, match=f"HTTP 401.*sent no key.*{API_KEY_ENV}"):
        RemotePolicy(keyed_server["url"], timeout=10).connect()
    with pytest.raises(RemotePolicyError, match="HTTP 403.*a key the server does not accept"):
        RemotePolicy(keyed_server["url"], timeout=10, api_key="nope").connect()
    monkeypatch.setenv(API_KEY_ENV, KEY)  # the environment variable is the default key
    with RemotePolicy(keyed_server["url"], timeout=10) as policy:
        np.testing.assert_array_equal(policy.predict({"state": state_of(5)}), expected_chunk(state_of(5)))


def test_the_run_secret_is_the_default_key(tmp_path):
    # The pool gives every child PYTEST_HUD_SECRET; a server it starts therefore requires the secret,
    # even when the user's environment holds a key of their own (the run's workers send the secret).
    proc, announce = start_server(tmp_path, ECHO, env=server_env(PYTEST_HUD_SECRET="run-secret",
                                                                 **{API_KEY_ENV: "users-own-key"}))
    try:
        url = announce["url"]
        with pytest.raises(RemotePolicyError, match="HTTP 401"):
            RemotePolicy(url, timeout=10, api_key="").connect()
        with pytest.raises(RemotePolicyError, match="HTTP 403"):
            RemotePolicy(url, timeout=10, api_key="users-own-key").connect()
        with RemotePolicy(url, timeout=10, api_key="run-secret") as policy:
            assert policy.connect()["server"] == "pytest-hud/policy/1"
    finally:
        stop(proc)


PROJECT_SIMS = '''
import gymnasium as gym

def cartpole():
    return gym.make("CartPole-v1", max_episode_steps=30)
'''

# Where the policy is loaded and where it answers: each process that loads it or calls it says so,
# so a policy loaded in the workers (no server at all) shows up as the workers' pids.
PROJECT_POLICIES = '''
import json, os, sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))  # whatever the process's working directory

class Balance:
    def predict(self, observation, prompt=None):
        with open(os.path.join(HERE, "predicted.txt"), "a") as fh:
            fh.write(f"{os.getpid()}\\n")
        state = observation["state"]
        return np.asarray([int(state[2] + 0.5 * state[3] > 0)])

def balance():
    with open(os.path.join(HERE, "loaded.txt"), "a") as fh:
        fh.write(json.dumps({"pid": os.getpid(), "argv": sys.argv}) + "\\n")
    return Balance()
'''

PROJECT_TEST = '''
import os
import pytest

@pytest.mark.parametrize("seed", range(4))
def test_balance(shared_sim, robot_agent, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed))
    with open("workers.txt", "a") as fh:
        fh.write(f"{os.getpid()}\\n")
    assert result.steps == 30
'''


@pytest.mark.timeout(240)
def test_workers_reach_the_runs_keyed_policy_server(pytester: pytest.Pytester, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "a-key-for-some-other-server")  # must not confuse the run's own
    pytester.makepyfile(sims=PROJECT_SIMS, policies=PROJECT_POLICIES, test_served=PROJECT_TEST)
    pytester.makeini("[pytest]\nhud_sim = sims:cartpole\nhud_policy = policies:balance\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--hud-width=2",
                                           "--hud-policy-server", timeout=200)
    result.assert_outcomes(passed=4)
    # The policy was loaded once, by the policy server, and every action came from that process:
    # none from the workers (a policy loaded in the workers would show their pids here).
    workers = {int(pid) for pid in (pytester.path / "workers.txt").read_text().split()}
    loads = [json.loads(line) for line in (pytester.path / "loaded.txt").read_text().splitlines()]
    assert workers and len(loads) == 1, (workers, loads)
    (server,) = loads
    assert server["pid"] not in workers and "--policy" in server["argv"], server  # the server's command line
    predicted = [int(pid) for pid in (pytester.path / "predicted.txt").read_text().split()]
    assert len(predicted) >= 4 and set(predicted) == {server["pid"]}, (len(predicted), set(predicted))
