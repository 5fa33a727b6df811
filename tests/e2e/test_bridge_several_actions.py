"""Several actions in one frame (``{"actions": [T, *action], "steps": T}``, what a replay sends):
the bridge steps them back to back in every tick mode, one observation frame each, the same bytes
as one action per frame; the frames stop at the episode's end; a frame that is not T actions, a row
the contract refuses, or a frame sent before the last observation fails that slot with the reason;
an agent that reads slower than the bridge writes holds its slot's next actions (the bridge keeps a
bounded share of its frames), and one that never reads fails at the step timeout.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

from conftest import SIMKIT
from pytest_hud.client.bridge import AsyncControlClient, AsyncSlotClient, BridgeError, ControlClient, SlotClient
from pytest_hud.client.protocol import action_frame, actions_frame
from pytest_hud.wire.codec import packb
from simkit import FaultyEnv

pytestmark = pytest.mark.timeout(60)

LANES = ("--vectorization", "processes", "--tick", "lanes")
ACTIONS = np.array([[0.5], [-1.0], [2.0], [0.0], [1.5], [-0.25]], np.float32)


def pendulum_frames(seed: int, actions: np.ndarray) -> list[np.ndarray]:
    env = gym.make("Pendulum-v1")
    return [env.reset(seed=seed)[0]] + [env.step(a)[0] for a in actions]


@pytest.mark.parametrize("args", [
    (),  # one env per slot: ready mode
    ("--tick", "lockstep"),
    ("--vectorization", "processes", "--tick", "lanes"),
], ids=["ready", "lockstep", "lanes"])
def test_a_frame_of_several_actions_steps_them_in_turn_as_single_frames_would(bridge, args):
    """A peer steps one action per frame meanwhile: in lockstep and lanes modes the slot with
    several actions acts again as soon as its frame is sent, so the two step together."""
    if "lanes" in args and (os.cpu_count() or 1) < 2:
        pytest.skip("lanes need two env processes, one per core")
    address = bridge("Pendulum-v1", 2, *args)
    errors: list[BaseException] = []

    def peer():
        try:
            with ControlClient(address) as control:
                claim = control.claim(seed=3)
                with SlotClient(address, claim.token, recv_timeout=20) as ws:
                    got = [ws.first_observation["state"]] + [ws.step(a)["state"] for a in ACTIONS[::-1]]
                np.testing.assert_array_equal(np.array(got), np.array(pendulum_frames(3, ACTIONS[::-1])))
                assert control.result(claim.token)["steps"] == len(ACTIONS)
        except BaseException as exc:  # noqa: BLE001 - reported by the test's thread
            errors.append(exc)

    with ControlClient(address) as control:
        claim = control.claim(seed=8)
        thread = threading.Thread(target=peer)
        with SlotClient(address, claim.token, recv_timeout=20) as ws:
            thread.start()
            frames = [ws.first_observation] + ws.step_many(ACTIONS)
            last = ws.step(np.float32([0.25]))  # one at a time again afterwards
        grade = control.result(claim.token)
    thread.join(30)
    assert not thread.is_alive() and errors == []
    expected = pendulum_frames(8, np.concatenate([ACTIONS, [[0.25]]]).astype(np.float32))
    got = [f["state"] for f in frames] + [last["state"]]
    assert len(got) == len(expected)
    for mine, theirs in zip(got, expected):
        assert mine.tobytes() == theirs.astype(mine.dtype).tobytes()
    assert [f["terminated"] for f in frames[1:]] == [False] * len(ACTIONS)
    assert grade["steps"] == len(ACTIONS) + 1
    env = gym.make("Pendulum-v1")
    env.reset(seed=8)
    total = sum(float(np.float32(env.step(a)[1])) for a in np.concatenate([ACTIONS, [[0.25]]]).astype(np.float32))
    assert grade["total_reward"] == pytest.approx(total, rel=1e-5)


@pytest.mark.parametrize("args", [
    (),
    ("--tick", "lockstep"),
    ("--vectorization", "processes", "--tick", "lanes"),
], ids=["ready", "lockstep", "lanes"])
def test_a_chunk_in_one_frame_renders_the_steps_its_flags_say_are_read(bridge, args):
    """An action chunk sent in one frame with a render flag per action (what the agent loop sends
    of an open-loop chunk: only the last step's images are read): the sim skips the images of
    exactly the steps flagged unread, and the frames are those of one action per frame, flags and
    all. The env counts its draws and stamps each image with the step it was drawn at."""
    if "lanes" in args and (os.cpu_count() or 1) < 2:
        pytest.skip("lanes need two env processes, one per core")
    address = bridge(f"{SIMKIT}:skipping_camera", 2, *args)
    reads = [False, False, True, False, False, True, True, False]
    actions = np.linspace(-1, 1, len(reads), dtype=np.float32)[:, None]
    with ControlClient(address) as control:
        chunked_claim, single_claim = control.claim(seed=2), control.claim(seed=2)
        with SlotClient(address, chunked_claim.token, recv_timeout=20) as ws:
            chunked = ws.step_many(actions, reads)
        with SlotClient(address, single_claim.token, recv_timeout=20) as ws:
            single = [ws.step(a, r) for a, r in zip(actions, reads)]
        stats = control.stats()
    # lanes mode steps a chunk in one call of the env process once it has timed a step (its first
    # call is one step); the other modes make a call a step
    assert stats["ticks"] == 2 * len(reads)
    assert stats["sim_calls"] == (2 + len(reads) if "lanes" in args else 2 * len(reads))
    assert len(chunked) == len(single) == len(reads)
    for mine, theirs in zip(chunked, single):
        assert {k: np.asarray(v).tobytes() for k, v in mine.items()} == \
            {k: np.asarray(v).tobytes() for k, v in theirs.items()}
    # drawn at the reset and at each step flagged read; an unread step keeps the last image
    assert [int(f["drawn"][0]) for f in chunked] == [1 + sum(reads[:i + 1]) for i in range(len(reads))]
    last = [max([0] + [j + 1 for j in range(i + 1) if reads[j]]) for i in range(len(reads))]
    assert [int(f["image"][0, 0, 0]) for f in chunked] == [(2000 + t) % 251 for t in last]


def test_a_whole_episode_in_one_frame(bridge):
    """Pendulum's 200 steps, its time limit in the last frame: a bridge that steps its sim on its
    loop's thread steps one action after another without nesting them (a step per loop turn)."""
    address = bridge("Pendulum-v1", 1)
    actions = np.random.default_rng(0).uniform(-2, 2, (250, 1)).astype(np.float32)
    with ControlClient(address) as control:
        claim = control.claim(seed=4)
        with SlotClient(address, claim.token, recv_timeout=20) as ws:
            frames = ws.step_many(actions)
        assert control.result(claim.token)["steps"] == 200
    assert len(frames) == 200 and frames[-1]["terminated"] and frames[-1]["truncated"]
    assert frames[-1]["state"].tobytes() == pendulum_frames(4, actions[:200])[-1].astype(np.float32).tobytes()


def test_the_asyncio_client_sends_several_actions_too(bridge):
    address = bridge("Pendulum-v1", 1)

    async def go():
        control = await AsyncControlClient.connect(address)
        try:
            claim = await control.claim(seed=8)
            ws = await AsyncSlotClient.connect(address, claim.token, recv_timeout=20)
            try:
                frames = [ws.first_observation] + await ws.step_many(ACTIONS)
            finally:
                await ws.close()
            return frames, await control.result(claim.token)
        finally:
            await control.close()

    frames, grade = asyncio.run(go())
    assert [f["state"].tobytes() for f in frames] == [
        f.astype(np.float32).tobytes() for f in pendulum_frames(8, ACTIONS)]
    assert grade["steps"] == len(ACTIONS)


def test_the_frames_stop_at_the_episodes_end(bridge):
    address = bridge(f"{SIMKIT}:counter", 1)  # episodes of 3 steps
    with ControlClient(address) as control:
        claim = control.claim(seed=5)
        with SlotClient(address, claim.token, recv_timeout=20) as ws:
            frames = ws.step_many(np.zeros((5, 1), np.float32))
        assert [bool(f["terminated"]) for f in frames] == [False, False, True]
        assert control.result(claim.token)["steps"] == 3
        again = control.claim(seed=6)  # the slot serves the next episode as usual
        with SlotClient(address, again.token, recv_timeout=20) as ws:
            assert len(ws.step_many(np.zeros((2, 1), np.float32))) == 2
            assert ws.step(np.zeros(1, np.float32))["terminated"]
        assert control.result(again.token)["steps"] == 3


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="lanes need two env processes, one per core")
def test_a_lanes_run_stops_at_a_fault_or_an_episodes_end_and_its_lane_peers_go_on(bridge):
    """Lanes mode sends the steps a lane's slots have queued to its env process in one run. A run
    stops after the step where an env raised or an episode ended: that episode fails with the
    env's exception (or ends) as after a single step, and the other slots of the lane, whose chunks
    went on past that step, get every frame of their episodes, the same as their envs stepped here."""
    build = {"step_faults": [7], "fault_step": 10, "delay": 0.0}
    address = bridge(f"{SIMKIT}:faulty", 4, "--vectorization", "processes", "--tick", "lanes",
                     "--build-args", json.dumps(build))
    chunk = np.full((20, 1), 0.5, np.float32)  # episodes of 30 steps: the second chunk outlives them
    got, failed = {}, {}

    def play(seed, token):
        try:
            with SlotClient(address, token, recv_timeout=30) as ws:
                frames = [ws.first_observation]
                while not frames[-1]["terminated"]:
                    frames += ws.step_many(chunk)
            got[seed] = ([f["state"].tolist() for f in frames], [bool(f["terminated"]) for f in frames])
        except BridgeError as exc:
            failed[seed] = str(exc)

    with ControlClient(address) as control:
        claims = {seed: control.claim(seed=seed, build=build) for seed in (7, 3, 4, 5)}
        assert {claims[7].slot // 2, claims[3].slot // 2} == {0, 1}  # (claims alternate between the lanes)
        assert claims[7].slot // 2 == claims[4].slot // 2  # the faulty episode shares its lane
        threads = [threading.Thread(target=play, args=(seed, claim.token)) for seed, claim in claims.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        grades = {seed: control.result(claim.token) for seed, claim in claims.items()}
        stats = control.stats()
    assert list(failed) == [7] and "step 10 of seed 7 exploded on purpose" in failed[7]
    assert grades[7]["steps"] == 10
    for seed in (3, 4, 5):
        env = FaultyEnv(delay=0.0)
        expected = [env.reset(seed=seed)[0].tolist()] + [env.step(chunk[0])[0].tolist() for _ in range(30)]
        assert got[seed] == (expected, [False] * 30 + [True]), seed
        assert grades[seed]["steps"] == 30 and grades[seed]["error"] is None
    assert stats["sim_calls"] < stats["ticks"]  # runs of several steps, not a call a step


@pytest.mark.parametrize("frame, reason", [
    (actions_frame(np.float32([[0.5], [np.nan], [0.5]])), "action 1 of 3: "),
    (packb({"actions": np.zeros((3, 1), np.float32), "steps": 2}),
     "a frame of 2 actions has them along its first axis, got an array of shape [3, 1]"),
    (packb({"actions": np.zeros((1, 1), np.float32), "steps": 0}), "'steps' is the number of actions"),
    (packb({"actions": np.zeros((3, 1), np.float32), "steps": 3, "render": [True, False]}),
     "'render' is a bool, or a list of one bool per action (3), got a list of 2 items"),
    (packb({"actions": np.zeros((2, 1), np.float32), "steps": 2, "render": [True, 0]}),
     "'render' is a bool, or a list of one bool per action (2), got a list of 2 items not all bools"),
], ids=["a-bad-row", "steps-and-rows-differ", "no-steps", "render-flags-and-rows-differ", "a-render-flag-not-a-bool"])
def test_a_bad_frame_of_several_actions_fails_its_slot_only(bridge, frame, reason):
    address = bridge("Pendulum-v1", 2)
    with ControlClient(address) as control:
        bad, good = control.claim(seed=1), control.claim(seed=2)
        with SlotClient(address, bad.token, recv_timeout=20) as ws, \
                SlotClient(address, good.token, recv_timeout=20) as peer:
            ws._send(frame)
            with pytest.raises(BridgeError, match=f"slot {bad.slot}: .*" + re.escape(reason)):
                ws.step(np.float32([0.0]))
            assert len(peer.step_many(ACTIONS)) == len(ACTIONS)  # its peer goes on
        assert control.result(bad.token)["steps"] == 0
        assert control.result(good.token)["steps"] == len(ACTIONS)


@pytest.mark.parametrize("args", [(), LANES], ids=["ready", "lanes"])
def test_an_action_sent_before_the_last_observation_of_several_fails_the_slot(bridge, args):
    """(In lanes mode the steps of a run already taken when the action arrives are dropped.)"""
    if "lanes" in args and (os.cpu_count() or 1) < 2:
        pytest.skip("lanes need two env processes, one per core")
    address = bridge(f"{SIMKIT}:slow_pendulum", 2 if args else 1, *args)  # 3 ms a step
    with ControlClient(address) as control:
        claim = control.claim(seed=1)
        with SlotClient(address, claim.token, recv_timeout=20) as ws:
            ws._send(actions_frame(np.zeros((150, 1), np.float32)))  # 0.45 s of steps
            ws._send(action_frame(np.float32([0.0])))
            with pytest.raises(BridgeError, match="an action arrived before the observation of the previous one"):
                for _ in range(151):
                    ws._read(ws._recv(20))
        assert control.result(claim.token)["steps"] < 150


def slot_steps(control, index):
    return next(s["steps"] for s in control.stats()["slots"] if s["slot"] == index)


@pytest.mark.parametrize("args", [(), LANES], ids=["ready", "lanes"])
def test_the_bridge_holds_queued_actions_while_their_agent_reads_slower_than_it_writes(bridge, args):
    """Frames of 196 KB in microseconds each: an agent that has not read yet holds the slot's queued
    actions once its connection's buffers are full (the bridge keeps a bounded share of them, not
    the episode: in lanes mode a run of steps holds a few MB at most), and gets every frame, in
    order, once it reads; its peer steps meanwhile."""
    if "lanes" in args and (os.cpu_count() or 1) < 2:
        pytest.skip("lanes need two env processes, one per core")
    address = bridge(f"{SIMKIT}:big_frames", 2, *args)
    with ControlClient(address) as control:
        slow, quick = control.claim(seed=1), control.claim(seed=2)
        with SlotClient(address, slow.token, recv_timeout=20) as ws, \
                SlotClient(address, quick.token, recv_timeout=20) as peer:
            ws._send(actions_frame(np.zeros((2000, 1), np.float32)))
            held, deadline = -1, time.monotonic() + 15
            while time.monotonic() < deadline:  # until the slot stops stepping (however busy the machine)
                time.sleep(0.5)
                held, before = slot_steps(control, slow.slot), held
                if held == before:
                    break
            assert 0 < held < 200, held  # about the socket's and transport's buffers, in frames
            assert len(peer.step_many(np.zeros((300, 1), np.float32))) == 300  # its peer goes on
            assert slot_steps(control, slow.slot) == held  # still held: nothing read
            frames = [ws._read(ws._recv(20)) for _ in range(2000)]
        assert [int(f["pixels"][0, 0, 0]) for f in frames] == [(t + 1) % 256 for t in range(2000)]
        assert control.result(slow.token)["steps"] == 2000
        assert control.result(quick.token)["steps"] == 300


def test_an_agent_that_never_reads_its_observations_fails_at_the_step_timeout(bridge):
    address = bridge(f"{SIMKIT}:big_frames", 1, "--step-timeout", "1")
    with ControlClient(address) as control:
        claim = control.claim(seed=1)
        with SlotClient(address, claim.token, recv_timeout=20) as ws:
            ws._send(actions_frame(np.zeros((2000, 1), np.float32)))
            time.sleep(2.5)
            grade = control.result(claim.token)
    assert grade["steps"] < 200
    assert "agent read none of its observations within 1 s (--hud-step-timeout)" in grade["error"]
