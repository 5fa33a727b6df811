"""The fuzz drills' bench: one long-lived bridge per module with a well-behaved peer episode on it,
and the check that it stays healthy after every hostile case (the ``sims`` fixture).
"""

from __future__ import annotations

import ast
import json
import os
import reprlib
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import psutil
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from conftest import SIMKIT, start_bridge
from pytest_hud.client.bridge import BridgeAddress, BridgeError, ControlClient, SlotClient
from pytest_hud.core.contract import Contract
from pytest_hud.wire.codec import MAX_FRAME_BYTES, WireError, packb, unpackb


CASES = 1000
WAIT = 2.0  # client-side bound on every answer: a hang fails the case, never the job
FUZZ = settings(
    max_examples=CASES,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
PEER_SEED = 7
WIDTH = 3  # the peer, the case's own slot, and one spare for floods

LONG_SIM = f"""
import sys
sys.path.insert(0, {str(SIMKIT.parent)!r})
from simkit import CounterSim

def long(num_envs):
    return CounterSim(num_envs, length=10**9)  # the peer's episode never ends during a drill
"""


# ------------------------------------------------------------------ fixtures
@dataclass
class Peer:
    """A well-behaved episode on the same bridge: it must keep stepping whatever the fuzz does."""

    address: BridgeAddress
    control: ControlClient = field(init=False)
    slot: SlotClient = field(init=False)
    steps: int = 0
    token: str = ""

    def __post_init__(self) -> None:
        self.control = ControlClient(self.address, timeout=WAIT)
        claim = self.control.claim(seed=PEER_SEED, wait=WAIT)
        self.token = claim.token
        self.slot = SlotClient(self.address, claim.token, connect_timeout=WAIT, recv_timeout=WAIT)
        assert list(self.slot.first_observation["state"]) == [PEER_SEED, 0]

    def step(self) -> None:
        frame = self.slot.step(np.zeros(1, np.float32))
        self.steps += 1
        # CounterSim's state is [seed, steps since reset]: a tick taken without the peer's action,
        # or a reset of the wrong slot, shows here.
        assert list(frame["state"]) == [PEER_SEED, self.steps], frame

    def close(self) -> None:
        self.slot.close()
        self.control.close()


@dataclass
class Target:
    process: Any
    address: BridgeAddress
    peer: Peer
    contract: Contract

    def assert_healthy(self) -> None:
        """The bridge is up, the peer completes a step, and only the peer's slot is taken."""
        assert self.process.poll() is None, f"the bridge died (exit code {self.process.returncode})"
        self.peer.step()
        deadline = time.monotonic() + WAIT
        while True:
            slots = self.peer.control.stats()["slots"]
            taken = [s for s in slots if s["state"] != "free"]
            if len(taken) == 1:
                return
            assert time.monotonic() < deadline, f"slots not freed after the case: {slots}"
            time.sleep(0.002)


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory):
    """Factory for long-lived bridges of this module: ``sims(width) -> Target``; all stopped after."""
    root = tmp_path_factory.mktemp("fuzz")
    (root / "longsim.py").write_text(LONG_SIM)
    started: list[Target] = []

    def make(width: int = WIDTH) -> Target:
        process, address = start_bridge(root, f"{root / 'longsim.py'}:long", width)
        peer = Peer(address)
        target = Target(process, address, peer, peer.control.contract())
        started.append(target)
        return target

    yield make
    for target in started:
        target.peer.close()
        target.process.terminate()
        try:
            target.process.wait(5)
        except Exception:  # noqa: BLE001
            target.process.kill()


class Conn:
    """A raw control connection: bytes in, JSON replies out, every read bounded."""

    def __init__(self, address: BridgeAddress, hello: bool) -> None:
        self.sock = socket.create_connection((address.host, address.control), timeout=WAIT)
        self.file = self.sock.makefile("rb")
        if hello:
            self.send_obj({"jsonrpc": "2.0", "id": "hello", "method": "hello",
                           "params": {"secret": address.secret}})
            assert "result" in self.read()

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError:
            pass  # closed on us: what it answered first is still readable

    def send_obj(self, obj: dict) -> None:
        self.send(json.dumps(obj).encode() + b"\n")

    def read(self) -> dict | None:
        """The next reply, or None once the bridge closed the connection."""
        try:
            line = self.file.readline(MAX_FRAME_BYTES + 1024)
        except TimeoutError:
            raise AssertionError(f"the bridge sent nothing for {WAIT} s") from None
        except ConnectionResetError:
            return None
        if not line:
            return None
        reply = json.loads(line)
        assert reply.get("jsonrpc") == "2.0" and ("result" in reply) != ("error" in reply), reply
        if "error" in reply:
            err = reply["error"]
            assert isinstance(err.get("code"), int) and isinstance(err.get("message"), str), reply
            assert err["message"].strip(), reply
        return reply

    def close(self) -> None:
        self.file.close()
        self.sock.close()
