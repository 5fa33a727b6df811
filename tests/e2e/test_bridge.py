"""The bridge end to end: real subprocesses, real sockets on loopback, every wait bounded.

Episodes and slots: each episode's own data and grade, seeds, timeouts, bad actions, sim
exceptions, the Unix socket, a bridge that dies. Ticks, the control channel, sim calls and
vectorization have files of their own (``test_bridge_*.py``).
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

from conftest import SIMKIT, first_obs, run_threads, start_bridge, stop
from pytest_hud.agent import Agent
from pytest_hud.client.bridge import (
    AsyncControlClient, AsyncSlotClient, BridgeAddress, BridgeError, ControlClient, SlotClient,
)
from pytest_hud.client.episode import Episode

pytestmark = pytest.mark.timeout(60)

COUNTER = f"{SIMKIT}:counter"


@pytest.mark.parametrize("layout", [[], ["--io-thread"]], ids=["one-thread", "io-thread"])
def test_two_concurrent_episodes_each_get_their_own_slot_data_and_grade(bridge, layout):
    address = bridge(COUNTER, 2, *layout)
    results = {}
    controls = {seed: ControlClient(address) for seed in (3, 6)}
    claims = {seed: control.claim(seed=seed) for seed, control in controls.items()}  # both held at once

    def episode(seed):
        def go():
            with controls[seed] as control:
                claim = claims[seed]
                seen = []
                with SlotClient(address, claim.token) as slot:
                    frame = slot.first_observation
                    seen.append(frame["state"][0])
                    while not frame["terminated"]:
                        frame = slot.step(np.zeros(1, np.float32))
                        seen.append(frame["state"][0])
                results[seed] = (claim.slot, seen, control.result(claim.token))
        return go

    assert run_threads([episode(3), episode(6)]) == []
    assert {results[3][0], results[6][0]} == {0, 1}
    for seed in (3, 6):
        slot, seen, grade = results[seed]
        assert seen == [seed] * 4  # first observation plus 3 steps, all from its own slot
        assert grade["total_reward"] == pytest.approx(seed)
        assert grade["steps"] == 3 and grade["terminated"]
    assert results[6][2]["success"] and not results[3][2]["success"]


def test_same_seed_gives_the_same_first_observation_on_any_slot_and_width(bridge):
    wide = bridge("Pendulum-v1", 4)
    narrow = bridge("Pendulum-v1", 1)
    expected = gym.make("Pendulum-v1").reset(seed=11)[0]
    # occupy slots 0..2 so that the next claim lands on slot 3
    with ControlClient(wide) as holder:
        for _ in range(3):
            holder.reset(seed=0)
        on_slot3 = first_obs(wide, 11, slot=3)
    on_slot0 = first_obs(wide, 11, slot=0)
    on_width1 = first_obs(narrow, 11, slot=0)
    np.testing.assert_array_equal(on_slot0, expected)
    np.testing.assert_array_equal(on_slot3, expected)
    np.testing.assert_array_equal(on_width1, expected)


def test_mixed_seeds_in_flight_at_once_each_match_a_single_env(bridge):
    address = bridge("CartPole-v1", 3)
    seeds = [5, 17, 5]
    got = {}

    def episode(i, seed):
        def go():
            with ControlClient(address) as control:
                claim = control.claim(seed=seed)
                with SlotClient(address, claim.token) as ws:
                    frames = [np.array(ws.first_observation["state"])]
                    for _ in range(5):
                        frames.append(np.array(ws.step(np.array([1]))["state"]))
                got[i] = frames
                control.result(claim.token)
        return go

    assert run_threads([episode(i, s) for i, s in enumerate(seeds)]) == []
    for i, seed in enumerate(seeds):
        env = gym.make("CartPole-v1")
        ref = [env.reset(seed=seed)[0]] + [env.step(1)[0] for _ in range(5)]
        np.testing.assert_allclose(np.array(got[i]), np.array(ref), rtol=0, atol=0)


def test_a_claimed_but_undialed_slot_is_not_stepped(bridge):
    address = bridge(COUNTER.replace(":counter", ":counter"), 2)
    with ControlClient(address) as idle, ControlClient(address) as busy:
        waiting = idle.reset(seed=9)
        active = busy.reset(seed=2)
        with SlotClient(address, active.token) as ws:
            frame = ws.first_observation
            while not frame["terminated"]:
                frame = ws.step(np.zeros(1, np.float32))
        busy.result(active.token)
        # the peer ran a whole episode meanwhile; the waiting slot starts fresh when it dials
        with SlotClient(address, waiting.token) as ws:
            np.testing.assert_array_equal(ws.first_observation["state"], [9.0, 0.0])
        assert idle.result(waiting.token)["steps"] == 0


@pytest.mark.parametrize("layout", [[], ["--io-thread"]], ids=["one-thread", "io-thread"])
def test_a_silent_slot_times_out_while_its_peer_finishes(bridge, layout):
    address = bridge(COUNTER, 2, "--step-timeout", "1", "--first-action-timeout", "1", *layout)
    with ControlClient(address) as a, ControlClient(address) as b:
        silent, active = a.reset(seed=1), b.reset(seed=2)
        with SlotClient(address, silent.token) as quiet, SlotClient(address, active.token) as ws:
            frame = ws.first_observation
            while not frame["terminated"]:  # every step answered (recv_timeout bounds each wait)
                frame = ws.step(np.zeros(1, np.float32))
            with pytest.raises(BridgeError, match=r"sent no first action within 1 s"):
                quiet.step(np.zeros(1, np.float32))
        assert b.result(active.token)["steps"] == 3
        grade = a.result(silent.token)
        assert "no first action" in grade["error"] and grade["steps"] == 0


def test_a_wrong_shape_action_fails_that_slot_only(bridge):
    address = bridge(COUNTER, 2)
    with ControlClient(address) as a, ControlClient(address) as b:
        bad, good = a.reset(seed=1), b.reset(seed=2)
        with SlotClient(address, bad.token) as wrong, SlotClient(address, good.token) as right:
            with pytest.raises(BridgeError, match=r"action of shape \(3,\), contract says \(1,\)"):
                wrong.step(np.zeros(3, np.float32))
            frame = right.first_observation
            while not frame["terminated"]:
                frame = right.step(np.zeros(1, np.float32))
        assert b.result(good.token)["steps"] == 3
        assert "shape" in a.result(bad.token)["error"]


def test_closing_a_control_connection_frees_its_claims(bridge):
    address = bridge(COUNTER, 1)
    control = ControlClient(address)
    control.claim(seed=1)
    control.close()
    with ControlClient(address) as other:
        deadline = time.monotonic() + 5
        while other.stats()["slots"][0]["state"] != "free":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert other.reset(seed=2, wait=5).slot == 0


def test_a_sim_exception_sends_error_frames_and_marks_the_bridge_broken(bridge, tmp_path):
    factory = tmp_path / "exploding.py"
    factory.write_text(
        f"import sys; sys.path.insert(0, {str(SIMKIT.parent)!r})\n"
        "from simkit import CounterSim\n"
        "def make(num_envs):\n    return CounterSim(num_envs, length=10, explode_at=2)\n"
    )
    address = bridge(f"{factory}:make", 2)
    with ControlClient(address) as a, ControlClient(address) as b:
        ca, cb = a.reset(seed=1), b.reset(seed=2)
        errors = []

        def drive(claim):
            def go():
                try:  # a slot that dials after the explosion is refused at once, also with the reason
                    with SlotClient(address, claim.token) as ws:
                        for _ in range(5):
                            ws.step(np.zeros(1, np.float32))
                except BridgeError as exc:
                    errors.append(str(exc))
            return go

        assert run_threads([drive(ca), drive(cb)]) == []
        assert len(errors) == 2 and all("exploded on purpose" in e for e in errors)
        stats = a.stats()
        assert "exploded on purpose" in stats["broken"]
        with pytest.raises(BridgeError, match="bridge is broken"):
            a.reset(seed=3, wait=5)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract Unix sockets are Linux's")
def test_slot_clients_on_the_bridges_host_take_its_unix_socket_and_see_the_same_episode(bridge):
    address = bridge("Pendulum-v1", 1)
    assert address.ws_unix and address.ws_unix.startswith("@pytest-hud-ws-")
    zero = np.zeros(1, np.float32)
    runs = {}
    with ControlClient(address) as control:
        for via in (address, dataclasses.replace(address, ws_unix=None)):
            claim = control.claim(seed=7)
            with SlotClient(via, claim.token, recv_timeout=20) as ws:
                runs[ws._ws._sock.family] = [ws.first_observation["state"].tolist()] + [
                    ws.step(zero)["state"].tolist() for _ in range(20)]
            control.result(claim.token)
    assert set(runs) == {socket.AF_UNIX, socket.AF_INET}
    assert runs[socket.AF_UNIX] == runs[socket.AF_INET]

    async def asyncio_run(via):  # the asyncio client takes the Unix socket the same way
        control = await AsyncControlClient.connect(via)
        claim = await control.claim(seed=7)
        slot = await AsyncSlotClient.connect(via, claim.token, recv_timeout=20)
        family = slot._ws.transport.get_extra_info("socket").family
        states = [slot.first_observation["state"].tolist()] + [
            (await slot.step(zero))["state"].tolist() for _ in range(20)]
        await slot.close()
        await control.result(claim.token)
        await control.close()
        return family, states

    assert asyncio.run(asyncio_run(address)) == (socket.AF_UNIX, runs[socket.AF_UNIX])

    with socket.socket() as probe:  # a port nothing listens on: the bridge has exited
        probe.bind(("127.0.0.1", 0))
        gone = dataclasses.replace(address, ws=probe.getsockname()[1], ws_unix="@pytest-hud-ws-0-exited")
    with pytest.raises(BridgeError, match=r"cannot reach the bridge's slot WebSocket at ws://127\.0\.0\.1:\d+: .*"
                                          r"refused \(nothing listens there: has the bridge exited\?\)"):
        SlotClient(gone, "token", connect_timeout=5)
    assert asyncio.run(asyncio_run(dataclasses.replace(address, ws_unix="@pytest-hud-ws-0-gone"))) == (
        socket.AF_INET, runs[socket.AF_UNIX])

    # A Unix socket that refuses the upgrade: the error names it, not the TCP address not dialled.
    name = f"@pytest-hud-test-refuses-{threading.get_ident()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as refuser:
        refuser.bind("\0" + name[1:])
        refuser.listen(4)

        def refuse() -> None:
            for _ in range(2):
                conn, _ = refuser.accept()
                with conn:
                    conn.recv(65536)
                    conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")

        threading.Thread(target=refuse, daemon=True).start()
        refused = dataclasses.replace(address, ws_unix=name)
        where = rf"cannot reach the bridge's slot WebSocket at {name}: .*503"
        with pytest.raises(BridgeError, match=where):
            SlotClient(refused, "token", connect_timeout=5)
        with pytest.raises(BridgeError, match=where):
            asyncio.run(AsyncSlotClient.connect(refused, "token", connect_timeout=5))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract Unix sockets and /proc are Linux's")
def test_both_slot_clients_say_the_bridge_exited_when_it_dies_mid_episode(bridge):
    zero = np.zeros(1, np.float32)
    exited = r"without an error frame: the bridge process \(pid \d+\) has exited"

    address = bridge("Pendulum-v1", 1)
    with ControlClient(address) as control, \
            SlotClient(address, control.claim(seed=1).token, recv_timeout=20) as slot:
        slot.step(zero)
        bridge.processes[-1].kill()
        with pytest.raises(BridgeError, match=exited):
            for _ in range(3):
                slot.step(zero)

    address = bridge("Pendulum-v1", 1)

    async def asyncio_run():
        control = await AsyncControlClient.connect(address)
        slot = await AsyncSlotClient.connect(address, (await control.claim(seed=1)).token, recv_timeout=20)
        await slot.step(zero)
        bridge.processes[-1].kill()
        with pytest.raises(BridgeError, match=exited):
            for _ in range(3):
                await slot.step(zero)
        await slot.close()
        await control.close()

    asyncio.run(asyncio_run())


def test_cartpole_with_discrete_actions_runs_an_episode(bridge):
    address = bridge("CartPole-v1", 2)
    with ControlClient(address) as control:
        contract = control.contract()
        assert contract.action.type == "discrete"
        free = signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)
        agent = Agent(lambda obs: int(obs["state"][2] + 0.5 * obs["state"][3] > 0),
                      first_action_timeout=60.0, step_timeout=30.0)
        result = agent.run(Episode(control, contract, seed=1), max_steps=200)
    assert result.steps == 200 and result.total_reward == 200.0 and result.error is None
    if free:  # the watchdog watched every step with one timer; the episode's end stopped it
        assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


SLOW_RESET = '''
import time

import gymnasium as gym


class SlowReset(gym.Wrapper):
    def reset(self, **kwargs):
        time.sleep(1.5)  # a LIBERO env built for a new task on a busy machine: tens of seconds
        return self.env.reset(**kwargs)


def slow_reset():
    return SlowReset(gym.make("CartPole-v1"))
'''


def test_a_first_observation_may_take_longer_than_connecting(tmp_path):
    # The first observation comes after the slot's reset: it is bounded by the observation timeout,
    # not by the connection's, in the blocking and the asyncio client alike.
    from pytest_hud.client.bridge import AsyncSlotClient, ControlClient, SlotClient

    (tmp_path / "slow_sims.py").write_text(SLOW_RESET)
    proc, address = start_bridge(tmp_path, f"{tmp_path / 'slow_sims.py'}:slow_reset", 1, "--vectorization", "sync")
    try:
        with ControlClient(address) as control:
            claim = control.claim(seed=1)
            with SlotClient(address, claim.token, connect_timeout=0.5, recv_timeout=30) as ws:
                assert ws.first_observation["state"].shape == (4,)
            control.release(claim.token)

            async def first() -> tuple:
                claim = control.claim(seed=2)
                client = await AsyncSlotClient.connect(address, claim.token, connect_timeout=0.5, recv_timeout=30)
                try:
                    return client.first_observation["state"].shape
                finally:
                    await client.close()
                    control.release(claim.token)

            assert asyncio.run(first()) == (4,)
    finally:
        stop(proc)
