"""The bridge's control channel and process end to end: secrets, malformed calls, a closed socket,
unknown tokens, a dead parent, a saved contract, an unknown target.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

from conftest import SIMKIT, first_obs, run_threads
from pytest_hud.agent import Agent
from pytest_hud.client.bridge import (
    AsyncControlClient, AsyncSlotClient, BridgeAddress, BridgeError, ControlClient, SlotClient,
)
from pytest_hud.client.episode import Episode

pytestmark = pytest.mark.timeout(60)

COUNTER = f"{SIMKIT}:counter"


def test_a_bad_secret_is_refused(bridge):
    address = bridge(COUNTER, 1)
    forged = BridgeAddress(address.control, address.ws, "0" * 32, address.host)
    with pytest.raises(BridgeError, match="wrong or missing secret"):
        ControlClient(forged)
    with socket.create_connection((address.host, address.control), timeout=5) as sock:
        sock.sendall(b'{"jsonrpc": "2.0", "id": 1, "method": "reset", "params": {}}\n')
        reply = json.loads(sock.makefile().readline())
        assert reply["error"]["code"] == -32001 and "hello" in reply["error"]["message"]


def test_malformed_control_frames_get_json_rpc_errors_and_the_handler_survives(bridge):
    address = bridge(COUNTER, 1)
    with socket.create_connection((address.host, address.control), timeout=5) as sock:
        f = sock.makefile("rwb")
        for line, code in [(b"not json\n", -32700), (b'{"id": 1}\n', -32600), (b"[1, 2]\n", -32600)]:
            f.write(line)
            f.flush()
            assert json.loads(f.readline())["error"]["code"] == code
        f.write(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "hello", "params": {"secret": address.secret}}).encode() + b"\n")
        f.flush()
        assert json.loads(f.readline())["result"]["width"] == 1
        f.write(b'{"jsonrpc": "2.0", "id": 3, "method": "nope"}\n')
        f.flush()
        assert json.loads(f.readline())["error"]["code"] == -32601


def test_a_closed_socket_makes_the_client_raise_at_once(bridge):
    address = bridge(COUNTER, 1)
    with ControlClient(address) as control:
        claim = control.claim(seed=1)
        ws = SlotClient(address, claim.token, recv_timeout=30)
        for proc in bridge.processes:
            proc.kill()
        # "closed", not the "sent nothing for 30 s" of a client that waited out its read timeout
        with pytest.raises(BridgeError, match="closed"):
            ws.step(np.zeros(1, np.float32))
        with pytest.raises(BridgeError):
            control.result(claim.token)


def test_an_unknown_token_is_refused_with_a_text_frame(bridge):
    address = bridge(COUNTER, 1)
    with pytest.raises(BridgeError, match="unknown or released token"):
        SlotClient(address, "f" * 32)


def test_the_bridge_exits_when_its_parent_dies(tmp_path):

    announce = tmp_path / "child.json"
    # a parent that starts a bridge and then dies at once (SIGKILL-like: os._exit)
    code = (
        "import subprocess, sys, time, os\n"
        f"p = subprocess.Popen([sys.executable, '-m', 'pytest_hud.sim', {COUNTER!r}, '--announce', {str(announce)!r}])\n"
        f"while not os.path.exists({str(announce)!r}): time.sleep(0.02)\n"
        "print(p.pid, flush=True)\n"
        "os._exit(0)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    pid = int(out.stdout.strip())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            import os

            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"bridge {pid} outlived its parent")
    assert not announce.exists()  # and took its announce file (with the secret) with it


def test_a_saved_contract_is_validated_at_start_and_its_names_are_served(bridge, tmp_path):

    from pytest_hud.core.contract import Contract

    saved = tmp_path / "contract.json"
    address = bridge("Pendulum-v1", 1, "--save-contract", str(saved))
    data = json.loads(saved.read_text())
    data["features"]["state"]["names"] = ["cos_theta", "sin_theta", "theta_dot"]
    saved.write_text(json.dumps(data))
    renamed = bridge("Pendulum-v1", 1, "--contract", str(saved))
    with ControlClient(renamed) as control:
        assert control.contract().features["state"].names == ["cos_theta", "sin_theta", "theta_dot"]
    data["features"]["state"]["shape"] = [4]
    data["features"]["state"]["names"] = ["a", "b", "c", "d"]
    saved.write_text(json.dumps(data))
    out = subprocess.run([sys.executable, "-m", "pytest_hud.sim", "Pendulum-v1", "--contract", str(saved)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "feature 'state': contract says shape (4,), the env gives (3,)" in out.stderr
    assert Contract.load(saved).features["state"].shape == (4,)
    del address


def test_an_unknown_target_exits_with_a_clear_error():

    out = subprocess.run([sys.executable, "-m", "pytest_hud.sim", "NoSuchEnv-v0"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "unknown sim target 'NoSuchEnv-v0'" in out.stderr
