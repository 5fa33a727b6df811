"""One slot's fault never stalls the others: real bridge subprocesses, faults injected on purpose.

A bridge of independent envs (one gymnasium env per slot, in this process or spread over
processes) pins an env's exception on its slot: that episode fails with the exception named, the
env is rebuilt, and the other slots' episodes go on exactly as they would without the fault (their
frames equal the env's own, stepped here without any bridge). A natively batched sim cannot do that:
its exception breaks the bridge, and every live episode hears why at once, not at its timeout.
Claims are checked against what the sim declares before any env is touched, and a claim without a
seed gets one drawn and returned, so the episode can be run again.
"""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from conftest import SIMKIT, run_threads
from pytest_hud.client.bridge import BridgeError, ControlClient, SlotClient
from simkit import FaultyEnv

pytestmark = pytest.mark.timeout(120)

FAULTY = f"{SIMKIT}:faulty"
ACTION = np.array([0.5], np.float32)
LAYOUTS = {
    "lockstep": ["--tick", "lockstep"],
    "ready": ["--tick", "ready"],
    "lanes": ["--vectorization", "processes", "--tick", "lanes"],
}


def reference(seed: int, options: dict | None = None) -> tuple[list[list[float]], float]:
    """Seed ``seed``'s frames and return, stepped here on the env itself (no bridge)."""
    env = FaultyEnv(delay=0.0)
    obs, _ = env.reset(seed=seed, options=options)
    frames, total, done = [obs.tolist()], 0.0, False
    while not done:
        obs, reward, done, _, _ = env.step(ACTION)
        frames.append(obs.tolist())
        total += reward
    return frames, total


def play(served, seed: int | None, **task) -> tuple[list[list[float]], dict]:
    """One whole episode through the bridge: its frames and its grade (raises BridgeError)."""
    with ControlClient(served.address) as control:
        claim = control.claim(seed=seed, build=served.build, **task)
        with SlotClient(served.address, claim.token, recv_timeout=60) as slot:
            frame = slot.first_observation
            frames = [np.asarray(frame["state"]).tolist()]
            while not frame["terminated"]:
                frame = slot.step(ACTION)
                frames.append(np.asarray(frame["state"]).tolist())
        return frames, control.result(claim.token)


def start(bridge, target: str, build: dict, *args: str) -> SimpleNamespace:
    """A bridge of ``target`` built with ``build`` (``.address``, and ``.build`` for its claims)."""
    return SimpleNamespace(address=bridge(target, 2, "--build-args", json.dumps(build), *args), build=build)


def failing(served, seed: int) -> tuple[str, float]:
    """An episode expected to fail: the bridge's message, and when it came (monotonic)."""
    try:
        play(served, seed)
    except BridgeError as exc:
        return str(exc), time.monotonic()
    raise AssertionError(f"the episode of seed {seed} did not fail")


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_an_envs_exception_fails_its_episode_only_and_the_others_run_as_without_it(bridge, layout):
    served = start(bridge, FAULTY, {"reset_faults": [13], "step_faults": [21], "delay": 0.003}, *LAYOUTS[layout])
    got: dict[int, tuple] = {}
    errors: dict[int, str] = {}

    def steady():  # runs while the other slot faults, twice
        got[5] = play(served, 5)

    def faults():
        errors[21], _ = failing(served, 21)  # raises at its 10th step, mid-run
        errors[13], _ = failing(served, 13)  # raises in its reset
        got[7] = play(served, 7)  # then a clean episode, on the rebuilt env or the other slot

    assert run_threads([steady, faults], timeout=90) == []
    for seed in (5, 7):
        frames, grade = got[seed]
        want_frames, want_total = reference(seed)
        assert frames == want_frames, f"seed {seed} was disturbed by its neighbour's fault"
        assert grade["total_reward"] == pytest.approx(want_total) and grade["error"] is None
    assert "env raised during step: RuntimeError: step 10 of seed 21 exploded on purpose" in errors[21]
    assert "env raised during reset: ValueError: reset refused seed 13 on purpose" in errors[13]
    assert "the bridge's other slots go on" in errors[13]
    with ControlClient(served.address) as control:
        stats = control.stats()
    assert stats["broken"] is None and stats["isolates"] and stats["in_service"] == 2
    assert sum(s["faults"] for s in stats["slots"]) == 2 and all(s["service"] is None for s in stats["slots"])


def test_a_natively_batched_sim_that_raises_fails_every_live_episode_at_once(bridge):
    served = start(bridge, f"{SIMKIT}:faulty_counter", {})  # one object steps both slots: nothing to isolate
    told: dict[str, tuple[str, float]] = {}
    running = threading.Event()

    def steady():
        with ControlClient(served.address) as control:
            claim = control.claim(seed=1, build={})
            with SlotClient(served.address, claim.token, recv_timeout=60) as slot:
                running.set()
                try:
                    for _ in range(400):  # the episode lasts 400 steps; the bridge breaks long before
                        slot.step(np.zeros(1, np.float32))
                        time.sleep(0.005)
                except BridgeError as exc:
                    told["steady"] = (str(exc), time.monotonic())

    def breaker():
        assert running.wait(30)
        time.sleep(0.2)
        told["breaker"] = failing(served, 13)

    assert run_threads([steady, breaker], timeout=60) == []
    message, _ = told["steady"]
    # told by the break itself, at once: an episode left to its own clocks would have read "sent
    # nothing for 60 s" (its read timeout), never the breaker's cause
    assert "bridge broken by slot 1's reset: ValueError: reset refused seed 13 on purpose" in message
    assert "sim raised during reset: ValueError: reset refused seed 13" in told["breaker"][0]


def test_a_slot_whose_env_keeps_raising_is_retired_and_the_bridge_runs_on_the_others(bridge):
    served = start(bridge, FAULTY, {"reset_faults": [13]}, "--tick", "ready")
    for _ in range(3):  # the lowest free slot each time: slot 0, rebuilt twice, then retired
        message, _ = failing(served, 13)
        assert "slot 0's env raised during reset" in message
    with ControlClient(served.address) as control:
        stats = control.stats()
    assert stats["in_service"] == 1 and stats["slots"][0]["service"].startswith("retired: its env raised 3 times")
    assert stats["notes"] == ["slot 0 retired: its env raised 3 times (last: ValueError: reset refused seed 13 "
                              "on purpose); the bridge runs on 1 of 2 slots"]
    frames, grade = play(served, 5)  # on slot 1
    assert grade["slot"] == 1 and frames == reference(5)[0]


def test_claims_are_checked_against_the_sims_declared_rules_before_any_env_is_touched(bridge):
    served = start(bridge, FAULTY, {"max_seed": 99})
    with ControlClient(served.address) as control:
        with pytest.raises(BridgeError, match="seed 100 is out of this sim's range: its seeds are 0 to 99"):
            control.claim(seed=100, build=served.build)
        with pytest.raises(BridgeError, match=r"option\(s\) colour are not read by this sim \(it reads: push\)"):
            control.claim(seed=1, options={"colour": "red"}, build=served.build)
        stats = control.stats()
    assert stats["env_steps"] == 0 and all(s["state"] == "free" for s in stats["slots"])
    frames, grade = play(served, 99, options={"push": 0.25})
    assert frames == reference(99, {"push": 0.25})[0]


def test_a_claim_without_a_seed_gets_a_drawn_seed_that_runs_the_same_episode_again(bridge):
    served = start(bridge, FAULTY, {"max_seed": 999})
    with ControlClient(served.address) as control:
        claims = [control.claim(build=served.build) for _ in range(2)]
        for claim in claims:
            control.release(claim.token)
    seeds = [claim.seed for claim in claims]
    assert all(isinstance(s, int) and 0 <= s <= 999 for s in seeds)
    frames, grade = play(served, None)
    assert grade["seed"] is not None and frames == reference(grade["seed"])[0]


def test_a_control_call_to_a_bridge_that_died_says_the_bridge_process_exited(bridge):
    import os
    import signal

    address = bridge(FAULTY, 1)
    with ControlClient(address) as control:
        claim = control.claim(seed=1, build={})
        os.kill(address.pid, signal.SIGKILL)
        with pytest.raises(BridgeError, match=rf"closed the connection.*the bridge process \(pid {address.pid}\) has exited"):
            control.result(claim.token)
