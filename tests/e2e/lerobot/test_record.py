"""Recording rollouts as a LeRobot dataset: whole episodes per worker part, merged into one dataset.

Episodes are fed to :class:`DatasetRecorder` through the step-observer protocol with synthetic
frames (no bridge), then read back with LeRobot's own ``LeRobotDataset``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
pytest.importorskip("lerobot.policies")  # not "lerobot": tests/e2e/lerobot itself would satisfy that

from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: E402

from pytest_hud.core.contract import Contract, Feature  # noqa: E402
from pytest_hud.client.episode import EpisodeResult  # noqa: E402
from pytest_hud.recording.dataset import (
    DEFAULT_REPO_ID, EPISODES_FILE, DatasetRecorder, RecordingWarning, check_record_dir, merge_parts,
)

TASK = "evals/test_reach.py::test_reach"


def make_contract(camera: str | None = None) -> Contract:
    features = {
        "state": Feature("state", "observation", "state", "float32", (3,), ["x", "y", "t"]),
        "action": Feature("action", "action", "box", "float32", (2,), ["vx", "vy"], [-1.0, -1.0], [1.0, 1.0]),
    }
    if camera:
        features[camera] = Feature(camera, "observation", "rgb", "uint8", (6, 8, 3),
                                   ["height", "width", "channel"])
    return Contract(features=features, control_rate=20.0)


def state(seed: int, t: int) -> np.ndarray:
    return np.array([seed, t, 0.5], dtype=np.float32)


def image(seed: int, t: int) -> np.ndarray:
    return np.full((6, 8, 3), (seed * 40 + t * 10) % 256, dtype=np.uint8)


def action(seed: int, t: int) -> np.ndarray:
    return np.array([seed / 10, -t / 10], dtype=np.float64)  # the model's dtype: recorded as the contract's


def play(recorder: DatasetRecorder, contract: Contract, seed: int, steps: int, *, prompt: str | None = None,
         crash_at: int | None = None) -> None:
    """One episode through the observer protocol, as the agent loop drives it."""
    camera = contract.cameras[0] if contract.cameras else None

    def observation(t: int) -> dict:
        obs = {"state": state(seed, t), "reward": float(t), "terminated": t == steps, "truncated": False,
               "success": t == steps and seed % 2 == 0}
        if camera:
            obs[camera] = image(seed, t)
        return obs

    episode = SimpleNamespace(contract=contract, prompt=prompt, seed=seed)
    recorder.label_next(TASK, str(seed))
    recorder.on_start(episode, observation(0))
    for t in range(steps):
        if t == crash_at:
            recorder.on_end(episode, None, "BridgeError: the bridge closed the connection")
            return
        recorder.on_step(action(seed, t), observation(t + 1), 0.0)
    result = EpisodeResult(success=seed % 2 == 0, score=1.0, total_reward=0.0, steps=steps, duration_s=0.1)
    recorder.on_end(episode, result, None)


def load(root: Path) -> LeRobotDataset:
    return LeRobotDataset(DEFAULT_REPO_ID, root=root)


def episode_lengths(dataset: LeRobotDataset) -> list[int]:
    return [int(n) for n in np.bincount(np.asarray(dataset.hf_dataset["episode_index"]))]


def test_recorded_episodes_load_back_and_an_errored_one_is_dropped(tmp_path: Path) -> None:
    recorder = DatasetRecorder(tmp_path, worker_id="gw0")
    contract = make_contract()
    play(recorder, contract, seed=2, steps=4, prompt="reach the green goal")
    play(recorder, contract, seed=3, steps=5, crash_at=3)  # errors after 3 steps: never committed
    play(recorder, contract, seed=4, steps=6)  # no prompt: the task id is the task
    assert recorder.close()
    assert (recorder.episodes, recorder.frames, recorder.dropped, recorder.errors) == (2, 10, 1, [])

    assert merge_parts(tmp_path) == [tmp_path.resolve()]
    dataset = load(tmp_path)
    assert (dataset.num_episodes, dataset.num_frames) == (2, 10)
    assert episode_lengths(dataset) == [4, 6]
    assert dataset.fps == 20
    assert dataset.features["observation.state"]["names"] == ["x", "y", "t"]
    assert dataset.features["action"]["dtype"] == "float32"
    assert {"next.reward", "next.done", "next.success"} <= set(dataset.features)
    assert sorted(dataset.meta.tasks.index) == sorted(["reach the green goal", TASK])

    # Frame t pairs the observation the action was computed from with that action, then the outcome.
    for t in range(6):
        frame = dataset[4 + t]
        assert int(frame["episode_index"]) == 1 and int(frame["frame_index"]) == t
        np.testing.assert_allclose(frame["observation.state"].numpy(), state(4, t))
        np.testing.assert_allclose(frame["action"].numpy(), action(4, t).astype(np.float32))
        assert float(frame["next.reward"]) == t + 1
        assert bool(frame["next.done"]) == (t == 5) and bool(frame["next.success"]) == (t == 5)
        assert frame["task"] == TASK
    assert dataset[0]["task"] == "reach the green goal"

    index = [json.loads(line) for line in (tmp_path / "meta" / EPISODES_FILE).read_text().splitlines()]
    assert [(e["episode_index"], e["episode"], e["seed"], e["frames"]) for e in index] == [
        (0, "2", 2, 4), (1, "4", 4, 6)]
    assert not (tmp_path / "parts").exists()
    with pytest.raises(FileExistsError, match="already holds a LeRobot dataset"):
        check_record_dir(tmp_path)


def test_two_worker_parts_merge_into_one_dataset_with_renumbered_episodes(tmp_path: Path) -> None:
    contract = make_contract()
    gw0, gw1 = DatasetRecorder(tmp_path, worker_id="gw0"), DatasetRecorder(tmp_path, worker_id="gw1")
    play(gw1, contract, seed=7, steps=2)
    play(gw0, contract, seed=5, steps=3)
    play(gw1, contract, seed=8, steps=4)
    gw0.close()
    gw1.close()
    assert sorted(p.name for p in (tmp_path / "parts").iterdir()) == ["gw0", "gw1"]

    merge_parts(tmp_path)
    dataset = load(tmp_path)
    assert (dataset.num_episodes, dataset.num_frames) == (3, 9)
    assert episode_lengths(dataset) == [3, 2, 4]  # gw0's episode first, then gw1's in recording order
    assert np.asarray(dataset.hf_dataset["index"]).tolist() == list(range(9))
    starts = {int(dataset[i]["episode_index"]): dataset[i]["observation.state"][0].item() for i in (0, 3, 5)}
    assert starts == {0: 5.0, 1: 7.0, 2: 8.0}
    assert dataset.meta.stats["observation.state"]["max"][0] == 8.0  # statistics cover every part
    index = [json.loads(line) for line in (tmp_path / "meta" / EPISODES_FILE).read_text().splitlines()]
    assert [(e["episode_index"], e["worker"], e["seed"]) for e in index] == [
        (0, "gw0", 5), (1, "gw1", 7), (2, "gw1", 8)]


def test_camera_images_are_recorded_as_lerobot_image_features(tmp_path: Path) -> None:
    recorder = DatasetRecorder(tmp_path, worker_id="main")
    play(recorder, make_contract(camera="pixels/top"), seed=1, steps=3)
    recorder.close()
    merge_parts(tmp_path)

    dataset = load(tmp_path)
    feature = dataset.features["observation.images.top"]
    assert feature["dtype"] == "image" and tuple(feature["shape"]) == (6, 8, 3)
    assert dataset.meta.camera_keys == ["observation.images.top"]
    for t in range(3):
        picture = dataset[t]["observation.images.top"]  # LeRobot's convention: CHW float in [0, 1]
        assert tuple(picture.shape) == (3, 6, 8)
        np.testing.assert_allclose(picture.numpy(), image(1, t).transpose(2, 0, 1) / 255.0, atol=1e-6)


def test_a_part_left_unclosed_by_a_dead_worker_stays_and_the_rest_merges(tmp_path: Path) -> None:
    contract = make_contract()
    alive, dead = DatasetRecorder(tmp_path, worker_id="gw0"), DatasetRecorder(tmp_path, worker_id="gw1")
    play(alive, contract, seed=1, steps=2)
    play(dead, contract, seed=2, steps=3)  # never closed: its parquet writers are still open
    alive.close()

    with pytest.warns(RecordingWarning, match="gw1.*never closed"):
        merge_parts(tmp_path)
    assert load(tmp_path).num_episodes == 1
    assert (tmp_path / "parts" / "gw1").is_dir()  # kept for whoever wants to look
    dead.close()


def test_nothing_recorded_merges_to_nothing(tmp_path: Path) -> None:
    recorder = DatasetRecorder(tmp_path, worker_id="gw0")
    play(recorder, make_contract(), seed=1, steps=3, crash_at=1)
    recorder.close()
    assert merge_parts(tmp_path) == []
    assert not (tmp_path / "meta").exists()


def test_importing_the_recorder_does_not_import_torch() -> None:
    code = "import sys, pytest_hud.recording.dataset; print('torch' in sys.modules or 'lerobot' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
