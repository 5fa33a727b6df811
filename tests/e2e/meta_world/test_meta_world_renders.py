"""Renders no one reads are skipped, and skipping them changes nothing that is read.

A chunking policy reads one observation per chunk; its agent tells the bridge, and Meta-World's
pixel envs skip the other steps' renders. Through a real bridge (sync and processes), the same
episode run with every frame rendered (an observer that reads images) and with renders skipped
gives bit-identical states at every step and bit-identical frames wherever the policy reads one,
while the unread frames really were not rendered (they repeat the last read frame).

Skipped without Meta-World (``pip install "pytest-hud[metaworld]"``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("metaworld", reason='Meta-World is not installed: pip install "pytest-hud[metaworld]"')

from conftest import start_bridge, stop  # noqa: E402

from pytest_hud.agent.loop import Agent  # noqa: E402
from pytest_hud.client.bridge import ControlClient  # noqa: E402
from pytest_hud.client.episode import Episode  # noqa: E402

os.environ.setdefault("MUJOCO_GL", "egl")
SIM = Path(__file__).resolve().parents[3] / "evals" / "sims" / "meta_world.py"
sys.path.insert(0, str(SIM.parent))

import meta_world as mw  # noqa: E402

pytestmark = pytest.mark.timeout(600)

CHUNK, STEPS = 10, 25


class ChunkModel:
    """A chunk of ``CHUNK`` actions from the state (a fixed linear map); keeps every frame it reads."""

    def __init__(self) -> None:
        self.weights = np.random.default_rng(0).normal(0, 0.5, (CHUNK * 4, 39))
        self.read: list[dict[str, np.ndarray]] = []

    def predict(self, obs, prompt=None):
        self.read.append({k: np.array(v) for k, v in obs.items()})
        return np.tanh(self.weights @ np.asarray(obs["state"], np.float64)).reshape(CHUNK, 4).astype(np.float32)


class Frames:
    """Keeps every frame of an episode; ``reads_images`` says whether it needs their images rendered."""

    def __init__(self, reads_images: bool) -> None:
        self.reads_images = reads_images
        self.frames: list[dict[str, np.ndarray]] = []

    def on_start(self, episode, observation):
        self.frames = [{k: np.array(observation[k]) for k in ("state", "pixels")}]

    def on_step(self, action, observation, inference_s):
        self.frames.append({k: np.array(observation[k]) for k in ("state", "pixels")})

    def on_end(self, episode, result, error):
        pass


def run_episode(address, reads_images: bool):
    model, frames = ChunkModel(), Frames(reads_images)
    with ControlClient(address) as control:
        result = Agent(model, max_steps=STEPS, observers=[frames]).run(
            Episode(control, seed=5, task="push-v3", build={"pixels": True, "tasks": ["push-v3"]}))
    return model.read, frames.frames, result


@pytest.mark.parametrize("vectorization", ["sync", "processes"])
def test_a_chunking_policy_gets_the_frames_it_reads_bit_identical_with_the_others_unrendered(
        tmp_path, vectorization):
    build = json.dumps({"pixels": True, "tasks": ["push-v3"]})
    proc, address = start_bridge(tmp_path, f"{SIM}:meta_world", 2, "--build-args", build,
                                 "--vectorization", vectorization, timeout=180)
    try:
        # (a fresh bridge's first episode on an env can differ in one pixel of its first frame from
        # the next episodes': a warm-up episode first, so that both runs below start alike)
        run_episode(address, reads_images=True)
        read_all, every, result_all = run_episode(address, reads_images=True)  # no hint: all rendered
        read_some, seen, result_some = run_episode(address, reads_images=False)  # hints: renders skipped
    finally:
        stop(proc)
    assert result_all.steps == result_some.steps == STEPS
    assert result_all.total_reward == result_some.total_reward
    # the policy read the same frames, bit for bit (one per chunk), so it acted the same
    assert len(read_all) == len(read_some) == -(-STEPS // CHUNK)
    for a, b in zip(read_all, read_some):
        np.testing.assert_array_equal(a["pixels"], b["pixels"])
        np.testing.assert_array_equal(a["state"], b["state"])
    # physics is the same at every step, rendered or not
    for a, b in zip(every, seen, strict=True):
        np.testing.assert_array_equal(a["state"], b["state"])
    # the frames between reads were not rendered: they repeat the last read one, where rendering
    # every step gives new frames (the arm moves)
    for step in range(1, STEPS + 1):
        last_read = seen[step - step % CHUNK]["pixels"] if step % CHUNK else seen[step]["pixels"]
        if step % CHUNK:
            np.testing.assert_array_equal(seen[step]["pixels"], seen[step - 1]["pixels"])
        np.testing.assert_array_equal(seen[step]["pixels"], last_read)
    moved = [step for step in range(1, STEPS + 1) if step % CHUNK
             and not np.array_equal(every[step]["pixels"], every[step - 1]["pixels"])]
    assert len(moved) >= STEPS // 2


def test_an_env_told_to_skip_renders_only_the_frames_it_will_be_asked_for():
    env, reference = mw.MetaWorldTask("reach-v3", pixels=True), mw.MetaWorldTask("reach-v3", pixels=True)
    renders = 0
    render = env.render

    def counted():
        nonlocal renders
        renders += 1
        return render()

    env.render = counted
    try:
        obs, _ = env.reset(seed=2)
        ref, _ = reference.reset(seed=2)
        actions = np.random.default_rng(1).uniform(-1, 1, (12, 4)).astype(np.float32)
        for t, action in enumerate(actions):
            env.hud_skip_render(t % 4 != 3)  # read every 4th frame
            obs = env.step(action)[0]
            ref = reference.step(action)[0]
            np.testing.assert_array_equal(obs["state"], ref["state"])
            if t % 4 == 3:
                np.testing.assert_array_equal(obs["pixels"], ref["pixels"])
        assert renders == 1 + 3  # the reset's frame and the three read ones
        env.hud_skip_render(True)
        env.reset(seed=3)  # a reset always renders, and clears the flag
        env.step(actions[0])
        assert renders == 1 + 3 + 2
    finally:
        env.close()
        reference.close()
