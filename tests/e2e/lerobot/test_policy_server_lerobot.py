"""The policy server on the shipped ACT checkpoint: batched answers equal LeRobot's own, row by row.

Runs only where LeRobot is installed (the ``.venv-lerobot`` environment)::

    .venv-lerobot/bin/python -m pytest tests/e2e/lerobot -q -p no:cacheprovider -p no:hud
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Not just "lerobot": with tests/ on sys.path this very folder imports as a namespace package.
pytest.importorskip("lerobot.policies")

from evals.sims.reach import expert_action, make_reach
from conftest import stop
from policykit import serve_waiting, start_server, wait_for, write_atomically
from pytest_hud.agent.lerobot import LeRobotPolicy
from pytest_hud.agent.remote import RemotePolicy
from pytest_hud.core.contract import derive_contract

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[3]
FINAL = REPO / "evals" / "checkpoints" / "reach_act" / "final"


def reach_states(count: int) -> list[np.ndarray]:
    """Distinct reach observations: each seed's reset, two expert steps in."""
    env = make_reach()
    states = []
    for seed in range(count):
        obs, _ = env.reset(seed=seed)
        for _ in range(2):
            obs, *_ = env.step(expert_action(obs["state"]))
        states.append(obs["state"])
    env.close()
    return states


def test_the_server_batches_the_shipped_checkpoint_and_answers_as_lerobot_does(tmp_path):
    # A long window and max batch 8: the eight concurrent requests become one forward of 8.
    proc, announce = start_server(tmp_path, str(FINAL), "--batch-window-ms", "5000", "--max-batch", "8",
                                  timeout=180)
    try:
        states = reach_states(8)
        served: dict[int, np.ndarray] = {}
        errors: list[BaseException] = []
        barrier = threading.Barrier(len(states))

        def caller(index: int) -> None:
            try:
                with RemotePolicy(announce["url"], timeout=60) as policy:
                    policy.connect()  # all connected first: a batch goes once every open one waits
                    barrier.wait(30)
                    served[index] = policy.predict({"state": states[index]}, prompt="")
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=caller, args=(i,)) for i in range(len(states))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
            assert not thread.is_alive(), "a client hung"
        assert errors == []
        with urllib.request.urlopen(f"http://127.0.0.1:{announce['ws']}/stats", timeout=10) as response:
            stats = json.loads(response.read())
        assert stats["batch_sizes"] == {"8": 1} and stats["forwards"] == 1
    finally:
        stop(proc)

    local = LeRobotPolicy.from_checkpoint(FINAL)
    for index, state in enumerate(states):
        expected = local.predict({"state": state})
        assert served[index].dtype == np.float32
        assert served[index].shape == expected.shape == (local.n_action_steps, 2)
        # A batch of 8 and a batch of 1 may round differently in the last bits, nothing more.
        np.testing.assert_allclose(served[index], expected, rtol=1e-5, atol=1e-5)
    # Rows were not mixed up: different observations, different actions.
    assert not np.allclose(served[0], served[1])


# --------------------------------------------------- a server the pool starts before the contract
def reach_contract(state_size: int | None = None) -> dict:
    """The reach sim's contract (its state resized to ``state_size`` numbers, if given)."""
    env = make_reach()
    obs, _ = env.reset(seed=0)
    space = env.observation_space
    if state_size is not None:
        state = gym.spaces.Box(-np.inf, np.inf, (state_size,), np.float32)
        space, obs = gym.spaces.Dict({"state": state}), {"state": np.zeros(state_size, np.float32)}
    contract = derive_contract(space, env.action_space, obs).to_dict()
    env.close()
    return contract


def test_a_waiting_server_loads_its_checkpoint_before_the_contract_comes(tmp_path):
    # The load (torch, LeRobot, the weights) is most of a server's start: it overlaps the sims' boot.
    # A checkpoint whose weights cannot load fails while no contract exists (it used to wait for one).
    broken = tmp_path / "broken"
    shutil.copytree(FINAL, broken)
    (broken / "model.safetensors").write_bytes(b"not safetensors")
    proc, announce, contract = serve_waiting(tmp_path, str(broken))
    try:
        assert proc.wait(120) == 2
        assert "cannot load policy" in proc.stderr.read()
        assert not contract.exists() and not announce.exists()
    finally:
        stop(proc)


def test_a_server_loaded_ahead_checks_the_contract_when_it_comes_and_serves_as_lerobot_does(tmp_path):
    # A contract the checkpoint cannot take: the same refusal as a server given --contract at once.
    (tmp_path / "wrong").mkdir()
    proc, announce, contract = serve_waiting(tmp_path / "wrong", str(FINAL))
    try:
        write_atomically(contract, json.dumps(reach_contract(state_size=5)))
        assert proc.wait(120) == 2
        refused = proc.stderr.read()
    finally:
        stop(proc)
    direct = subprocess.run(
        [sys.executable, "-m", "pytest_hud.serving", "--policy", str(FINAL), "--port", "0",
         "--contract", str(contract)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert direct.returncode == 2
    assert "cannot load policy" in refused and "cannot feed observation.state" in refused
    assert refused.strip().splitlines()[-1] == direct.stderr.strip().splitlines()[-1]

    # The sim's own contract: announced once it comes, then answers as the checkpoint does.
    (tmp_path / "right").mkdir()
    proc, announce, contract = serve_waiting(tmp_path / "right", str(FINAL))
    try:
        time.sleep(0.5)
        assert not announce.exists()  # no contract yet: not serving
        write_atomically(contract, json.dumps(reach_contract()))
        served = wait_for(announce, proc, timeout=120)
        state = reach_states(1)[0]
        with RemotePolicy(served["url"], timeout=60) as policy:
            served = policy.predict({"state": state})
    finally:
        stop(proc)
    expected = LeRobotPolicy.from_checkpoint(FINAL).predict({"state": state})
    np.testing.assert_allclose(served, expected, rtol=1e-5, atol=1e-5)
