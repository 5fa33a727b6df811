"""The policy server end to end: a real subprocess on loopback, real clients, every wait bounded.

The served policy (``tests/policykit.py``) answers each caller rows built from that caller's own
observation and prompt, so a reply delivered to the wrong caller fails the comparison.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import msgpack
import numpy as np
import psutil
import pytest
import websockets.sync.client

from conftest import run_threads, stop
from policykit import HORIZON, expected_chunk, openpi_pack, openpi_style_server, openpi_unpack, start_server
from pytest_hud.agent.model import load_policy
from pytest_hud.agent.remote import RemotePolicy, RemotePolicyError

pytestmark = pytest.mark.timeout(90)

REPO = Path(__file__).resolve().parents[2]
KIT = Path(__file__).parents[1] / "policykit.py"
ECHO = f"{KIT}:echo"
LOOP = f"{KIT}:loop"
SLOW = f"{KIT}:slow"


@pytest.fixture
def policy_server(tmp_path: Path):
    """Factory fixture: ``policy_server(spec, *args) -> announce dict``; every server is stopped after."""
    procs: list[subprocess.Popen] = []

    def make(policy: str = ECHO, *extra: str) -> dict:
        proc, announce = start_server(tmp_path, policy, *extra)
        procs.append(proc)
        return announce

    yield make
    for proc in procs:
        stop(proc)


def http_get(announce: dict, path: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(f"http://{announce['host']}:{announce['ws']}{path}", timeout=5) as response:
        return response.status, response.headers.get("Content-Type", ""), response.read().decode()


def stats(announce: dict) -> dict:
    return json.loads(http_get(announce, "/stats")[2])


def state_of(caller: int, request: int) -> np.ndarray:
    return np.array([caller, request, caller * 100 + request], np.float32)


# ------------------------------------------------------------------------------ batching
def test_eight_concurrent_callers_each_get_their_own_rows_from_fewer_forwards(policy_server):
    announce = policy_server(ECHO)
    callers, requests = 8, 25
    replies: dict[int, list[np.ndarray]] = {}

    def caller(index: int):
        def go():
            with RemotePolicy(announce["url"], timeout=10) as policy:
                replies[index] = [
                    policy.predict({"state": state_of(index, i)}, prompt="x" * index) for i in range(requests)
                ]
        return go

    assert run_threads([caller(i) for i in range(callers)]) == []
    for index in range(callers):
        for i, actions in enumerate(replies[index]):
            assert actions.dtype == np.float32
            np.testing.assert_array_equal(actions, expected_chunk(state_of(index, i), "x" * index))

    counted = stats(announce)
    assert counted["requests"] == counted["replies"] == callers * requests
    assert counted["errors"] == 0
    assert counted["max_batch_seen"] > 1
    assert sum(int(size) * n for size, n in counted["batch_sizes"].items()) == callers * requests
    # One forward per batch; lockstep callers share most of them.
    assert counted["forwards"] == counted["batches"] <= callers * requests // 2


def connected_caller(announce: dict, barrier: threading.Barrier, replies: dict, index: int, request):
    """A caller that opens its connection, waits until every caller has, then sends ``request(policy)``
    (a batch goes early once every open connection waits: callers still connecting would miss it)."""
    def go():
        with RemotePolicy(announce["url"], timeout=10) as policy:
            policy.connect()
            barrier.wait(30)
            replies[index] = request(policy)
    return go


def test_max_batch_caps_a_batch_and_a_long_window_fills_it(policy_server):
    # A ten-minute window, and a ninth connection that stays open without asking: neither the window
    # nor "every open connection waits" sends a batch within the callers' 10 s timeout. Only a full
    # batch goes at once, so the callers are answered only if a batch of 4 goes without waiting.
    announce = policy_server(ECHO, "--batch-window-ms", "600000", "--max-batch", "4")
    replies = {}
    barrier = threading.Barrier(8)

    def caller(index: int):
        return connected_caller(announce, barrier, replies, index,
                                lambda policy: policy.predict({"state": state_of(index, 0)}))

    with RemotePolicy(announce["url"], timeout=10) as idle:
        idle.connect()
        assert run_threads([caller(i) for i in range(8)]) == []
    assert len(replies) == 8
    for index, actions in replies.items():
        np.testing.assert_array_equal(actions, expected_chunk(state_of(index, 0)))
    assert stats(announce)["batch_sizes"] == {"4": 2}


def test_a_batch_goes_once_every_open_connection_has_a_request_waiting(policy_server):
    # A ten-minute window: only "nobody else can join" gets these replies within the clients' timeout.
    announce = policy_server(ECHO, "--batch-window-ms", "600000")
    replies = {}
    barrier = threading.Barrier(3)

    def caller(index: int):
        return connected_caller(announce, barrier, replies, index,
                                lambda policy: policy.predict({"state": state_of(index, 0)}))

    assert run_threads([caller(i) for i in range(3)]) == []
    for index, actions in replies.items():
        np.testing.assert_array_equal(actions, expected_chunk(state_of(index, 0)))
    assert stats(announce)["batch_sizes"] == {"3": 1}


def test_a_slow_models_window_stretches_to_a_share_of_its_forward(policy_server):
    # 2 ms is the floor; a 0.2 s forward stretches it to a tenth of that, up to 20 ms.
    fast, slow = policy_server(ECHO), policy_server(SLOW)
    fixed = policy_server(SLOW, "--batch-window-share", "0")
    assert [stats(a)["batch_window_ms"] for a in (fast, slow, fixed)] == [2.0, 2.0, 2.0]  # no forward yet
    for announce in (fast, slow, fixed):
        with RemotePolicy(announce["url"], timeout=30) as policy:
            policy.predict({"state": state_of(0, 0)})
    assert stats(fast)["batch_window_ms"] == 2.0  # a tenth of a 5 ms forward is below the floor
    assert 18.0 <= stats(slow)["batch_window_ms"] <= 20.0
    assert stats(fixed)["batch_window_ms"] == 2.0
    refused = subprocess.run([sys.executable, "-m", "pytest_hud.serving", "--policy", SLOW,
                              "--batch-window-share", "1.5"], capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--batch-window-share between 0 and 1" in refused.stderr


def test_a_policy_without_predict_batch_is_looped_over(policy_server):
    announce = policy_server(LOOP, "--batch-window-ms", "500", "--max-batch", "3")
    replies = {}
    barrier = threading.Barrier(3)

    def caller(index: int):
        return connected_caller(announce, barrier, replies, index,
                                lambda policy: policy.predict({"state": state_of(index, 0)}, prompt="ab"))

    assert run_threads([caller(i) for i in range(3)]) == []
    for index, actions in replies.items():
        np.testing.assert_array_equal(actions, expected_chunk(state_of(index, 0), "ab"))
    counted = stats(announce)
    assert counted["batch_sizes"] == {"3": 1} and counted["forwards"] == 3


# ------------------------------------------------------------------------- openpi wire
class OpenpiStyleClient:
    """openpi-client 0.1.2's ``WebsocketClientPolicy`` on the wire: websockets' sync client with no
    compression and no size limit, metadata frame first, a packed observation map per ``infer``, a
    text frame is an error. (Only the receive timeout is ours, to keep the test bounded.)"""

    def __init__(self, uri: str) -> None:
        self._packer = msgpack.Packer(default=openpi_pack)
        self._ws = websockets.sync.client.connect(uri, compression=None, max_size=None)
        self.metadata = msgpack.unpackb(self._ws.recv(timeout=10), object_hook=openpi_unpack)

    def infer(self, obs: dict) -> dict:
        self._ws.send(self._packer.pack(obs))
        response = self._ws.recv(timeout=10)
        if isinstance(response, str):
            raise RuntimeError(f"Error in inference server:\n{response}")
        return msgpack.unpackb(response, object_hook=openpi_unpack)

    def close(self) -> None:
        self._ws.close()


# websockets >= 17 deprecates the bare connect() openpi-client calls; the wire is the same.
@pytest.mark.filterwarnings("ignore:connect\\(\\) must be used as a context manager:DeprecationWarning")
def test_an_openpi_client_talks_to_our_server(policy_server):
    announce = policy_server(ECHO)
    client = OpenpiStyleClient(announce["url"])
    try:
        assert client.metadata["server"] == "pytest-hud/policy/1"
        assert client.metadata["batching"] is True
        assert client.metadata["robot"] == "policykit"  # the policy's own metadata comes first
        first = client.infer({"state": state_of(1, 0), "prompt": "pick up"})
        second = client.infer({"state": state_of(1, 1)})
    finally:
        client.close()
    np.testing.assert_array_equal(first["actions"], expected_chunk(state_of(1, 0), "pick up"))
    assert first["actions"].dtype == np.float32 and first["actions"].shape == (HORIZON, 5)
    np.testing.assert_array_equal(second["actions"], expected_chunk(state_of(1, 1)))
    assert first["server_timing"]["infer_ms"] >= 5.0  # the policy sleeps 5 ms per forward
    assert "prev_total_ms" not in first["server_timing"]  # as openpi: known from the second reply on
    assert second["server_timing"]["prev_total_ms"] > 0


def test_remote_policy_forwards_observation_and_prompt(policy_server):
    announce = policy_server(ECHO)
    policy = load_policy(announce["url"], None, timeout=10)
    assert isinstance(policy, RemotePolicy)
    try:
        assert policy.connect()["robot"] == "policykit"
        actions = policy.predict({"state": state_of(2, 7)}, prompt="reach")
        np.testing.assert_array_equal(actions, expected_chunk(state_of(2, 7), "reach"))
        actions = policy.predict({"state": state_of(2, 8)})
        np.testing.assert_array_equal(actions, expected_chunk(state_of(2, 8)))
    finally:
        policy.close()
    assert stats(announce)["connections_total"] == 1  # one connection for the whole process


def test_remote_policy_talks_to_an_openpi_server_and_reports_its_traceback():
    def reply(obs):
        if obs["state"][0] < 0:
            raise ValueError("negative state")
        return {"actions": np.tile(obs["state"][:2], (4, 1)).astype(np.float64), "state": obs["state"],
                "prompt_seen": obs.get("prompt", "")}

    url, stop_server = openpi_style_server(reply, {"reset_pose": [0.0, 1.0]})
    try:
        with RemotePolicy(url, timeout=10) as policy:
            actions = policy.predict({"state": np.array([3.0, 4.0, 5.0], np.float32)}, prompt="go")
            assert policy.metadata == {"reset_pose": [0.0, 1.0]}
            assert actions.shape == (4, 2) and (actions == [3.0, 4.0]).all()
            assert policy.last_reply["prompt_seen"] == "go"
            with pytest.raises(RemotePolicyError) as failure:
                policy.predict({"state": np.array([-1.0, 0.0, 0.0], np.float32)})
            assert url in str(failure.value) and "ValueError: negative state" in str(failure.value)
            # The server closed that connection; the next episode gets a fresh one.
            assert policy.predict({"state": np.array([1.0, 2.0, 0.0], np.float32)}).shape == (4, 2)
    finally:
        stop_server()


def test_remote_policy_fails_fast_when_nobody_listens_or_nobody_answers():
    import socket

    with socket.socket() as listener:  # accepts TCP but never speaks WebSocket
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(RemotePolicyError, match=f"ws://127.0.0.1:{port}"):
            RemotePolicy(f"ws://127.0.0.1:{port}", timeout=0.5).predict({"state": np.zeros(2)})
        assert time.monotonic() - started < 5
    with pytest.raises(RemotePolicyError, match="cannot connect to the policy server"):
        RemotePolicy(f"ws://127.0.0.1:{port}", timeout=2).predict({"state": np.zeros(2)})


# ---------------------------------------------------------------------------- failures
def test_a_request_that_makes_the_policy_raise_fails_only_its_caller(policy_server):
    # A long window and max batch 8: all eight first requests share one batch, the bad one included.
    announce = policy_server(ECHO, "--batch-window-ms", "3000", "--max-batch", "8")
    bad = 5
    replies: dict[int, list[np.ndarray]] = {}
    failures: dict[int, BaseException] = {}

    barrier = threading.Barrier(8)

    def caller(index: int):
        def go():
            with RemotePolicy(announce["url"], timeout=10) as policy:
                policy.connect()
                barrier.wait(30)  # all connected first (see connected_caller)
                state = state_of(index, 0)
                if index == bad:
                    state[0] = -1.0
                    try:
                        policy.predict({"state": state})
                    except RemotePolicyError as exc:
                        failures[index] = exc
                    return
                replies[index] = [policy.predict({"state": state})]
        return go

    assert run_threads([caller(i) for i in range(8)]) == []
    assert set(failures) == {bad} and set(replies) == set(range(8)) - {bad}
    message = str(failures[bad])
    assert announce["url"] in message
    assert "the policy failed on this request: ValueError: state[0] must be >= 0" in message
    assert "Traceback" in message
    for index, (actions,) in replies.items():
        np.testing.assert_array_equal(actions, expected_chunk(state_of(index, 0)))
    counted = stats(announce)
    assert counted["batch_sizes"] == {"8": 1}
    assert counted["errors"] == 1 and counted["replies"] == 7
    assert counted["forwards"] == 1 + 8  # the failed batched call, then one by one

    # The server keeps serving; the failed caller's next episode works on a new connection.
    with RemotePolicy(announce["url"], timeout=10) as policy:
        actions = policy.predict({"state": state_of(bad, 1)})
        np.testing.assert_array_equal(actions, expected_chunk(state_of(bad, 1)))


def test_observations_of_different_shapes_never_share_a_forward(policy_server):
    announce = policy_server(ECHO, "--batch-window-ms", "3000", "--max-batch", "4")
    replies = {}
    barrier = threading.Barrier(4)

    def caller(index: int):
        state = np.arange(2 + index % 2, dtype=np.float32) + index  # lengths 2 and 3
        return connected_caller(announce, barrier, replies, index,
                                lambda policy: (state, policy.predict({"state": state})))

    assert run_threads([caller(i) for i in range(4)]) == []
    for state, actions in replies.values():
        np.testing.assert_array_equal(actions, expected_chunk(state))
    counted = stats(announce)
    assert counted["batch_sizes"] == {"4": 1} and counted["forwards"] == 2 and counted["errors"] == 0


def test_a_text_frame_gets_a_readable_error_and_a_close(policy_server):
    announce = policy_server(ECHO)
    with websockets.sync.client.connect(announce["url"], compression=None) as ws:
        ws.recv(timeout=10)  # metadata
        ws.send("hello")
        error = ws.recv(timeout=10)
        assert isinstance(error, str) and "must be binary msgpack, not text" in error
        with pytest.raises(websockets.ConnectionClosed):
            ws.recv(timeout=10)
    with websockets.sync.client.connect(announce["url"], compression=None) as ws:
        ws.recv(timeout=10)
        ws.send(msgpack.packb({"state": [1.0], "prompt": 3}))
        assert "'prompt' must be a string" in ws.recv(timeout=10)


# ---------------------------------------------------------------------- HTTP and process
def test_healthz_answers_200_and_stats_answers_json(policy_server):
    announce = policy_server(ECHO, "--threads", "1")  # no torch in this policy: the flag is moot
    assert http_get(announce, "/healthz")[::2] == (200, "OK\n")
    status, content_type, body = http_get(announce, "/stats")
    assert status == 200 and content_type == "application/json"
    assert json.loads(body)["requests"] == 0 and json.loads(body)["pid"] == announce["pid"]


def test_announce_file_is_private_and_names_the_server(tmp_path):
    proc, announce = start_server(tmp_path, ECHO)
    try:
        (path,) = tmp_path.glob("policy-*.json")
        assert path.stat().st_mode & 0o777 == 0o600
        assert announce["pid"] == proc.pid and announce["url"] == f"ws://127.0.0.1:{announce['ws']}"
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    assert not path.exists()  # removed on the way out


def test_a_bad_policy_spec_exits_with_a_clear_message(tmp_path):
    for spec, words in (("ws://127.0.0.1:1", "policy-server URL"), (f"{KIT}:nope", "nope")):
        done = subprocess.run(
            [sys.executable, "-m", "pytest_hud.serving", "--policy", spec, "--port", "0"],
            capture_output=True, text=True, timeout=60, cwd=REPO,
        )
        assert done.returncode == 2
        assert "cannot load policy" in done.stderr and words in done.stderr


def alive(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE  # an orphan's zombie may wait for its reaper
    except psutil.NoSuchProcess:
        return False


def test_the_server_exits_when_its_parent_dies(tmp_path):
    announce = tmp_path / "policy.json"
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys, time\n"
         f"subprocess.Popen([sys.executable, '-m', 'pytest_hud.serving', '--policy', {ECHO!r},"
         f" '--port', '0', '--announce', {str(announce)!r}])\n"
         "time.sleep(120)\n"],
        cwd=REPO, start_new_session=True,
    )
    server_pid = None
    try:
        deadline = time.monotonic() + 60
        while not announce.exists():
            assert time.monotonic() < deadline, "policy server did not announce itself"
            assert parent.poll() is None
            time.sleep(0.02)
        server_pid = json.loads(announce.read_text())["pid"]
        server = psutil.Process(server_pid)
        parent.kill()
        parent.wait(5)
        deadline = time.monotonic() + 10
        while alive(server):
            assert time.monotonic() < deadline, "the orphaned policy server is still running"
            time.sleep(0.05)
    finally:
        if parent.poll() is None:
            parent.kill()
        if server_pid is not None:
            try:
                os.kill(server_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
