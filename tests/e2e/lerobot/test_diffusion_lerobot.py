"""LeRobot's Diffusion Policy end to end: the shipped checkpoint in the workers and behind the policy
server (same episodes), recorded as a LeRobot dataset, and gated against its committed baseline
(passes; one denoising step instead of ten is a regression).

Needs LeRobot with ``diffusers`` (0.4.4, or 0.6.1 with its ``diffusion`` extra); skipped with the
reason otherwise. Real bridges, real LeRobot policies and servers, the real gate.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Not just "lerobot": with tests/ on sys.path this very folder imports as a namespace package.
pytest.importorskip("lerobot.policies", reason="LeRobot is not installed: pip install 'pytest-hud[lerobot]'")
if importlib.util.find_spec("diffusers") is None:
    pytest.skip("diffusers is not installed (LeRobot's Diffusion Policy needs it): "
                "pip install 'lerobot[diffusion]'", allow_module_level=True)

from pytest_hud.agent.lerobot import LeRobotPolicy
from pytest_hud.core.results import load_results

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[3]
SUITE = "evals/test_reach_diffusion.py"
FINAL = REPO / "evals" / "checkpoints" / "reach_diffusion" / "final"
BASELINE = REPO / "evals" / "baselines" / "reach_diffusion.jsonl"
EPISODES = 24  # the baseline's seeds: the gate pairs episodes by seed


def run_suite(*args: str, episodes: int = EPISODES) -> subprocess.CompletedProcess:
    env = dict(os.environ, REACH_DIFFUSION_EPISODES=str(episodes), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "pytest", SUITE, "-p", "no:cacheprovider", "-q", "-n", "2",
               "--hud-width=2", *args]
    return subprocess.run(command, check=False, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=540)


def with_config(tmp_path: Path, name: str, **changes) -> Path:
    """A copy of the final checkpoint with ``changes`` in its config.json (weights untouched)."""
    folder = tmp_path / name
    shutil.copytree(FINAL, folder)
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def test_a_chunk_is_the_same_alone_or_batched_and_a_history_is_refused_with_the_fix(tmp_path):
    policy = LeRobotPolicy.from_checkpoint(FINAL, {"state": ((4,), "float32")})
    rng = np.random.default_rng(0)
    observations = [{"state": rng.uniform(0, 1, 4).astype(np.float32)} for _ in range(8)]
    alone = [policy.predict(observation) for observation in observations]
    batched = policy.predict_batch(observations, [None] * len(observations))
    assert alone[0].shape == (4, 2) and alone[0].dtype == np.float32
    for one, row in zip(alone, batched):
        np.testing.assert_allclose(row, one, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(policy.predict(observations[0]), alone[0])  # deterministic
    assert not np.allclose(alone[0], alone[1])  # rows not mixed up

    history = with_config(tmp_path, "history", n_obs_steps=2)
    with pytest.raises(ValueError, match=r"n_obs_steps=2.*Fix: train it with DiffusionConfig\(n_obs_steps=1"):
        LeRobotPolicy.from_checkpoint(history)


def test_in_workers_and_behind_the_server_the_episodes_are_the_same_recorded_and_pass_the_gate(tmp_path):
    # The checkpoint misses the goal on a seed or so of 24 (as in the baseline), so pytest's exit is
    # 1 either way; the gate's own verdict is its line.
    local = run_suite(f"--hud-results={tmp_path / 'local.jsonl'}", f"--hud-record={tmp_path / 'rollouts'}",
                      f"--hud-baseline={BASELINE}")
    assert f"gate against {BASELINE}: PASSED (" in local.stdout, local.stdout[-3000:] + local.stderr[-3000:]
    served = run_suite("--hud-policy-server", f"--hud-results={tmp_path / 'served.jsonl'}",
                       f"--hud-baseline={BASELINE}")
    assert f"gate against {BASELINE}: PASSED (" in served.stdout, (served.stdout[-3000:]
                                                                   + served.stderr[-3000:])

    a = {e.episode: e for e in load_results(tmp_path / "local.jsonl").episodes}
    b = {e.episode: e for e in load_results(tmp_path / "served.jsonl").episodes}
    assert len(a) == EPISODES and a.keys() == b.keys()
    # Same episodes: a batched denoising loop differs from a lone one in the last float bits only.
    assert {k: (e.steps, e.success) for k, e in a.items()} == {k: (e.steps, e.success) for k, e in b.items()}
    for k, episode in a.items():
        assert episode.total_reward == pytest.approx(b[k].total_reward, abs=1e-4)
    assert sum(e.success for e in a.values()) >= EPISODES * 3 // 4, "the shipped checkpoint mostly succeeds"

    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    recorded = LeRobotDataset("pytest-hud/rollouts", root=tmp_path / "rollouts")
    assert recorded.num_episodes == EPISODES and recorded.num_frames == sum(e.steps for e in a.values())
    frame = recorded[0]
    assert tuple(frame["observation.state"].shape) == (4,) and tuple(frame["action"].shape) == (2,)


def test_one_denoising_step_instead_of_ten_is_a_regression_against_the_baseline(tmp_path):
    one_step = with_config(tmp_path, "one_step", num_inference_steps=1)
    worse = run_suite(f"--hud-policy={one_step}", f"--hud-results={tmp_path / 'worse.jsonl'}",
                      f"--hud-baseline={BASELINE}")
    assert worse.returncode == 1, worse.stdout[-3000:] + worse.stderr[-3000:]
    assert "gate: REGRESSION test_reach_diffusion.py::test_reach_with_diffusion" in worse.stdout
    assert f"gate against {BASELINE}: FAILED (" in worse.stdout
