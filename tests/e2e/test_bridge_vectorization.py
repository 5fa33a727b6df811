"""The bridge's vectorizations end to end (async, threads, processes): each slot serves what a
single env does, and no process is left behind.
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
