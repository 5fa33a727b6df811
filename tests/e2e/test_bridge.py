"""The bridge end to end: real subprocesses, real sockets on loopback, every wait bounded."""

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

from conftest import SIMKIT, run_threads
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


def first_obs(address, seed, slot=None):
    with ControlClient(address) as control:
        claim = control.claim(seed=seed)
        if slot is not None:
            assert claim.slot == slot
        with SlotClient(address, claim.token) as ws:
            obs = np.array(ws.first_observation["state"])
        control.release(claim.token)
    return obs


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
            t0 = time.monotonic()
            frame = ws.first_observation
            while not frame["terminated"]:
                frame = ws.step(np.zeros(1, np.float32))
            assert time.monotonic() - t0 < 10
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


def test_wave_fallback_claims_wait_for_the_next_global_reset(bridge):
    """Seeds 3 and 6 claim first (one wave, or two if the second came after the first's reset);
    7 claims once both hold their slots, while a slot of the running wave may already be free.
    Its claim returns only after the wave's last episode was graded: 6 dawdles before grading,
    so a claim that took 3's freed slot at once would come back before 6's grading began."""
    address = bridge(f"{SIMKIT}:counter_waves", 2)
    events: dict[tuple[str, int], float] = {}
    first_claims = threading.Semaphore(0)

    def episode(seed, dawdle=0.0):
        def go():
            if seed == 7:  # after 3 and 6 both claimed
                for _ in range(2):
                    assert first_claims.acquire(timeout=20)
                events["asked", 7] = time.monotonic()
            with ControlClient(address) as control:
                claim = control.claim(seed=seed, wait=20)
                events["claimed", seed] = time.monotonic()
                if seed != 7:
                    first_claims.release()
                with SlotClient(address, claim.token) as ws:
                    frame = ws.first_observation
                    assert frame["state"][0] == seed
                    while not frame["terminated"]:
                        frame = ws.step(np.zeros(1, np.float32))
                time.sleep(dawdle)  # its slot stays taken (done, not graded) meanwhile
                events["grading", seed] = time.monotonic()  # before result() frees the slot
                assert control.result(claim.token)["total_reward"] == pytest.approx(seed)
        return go

    assert run_threads([episode(3), episode(6, dawdle=1.0), episode(7)]) == []
    assert events["asked", 7] >= max(events["claimed", 3], events["claimed", 6])
    # the next wave (7's) was reset only once every episode of the earlier one was over
    assert events["claimed", 7] > events["grading", 6] > events["claimed", 6], events
    assert events["claimed", 7] > events["grading", 3] > events["claimed", 3], events


def run_to_the_end(address, control, claim, seed, pause: float = 0.0):
    """Step an all_at_once episode to its end, checking that every frame is still its own."""
    with SlotClient(address, claim.token, recv_timeout=20) as ws:
        frame = ws.first_observation
        while not frame["terminated"]:
            assert frame["state"][0] == seed, "another slot's reset reached this live episode"
            time.sleep(pause)
            frame = ws.step(np.zeros(1, np.float32))
    grade = control.result(claim.token)
    assert (grade["steps"], grade["total_reward"]) == (seed, seed)


def test_a_wave_episode_that_ends_first_does_not_reset_its_live_peer(bridge):
    address = bridge(f"{SIMKIT}:all_at_once", 2)

    def episode(seed):
        def go():
            with ControlClient(address) as control:
                run_to_the_end(address, control, control.claim(seed=seed, wait=20), seed)
        return go

    assert run_threads([episode(2), episode(5)]) == []


def test_a_claim_during_a_running_wave_waits_for_its_end(bridge):
    address = bridge(f"{SIMKIT}:all_at_once", 2)
    with ControlClient(address) as first, ControlClient(address) as late:
        claim = first.reset(seed=5, wait=20)  # its wave is reset; its agent dials below
        errors: list[BaseException] = []

        def claim_late():
            try:
                run_to_the_end(address, late, late.reset(seed=3, wait=20), 3)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        thread = threading.Thread(target=claim_late)
        thread.start()
        run_to_the_end(address, first, claim, 5, pause=0.03)  # a next wave now would reset it
        thread.join(30)
        assert not thread.is_alive() and errors == []


@pytest.mark.parametrize("args, tick", [
    ((), "ready"),  # one env per slot: auto picks ready
    (("--vectorization", "processes", "--tick", "lanes"), "lanes"),  # one env process per slot here
    (("--vectorization", "processes", "--tick", "lanes", "--io-thread"), "lanes"),
], ids=["ready", "lanes", "lanes-io-thread"])
def test_an_episode_runs_while_a_peer_is_silent_in_ready_and_lanes_modes(bridge, args, tick):
    if tick == "lanes" and (os.cpu_count() or 1) < 2:
        pytest.skip("lanes need two env processes, one per core")
    address = bridge("Pendulum-v1", 2, *args)
    env = gym.make("Pendulum-v1")
    expected = [env.reset(seed=8)[0]] + [env.step(np.float32([0.5]))[0] for _ in range(5)]
    with ControlClient(address) as a, ControlClient(address) as b:
        assert a.stats()["tick"] == tick
        silent, quick = a.reset(seed=1), b.reset(seed=8)
        with SlotClient(address, silent.token) as warming_up, \
                SlotClient(address, quick.token, recv_timeout=20) as ws:
            frames = [ws.first_observation["state"]]
            for _ in range(5):  # under lockstep the first step would wait for the silent peer
                frames.append(ws.step(np.float32([0.5]))["state"])
            np.testing.assert_array_equal(np.array(frames), np.array(expected))
            stats = b.stats()
            assert stats["slot_steps"] == stats["env_steps"] == 5  # the silent slot was never stepped
            warming_up.step(np.float32([0.0]))
            for _ in range(3):  # both step now
                ws.step(np.float32([0.5]))
                warming_up.step(np.float32([0.0]))
        assert b.result(quick.token)["steps"] == 8 and a.result(silent.token)["steps"] == 4
        again = a.reset(seed=8)  # a reset after those steps (lanes: the env processes' pipes are in order)
        with SlotClient(address, again.token, recv_timeout=20) as ws:
            np.testing.assert_array_equal(ws.first_observation["state"], expected[0])
            np.testing.assert_array_equal(ws.step(np.float32([0.5]))["state"], expected[1])
        a.result(again.token)


def test_start_together_holds_a_first_observation_until_the_peer_starts_or_the_window_closes(bridge):
    address = bridge("Pendulum-v1", 2, "--start-together", "2", "--start-window", "60")
    env = gym.make("Pendulum-v1")
    first = {seed: env.reset(seed=seed)[0] for seed in (1, 2)}
    with ControlClient(address) as a, ControlClient(address) as b:
        assert a.stats()["start_together"] == 2
        early = a.reset(seed=1)
        got: dict[int, np.ndarray] = {}

        def connect(token: str, seed: int) -> None:
            with SlotClient(address, token, recv_timeout=20) as ws:
                got[seed] = ws.first_observation["state"]
                ws.step(np.float32([0.0]))

        thread = threading.Thread(target=connect, args=(early.token, 1))
        thread.start()
        deadline = time.monotonic() + 20
        while b.stats()["starts_held"] != 1:  # reset, and held back: its peer has not started
            assert time.monotonic() < deadline and thread.is_alive()
            time.sleep(0.02)
        assert got == {}
        connect(b.reset(seed=2).token, 2)  # the second start releases both
        thread.join(20)
        assert not thread.is_alive() and got.keys() == {1, 2}
        for seed in (1, 2):
            np.testing.assert_array_equal(got[seed], first[seed])
    alone = bridge("Pendulum-v1", 2, "--start-together", "2", "--start-window", "0.2")
    with ControlClient(alone) as c:  # nobody joins: the window starts it
        with SlotClient(alone, c.reset(seed=1).token, recv_timeout=20) as ws:
            np.testing.assert_array_equal(ws.first_observation["state"], first[1])
        assert c.stats()["starts_held"] == 0


def test_lanes_mode_is_refused_on_a_one_process_sim_with_the_fix():
    out = subprocess.run([sys.executable, "-m", "pytest_hud.sim", "Pendulum-v1", "--width", "2",
                          "--vectorization", "sync", "--tick", "lanes"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "tick mode 'lanes' needs a sim whose slots step in several processes at once" in out.stderr


def test_ready_mode_is_refused_on_a_natively_batched_sim_with_the_fix():

    out = subprocess.run([sys.executable, "-m", "pytest_hud.sim", COUNTER, "--tick", "ready"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "this sim steps all its slots in one batched call; use --hud-tick=auto" in out.stderr
    assert "(a bridge started by hand: --tick)" in out.stderr


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
        t0 = time.monotonic()
        with pytest.raises(BridgeError, match="closed"):
            ws.step(np.zeros(1, np.float32))
        assert time.monotonic() - t0 < 5
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


def test_async_vectorization_serves_episodes_too(bridge):
    address = bridge("Pendulum-v1", 2, "--vectorization", "async")
    expected = gym.make("Pendulum-v1").reset(seed=4)[0]
    np.testing.assert_array_equal(first_obs(address, 4), expected)


def test_threads_vectorization_serves_each_slot_what_a_single_env_does(bridge):
    address = bridge("Pendulum-v1", 3, "--vectorization", "threads")
    env = gym.make("Pendulum-v1")
    expected = [env.reset(seed=6)[0]] + [env.step(np.full(1, 0.5, np.float32))[0] for _ in range(4)]
    with ControlClient(address) as control:
        assert control.stats()["tick"] == "ready"  # independent envs: auto ticks per slot
        claim = control.claim(seed=6)
        with SlotClient(address, claim.token) as ws:
            got = [ws.first_observation["state"]] + [ws.step(np.full(1, 0.5, np.float32))["state"]
                                                     for _ in range(4)]
    np.testing.assert_array_equal(np.array(got), np.array(expected))


def test_async_vectorization_of_a_factory_in_a_file_builds_its_envs_in_the_worker_processes(bridge, tmp_path):
    """The factory lives in a module only the bridge process has loaded (from a file path): the
    async vector env's worker processes load it themselves."""
    (tmp_path / "my_envs.py").write_text(
        "import gymnasium as gym\n"
        "def pendulum(g=10.0):\n    return gym.make('Pendulum-v1', g=g)\n")
    address = bridge(f"{tmp_path / 'my_envs.py'}:pendulum", 2, "--vectorization", "async",
                     "--build-args", '{"g": 9.81}')
    env = gym.make("Pendulum-v1", g=9.81)
    expected = [env.reset(seed=4)[0]] + [env.step(np.ones(1, np.float32))[0] for _ in range(3)]
    with ControlClient(address) as control:
        claim = control.claim(seed=4, build={"g": 9.81})
        with SlotClient(address, claim.token) as ws:
            got = [ws.first_observation["state"]] + [ws.step(np.ones(1, np.float32))["state"] for _ in range(3)]
    np.testing.assert_allclose(np.array(got), np.array(expected), rtol=1e-6)


def test_an_unknown_target_exits_with_a_clear_error():

    out = subprocess.run([sys.executable, "-m", "pytest_hud.sim", "NoSuchEnv-v0"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "unknown sim target 'NoSuchEnv-v0'" in out.stderr


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


def test_processes_vectorization_serves_each_slot_what_a_single_env_does_and_leaves_no_process(bridge):
    import psutil

    address = bridge("Pendulum-v1", 3, "--vectorization", "processes")
    env = gym.make("Pendulum-v1")
    expected = [env.reset(seed=6)[0]] + [env.step(np.full(1, 0.5, np.float32))[0] for _ in range(4)]
    with ControlClient(address) as control:
        assert control.stats()["tick"] == "ready"
        pid = control.stats()["pid"]
        claim = control.claim(seed=6)
        with SlotClient(address, claim.token) as ws:
            got = [ws.first_observation["state"]] + [ws.step(np.full(1, 0.5, np.float32))["state"]
                                                     for _ in range(4)]
    np.testing.assert_array_equal(np.array(got), np.array(expected))
    children = psutil.Process(pid).children()  # the env processes, and multiprocessing's resource tracker
    blocks = [c for c in children if "spawn_main" in " ".join(c.cmdline())]
    assert len(blocks) == min(3, len(__import__("os").sched_getaffinity(0)))
    psutil.Process(pid).kill()  # the bridge dies without closing them: they notice and exit
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, [p.cmdline() for p in alive]


def test_check_threads_passes_an_env_that_is_the_same_on_threads_and_names_the_first_difference_otherwise():
    def check(target):
        return subprocess.run([sys.executable, "-m", "pytest_hud.sim", target, "--width", "3",
                               "--check-threads", "40"], capture_output=True, text=True, timeout=120)

    same = check("Pendulum-v1")
    assert same.returncode == 0, same.stderr
    assert "40 ticks at width 3 identical with --vectorization sync and threads" in same.stdout
    differs = check(f"{SIMKIT}:thread_dependent")
    assert differs.returncode == 1
    assert ("observation 'state' differs at tick 0, slot(s) [0, 1, 2] between --vectorization sync and threads: "
            "this env is not safe to step on several threads at once; use sync or processes") in differs.stderr
    bad = subprocess.run([sys.executable, "-m", "pytest_hud.sim", "Pendulum-v1", "--check-threads", "0"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--check-threads takes a number of ticks >= 1, got 0" in bad.stderr
