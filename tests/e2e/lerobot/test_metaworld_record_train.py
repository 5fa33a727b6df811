"""Meta-World record -> evaluate through the plugin, with LeRobot and the shipped ACT checkpoints.

Needs the LeRobot + Meta-World venv (``constraints/lerobot-metaworld.txt``); skipped with the reason
otherwise. Real bridges, real Meta-World envs, real LeRobot datasets and policies.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

if importlib.util.find_spec("metaworld") is None:
    pytest.skip("Meta-World is not installed: pip install 'pytest-hud[metaworld]'", allow_module_level=True)
pytest.importorskip("lerobot.policies", reason="LeRobot is not installed: pip install 'pytest-hud[lerobot]'")

from lerobot.datasets.lerobot_dataset import LeRobotDataset

from pytest_hud.core.results import load_results

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]
SUITE = REPO / "evals" / "test_metaworld_act.py"
CHECKPOINTS = REPO / "evals" / "checkpoints" / "metaworld_act"
EXPERT = REPO / "evals" / "policies" / "meta_world_experts.py"
TASKS = ("reach-v3", "button-press-topdown-v3", "drawer-close-v3")


def run_suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str, episodes: int,
              first_seed: int = 0) -> pytest.RunResult:
    monkeypatch.setenv("METAWORLD_ACT_EPISODES", str(episodes))
    monkeypatch.setenv("METAWORLD_ACT_FIRST_SEED", str(first_seed))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("MUJOCO_GL", os.environ.get("MUJOCO_GL", "egl"))
    return pytester.runpytest_subprocess(str(SUITE), "-p", "no:cacheprovider", f"--rootdir={pytester.path}",
                                         *args, timeout=540)


def test_expert_rollouts_are_recorded_as_one_lerobot_dataset(pytester, monkeypatch):
    rollouts = pytester.path / "demos"
    result = run_suite(pytester, monkeypatch, "-n", "2", "--hud-width=2", f"--hud-policy={EXPERT}:expert",
                       f"--hud-record={rollouts}", "--hud-results=demos.jsonl", episodes=2, first_seed=1000)
    result.assert_outcomes(passed=6)
    episodes = load_results(pytester.path / "demos.jsonl").episodes
    ds = LeRobotDataset("pytest-hud/demos", root=rollouts)
    assert ds.num_episodes == 6 and ds.num_frames == sum(e.steps for e in episodes)
    frame = ds[0]
    assert tuple(frame["observation.state"].shape) == (39,) and tuple(frame["action"].shape) == (4,)
    lines = [json.loads(line) for line in (rollouts / "meta" / "pytest_hud_episodes.jsonl").read_text().splitlines()]
    assert {(line["seed"], line["success"]) for line in lines} == {(1000, True), (1001, True)}
    assert {ds[i]["task"] for i in range(0, ds.num_frames, 7)} == set(TASKS)  # the prompt is the task


@pytest.mark.parametrize("name", ["early", "final"])
def test_shipped_checkpoint_loads_and_runs_every_task(pytester, monkeypatch, name):
    """Both checkpoints run through the plugin on every task; the final one solves held-out seeds."""
    result = run_suite(pytester, monkeypatch, "-n", "2", "--hud-width=2", f"--hud-policy={CHECKPOINTS / name}",
                       "--hud-results=r.jsonl", episodes=3)
    episodes = load_results(pytester.path / "r.jsonl").episodes
    assert len(episodes) == 9 and all(e.outcome in ("passed", "failed") for e in episodes), result.stdout.str()
    solved = {task: sum(e.success for e in episodes if task in e.task) for task in TASKS}
    if name == "final":
        assert all(n >= 2 for n in solved.values()), solved
    else:
        assert sum(solved.values()) <= 6, solved  # the early snapshot is clearly worse


def test_the_checkpoint_script_refuses_a_dataset_folder_it_would_delete_and_steps_it_cannot_take(tmp_path):
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[3] / "scripts" / "make_metaworld_checkpoints.py"
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
    assert "--early-steps (100) must be between 1 and --steps (10)" in refused("--steps", "10")
    assert not (tmp_path / "out").exists()
