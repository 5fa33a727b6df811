"""A factory of expensive, rendering envs declares its layout, and ``auto`` follows it.

A ``num_envs`` factory runs as it is under ``auto`` (``sync``), unless it declares
``hud_vectorization = "processes"`` (LIBERO's does): then a bridge of two or more slots on two or
more cores steps its envs in one process per core, built only there, whether the bridge is started
by hand (``python -m pytest_hud.bridge``, whose default is ``auto``) or by the plugin (the same
loader with the same default); the episodes are those of ``sync``.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import start_bridge, stop

from pytest_hud.client.bridge import ControlClient, SlotClient
from pytest_hud.sim.target import load_sim

pytestmark = pytest.mark.timeout(300)

FACTORIES = '''
import gymnasium as gym
from pytest_hud.sim import MultiTaskSim


def make_env(task):
    return gym.make("CartPole-v1")


def declared(num_envs):
    return MultiTaskSim(num_envs, ["pole"], make_env)


declared.hud_vectorization = "processes"


def plain(num_envs):
    return MultiTaskSim(num_envs, ["pole"], make_env)
'''


@pytest.fixture
def factories(tmp_path):
    path = tmp_path / "factories.py"
    path.write_text(FACTORIES)
    return path


def test_auto_puts_a_declared_factorys_envs_in_processes_and_leaves_others_as_they_are(factories, monkeypatch):
    monkeypatch.setattr("pytest_hud.sim.threads.default_threads", lambda width: 2)  # as on 2 cores
    declared = load_sim(f"{factories}:declared", 2, "auto")
    try:
        assert declared.vectorization == "processes"
        assert "auto chose processes" in declared.auto_choice and "hud_vectorization" in declared.auto_choice
    finally:
        declared.close()
    for target, width, asked in ((f"{factories}:plain", 2, "auto"), (f"{factories}:declared", 1, "auto"),
                                 (f"{factories}:declared", 2, "sync")):
        sim = load_sim(target, width, asked)
        try:
            assert sim.vectorization == "native" and sim.auto_choice is None, (target, width, asked)
        finally:
            sim.close()


def episode(address, seed):
    with ControlClient(address) as control:
        claim = control.claim(seed=seed)
        with SlotClient(address, claim.token) as ws:
            frames = [ws.first_observation["state"].copy()]
            for t in range(20):
                frame = ws.step(np.int64(t % 2))
                frames.append(frame["state"].copy())
                if frame["terminated"]:
                    break
        control.result(claim.token)
    return frames


def test_a_bridge_started_by_hand_follows_the_declaration_with_the_same_episodes(factories, tmp_path):
    runs, said = {}, {}
    for asked in ("auto", "sync"):
        before = set(tmp_path.glob("bridge-*.log"))
        proc, address = start_bridge(tmp_path, f"{factories}:declared", 2, "--vectorization", asked,
                                     timeout=120)
        try:
            runs[asked] = [episode(address, seed) for seed in (3, 4)]
        finally:
            stop(proc)
        log, = set(tmp_path.glob("bridge-*.log")) - before
        said[asked] = log.read_text()
    assert "--vectorization auto chose processes" in said["auto"]  # the bridge's own note (stderr)
    assert "auto chose" not in said["sync"]
    for a, b in zip(runs["auto"], runs["sync"], strict=True):
        np.testing.assert_array_equal(np.array(a), np.array(b))
