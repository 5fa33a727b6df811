"""Episodes the HTML report tests show: their records, and a failed episode's real video."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from pytest_hud.client.episode import EpisodeResult
from pytest_hud.core.contract import Contract
from pytest_hud.core.results import EpisodeRecord

TASK = "evals/test_pusht.py::test_push"




def record_failed_episode(directory: Path, steps: int = 15) -> str:
    """A real failed-episode MP4 made by VideoRecorder through the observer protocol."""
    from pytest_hud.recording.video import VideoRecorder, video_available

    if not video_available():
        pytest.skip("PyAV is needed to record the video (pytest-hud[video])")
    contract = Contract.from_dict({"control_rate": 10, "features": {
        "action": {"role": "action", "type": "box", "dtype": "float32", "shape": [2]},
        "top": {"role": "observation", "type": "rgb", "dtype": "uint8", "shape": [48, 64, 3]},
    }})
    recorder = VideoRecorder(directory, mode="failed")
    recorder.label_next(TASK, "3")
    episode = SimpleNamespace(contract=contract, seed=3)

    def obs(t: int) -> dict:
        img = np.zeros((48, 64, 3), np.uint8)
        img[:, : 4 * t] = (250, 80, 20)
        return {"top": img, "terminated": t == steps}

    recorder.on_start(episode, obs(0))
    for t in range(1, steps + 1):
        recorder.on_step(np.zeros(2, np.float32), obs(t), 0.0)
    result = EpisodeResult(success=False, score=0.0, total_reward=0.0, steps=steps, duration_s=1.5, seed=3)
    recorder.on_end(episode, result, None)
    assert recorder.close(timeout=30) and not recorder.errors
    return result.artefacts["video"]


def episode_records(video: str) -> list[EpisodeRecord]:
    records = [EpisodeRecord(task=TASK, episode=str(i), nodeid=f"{TASK}[{i}]", outcome="passed", seed=i,
                             success=True, score=1.0, total_reward=1.0, steps=40, duration_s=2.0)
               for i in (0, 1, 2)]
    records.append(EpisodeRecord(task=TASK, episode="3", nodeid=f"{TASK}[3]", outcome="failed", seed=3,
                                 success=False, score=0.0, total_reward=0.0, steps=15, duration_s=1.5,
                                 artefacts={"video": video}))
    records.append(EpisodeRecord(task="evals/test_pusht.py::test_hard", episode="0", nodeid="h[0]",
                                 outcome="error", seed=0,
                                 error="TimeoutError: slot 1 sent no action <in 30 s>"))
    return records
