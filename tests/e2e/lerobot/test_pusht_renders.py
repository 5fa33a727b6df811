"""PushT skips the camera images a chunking policy will not read, and that changes nothing read.

Through a real bridge, the same PushT episode run with every image drawn (an observer that reads
images) and with the unread ones skipped (ACT-like chunks of 10) gives bit-identical agent
positions, rewards and scores at every step and bit-identical images wherever the policy reads one;
the unread images really were not drawn (they repeat the last read one).

Skipped without gym-pusht (the LeRobot stage installs it).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gym_pusht", reason="gym-pusht is not installed: pip install gym-pusht pymunk shapely")

from conftest import start_bridge, stop  # noqa: E402

from pytest_hud.agent.loop import Agent  # noqa: E402
from pytest_hud.client.bridge import ControlClient  # noqa: E402
from pytest_hud.client.episode import Episode  # noqa: E402

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
SIM = Path(__file__).resolve().parents[3] / "evals" / "sims" / "pusht.py"
sys.path.insert(0, str(SIM.parent))

import pusht  # noqa: E402

pytestmark = pytest.mark.timeout(300)

CHUNK, STEPS = 10, 35


class ChunkModel:
    """A chunk of ``CHUNK`` targets from the agent's position (a fixed map); keeps what it reads."""

    def __init__(self) -> None:
        self.offsets = np.random.default_rng(0).uniform(-60, 60, (CHUNK, 2))
        self.read: list[dict[str, np.ndarray]] = []

    def predict(self, obs, prompt=None):
        self.read.append({k: np.array(v) for k, v in obs.items()})
        return np.clip(np.asarray(obs["agent_pos"], np.float64) + self.offsets, 0, 512)


class Frames:
    def __init__(self, reads_images: bool) -> None:
        self.reads_images = reads_images
        self.frames: list[dict[str, np.ndarray]] = []

    def on_start(self, episode, observation):
        self.frames = [{k: np.array(observation[k]) for k in ("agent_pos", "pixels")}]

    def on_step(self, action, observation, inference_s):
        self.frames.append({k: np.array(observation[k]) for k in ("agent_pos", "pixels")})

    def on_end(self, episode, result, error):
        pass


def run_episode(address, reads_images: bool):
    model, frames = ChunkModel(), Frames(reads_images)
    with ControlClient(address) as control:
        result = Agent(model, max_steps=STEPS, observers=[frames]).run(Episode(control, seed=7))
    return model.read, frames.frames, result


def test_a_chunking_policy_reads_the_same_images_and_the_others_are_not_drawn(tmp_path):
    proc, address = start_bridge(tmp_path, f"{SIM}:make_pusht", 2, timeout=120)
    try:
        read_all, every, result_all = run_episode(address, reads_images=True)
        read_some, seen, result_some = run_episode(address, reads_images=False)
    finally:
        stop(proc)
    assert result_all.steps == result_some.steps == STEPS
    assert result_all.total_reward == result_some.total_reward and result_all.score == result_some.score
    assert len(read_all) == len(read_some) == -(-STEPS // CHUNK)
    for a, b in zip(read_all, read_some):
        for key in ("pixels", "agent_pos"):
            np.testing.assert_array_equal(a[key], b[key])
    moved = 0
    for step in range(STEPS + 1):
        np.testing.assert_array_equal(every[step]["agent_pos"], seen[step]["agent_pos"])
        if step % CHUNK == 0:  # read by the policy: drawn
            np.testing.assert_array_equal(every[step]["pixels"], seen[step]["pixels"])
        else:  # not read: the last drawn image, where drawing every step shows the pusher moving
            np.testing.assert_array_equal(seen[step]["pixels"], seen[step - 1]["pixels"])
            moved += not np.array_equal(every[step]["pixels"], every[step - 1]["pixels"])
    assert moved >= STEPS // 2


def test_a_reset_always_draws_and_clears_the_hint():
    env, reference = pusht.make_pusht(), pusht.make_pusht()
    try:
        env.reset(seed=1)
        reference.reset(seed=1)
        env.hud_skip_render(True)
        first = env.reset(seed=2)[0]
        np.testing.assert_array_equal(first["pixels"], reference.reset(seed=2)[0]["pixels"])
        action = np.array([300.0, 100.0])
        np.testing.assert_array_equal(env.step(action)[0]["pixels"], reference.step(action)[0]["pixels"])
    finally:
        env.close()
        reference.close()
