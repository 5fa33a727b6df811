"""The policy server on the shipped ACT checkpoint: batched answers equal LeRobot's own, row by row.

Runs only where LeRobot is installed (the ``.venv-lerobot`` environment)::

    .venv-lerobot/bin/python -m pytest tests/lerobot -q -p no:cacheprovider -p no:hud
"""

from __future__ import annotations

import json
import os
import threading
import urllib.request
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Not just "lerobot": with tests/ on sys.path this very folder imports as a namespace package.
pytest.importorskip("lerobot.policies")

from evals.sims.reach import expert_action, make_reach
from conftest import stop
from policykit import start_server
from pytest_hud.agent.lerobot import LeRobotPolicy
from pytest_hud.agent.remote import RemotePolicy

pytestmark = pytest.mark.timeout(240)

FINAL = Path(__file__).resolve().parents[2] / "evals" / "checkpoints" / "reach_act" / "final"


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
