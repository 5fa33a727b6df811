"""The bridge's tick modes end to end: waves for sims that reset all slots at once, ready and
lanes modes with a silent peer, starting together, and the modes a sim cannot run refused with the fix.
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
