"""How the bridge runs its sim's calls end to end: a call longer than the step timeout, asyncio and
uvloop, an action sent too early, a sim with an event loop of its own (the I/O thread).
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


SLOW_RESET = f"""
import sys, time
sys.path.insert(0, {str(SIMKIT.parent)!r})
from simkit import CounterSim

class SlowReset(CounterSim):
    def reset_slots(self, indices, seeds, options):
        if 99 in seeds:
            time.sleep(2.5)  # longer than the step timeout: the serving loop is blocked meanwhile
        return super().reset_slots(indices, seeds, options)

def make(num_envs):
    return SlowReset(num_envs, length=10**6)
"""


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_sim_call_longer_than_the_step_timeout_fails_no_slot_whose_action_came_in_meanwhile(
        bridge, tmp_path, monkeypatch, loop):
    """With the loop on the sim's thread, a 2.5 s reset blocks it past a live slot's 1 s deadline;
    that slot answered in time, so it must not be failed when the loop wakes (libuv runs due timers
    before it reads sockets: the bridge reads them first)."""
    if loop == "uvloop":
        pytest.importorskip("uvloop", reason="uvloop is the optional pytest-hud[fast] extra")
    monkeypatch.setenv("PYTEST_HUD_LOOP", loop)
    (tmp_path / "slow.py").write_text(SLOW_RESET)
    address = bridge(f"{tmp_path / 'slow.py'}:make", 2, "--step-timeout", "1", "--tick", "lockstep")
    with ControlClient(address) as a, ControlClient(address) as b:
        live, started = a.reset(seed=1), threading.Event()
        frames: list = []

        def keep_stepping():  # a steps back to back, before, during and after b's slow reset
            with SlotClient(address, live.token, recv_timeout=10) as ws:
                for i in range(400):
                    frames.append(ws.step(np.zeros(1, np.float32)))
                    if i == 20:
                        started.set()

        def join_slowly():
            assert started.wait(10)
            slow = b.reset(seed=99)
            with SlotClient(address, slow.token, recv_timeout=10) as ws:  # its reset blocks the loop 2.5 s
                for _ in range(10):
                    ws.step(np.zeros(1, np.float32))

        assert run_threads([keep_stepping, join_slowly], timeout=60) == []
        assert list(frames[-1]["state"]) == [1, 400]
        assert a.result(live.token)["error"] is None


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_the_bridge_serves_the_same_episode_on_asyncio_and_on_uvloop(bridge, monkeypatch, loop):
    if loop == "uvloop":
        pytest.importorskip("uvloop", reason="uvloop is the optional pytest-hud[fast] extra")
    monkeypatch.setenv("PYTEST_HUD_LOOP", loop)
    address = bridge("Pendulum-v1", 2)
    assert json.loads(json.dumps(ControlClient(address).stats()))["width"] == 2
    with ControlClient(address) as control:
        claim = control.claim(seed=5)
        with SlotClient(address, claim.token) as slot:
            states = [slot.first_observation["state"]]
            for _ in range(5):
                states.append(slot.step(np.full(1, 0.5, np.float32))["state"])
        grade = control.result(claim.token)
    env = gym.make("Pendulum-v1")
    obs, _ = env.reset(seed=5)
    expected = [obs] + [env.step(np.full(1, 0.5, np.float32))[0] for _ in range(5)]
    np.testing.assert_allclose(np.array(states), np.array(expected), rtol=1e-6)
    assert grade["steps"] == 5


def test_an_action_sent_before_the_last_observation_fails_that_slot_readably(bridge):
    from websockets.sync.client import connect

    from pytest_hud.wire.codec import packb, unpackb

    address = bridge(COUNTER, 2)
    with ControlClient(address) as control:
        mine, peer = control.claim(seed=1), control.claim(seed=2)
        with SlotClient(address, peer.token), connect(address.ws_url, compression=None) as ws:
            # the peer is live and silent, so the tick holds our first action...
            unpackb(ws.recv(timeout=10))  # metadata
            ws.send(packb({"claim": mine.token}))
            unpackb(ws.recv(timeout=10))  # first observation
            action = packb({"actions": np.zeros(1, np.float32)})
            ws.send(action)
            ws.send(action)  # ...and this one comes before its observation could have
            message = ws.recv(timeout=10)
        assert isinstance(message, str) and "one action per observation" in message


OWN_LOOP_SIM = f"""
import asyncio, sys
sys.path.insert(0, {str(SIMKIT.parent)!r})
from simkit import CounterSim

class OwnLoop(CounterSim):
    def step(self, actions):  # e.g. a sim that drives a remote simulator with an asyncio client
        async def remote():
            return CounterSim.step(self, actions)
        return asyncio.run(remote())

def make(num_envs):
    return OwnLoop(num_envs, length=3)
"""


@pytest.mark.parametrize("layout", [[], ["--io-thread"]], ids=["one-thread", "io-thread"])
def test_a_sim_that_runs_its_own_event_loop_needs_the_io_thread_and_says_so(bridge, tmp_path, layout):
    (tmp_path / "own_loop.py").write_text(OWN_LOOP_SIM)
    address = bridge(f"{tmp_path / 'own_loop.py'}:make", 1, *layout)
    with ControlClient(address) as control:
        claim = control.claim(seed=2)
        with SlotClient(address, claim.token) as ws:
            if not layout:  # the serving loop runs on the sim's thread: asyncio.run refuses
                with pytest.raises(BridgeError, match="asyncio event loop of its own.*--hud-io-thread"):
                    ws.step(np.zeros(1, np.float32))
                return
            frame = ws.first_observation
            while not frame["terminated"]:
                frame = ws.step(np.zeros(1, np.float32))
        assert control.result(claim.token)["steps"] == 3
