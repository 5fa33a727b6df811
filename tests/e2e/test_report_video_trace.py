"""Episode videos and traces, fed through the step-observer protocol the agent loop uses."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from pytest_hud.core.contract import Contract
from pytest_hud.client.episode import EpisodeResult
from pytest_hud.recording.trace import TraceRecorder, episode_file_stem, load_trace
from pytest_hud.recording.video import VideoRecorder, encode_mp4

av = pytest.importorskip("av", reason="PyAV is needed to encode and decode the videos (pytest-hud[video])")


def make_contract(cameras: dict[str, tuple[int, int]], state_dim: int = 3,
                  rate: float | None = 10.0) -> Contract:
    features: dict = {
        "action": {"role": "action", "type": "box", "dtype": "float32", "shape": [2]},
        "agent_pos": {"role": "observation", "type": "state", "dtype": "float32", "shape": [state_dim]},
    }
    for name, (h, w) in cameras.items():
        features[name] = {"role": "observation", "type": "rgb", "dtype": "uint8", "shape": [h, w, 3]}
    return Contract.from_dict({"features": features, "control_rate": rate})


def frame(contract: Contract, t: int, *, terminated: bool = False, success: bool = False) -> dict:
    """One observation frame as the wire delivers it: read-only arrays plus the reserved keys."""
    out: dict = {"agent_pos": np.full(contract.features["agent_pos"].shape, t, np.float32),
                 "reward": np.float32(0.5 * t), "terminated": terminated, "success": success}
    for name in contract.cameras:
        h, w, _ = contract.features[name].shape
        img = np.zeros((h, w, 3), np.uint8)
        img[..., 0] = (t * 20) % 256  # a frame you can tell apart from its neighbours
        img[: h // 2, :, 1] = 200
        out[name] = img
    for value in out.values():
        if isinstance(value, np.ndarray):
            value.flags.writeable = False
    return out


def run_episode(observers, contract: Contract, steps: int, success: bool, seed: int = 3) -> EpisodeResult:
    """Drive observers exactly as ``Agent.run`` does: on_start, on_step per action, on_end."""
    episode = SimpleNamespace(contract=contract, seed=seed)
    for obs in observers:
        obs.on_start(episode, frame(contract, 0))
    for t in range(1, steps + 1):
        last = t == steps
        for obs in observers:
            observation = frame(contract, t, terminated=last, success=success and last)
            obs.on_step(np.array([t, -t], np.float32), observation, 0.01 if t % 2 else 0.0)
    result = EpisodeResult(success=success, score=float(success), total_reward=1.0, steps=steps,
                           duration_s=0.1, seed=seed)
    for obs in observers:
        obs.on_end(episode, result, None)
    return result


def decode(path: str) -> tuple[int, int, int, str, str]:
    """(frames, width, height, codec, pixel format) by decoding the whole file."""
    with av.open(path) as container:
        stream = container.streams.video[0]
        count = sum(1 for _ in container.decode(stream))
        return count, stream.width, stream.height, stream.codec_context.name, stream.codec_context.pix_fmt


def test_a_failed_episode_gets_an_h264_video_with_one_frame_per_observation(tmp_path: Path) -> None:
    contract = make_contract({"top": (48, 64)})
    recorder = VideoRecorder(tmp_path / "videos", mode="failed")
    recorder.label_next("evals/test_push.py::test_push[policy-a]", "7")
    result = run_episode([recorder], contract, steps=12, success=False)

    path = result.artefacts["video"]  # set before on_end returned, while the encode may still run
    assert Path(path).is_absolute()
    assert Path(path).name == "test_push.py__test_push_policy-a___7.mp4"
    assert recorder.flush(timeout=30)
    assert recorder.errors == []
    assert decode(path) == (13, 64, 48, "h264", "yuv420p")  # the reset frame plus 12 steps
    assert not Path(path + ".part").exists()
    recorder.close()


def test_mode_failed_skips_successes_and_mode_all_keeps_them(tmp_path: Path) -> None:
    contract = make_contract({"top": (32, 32)})
    failed_only = VideoRecorder(tmp_path / "failed", mode="failed")
    everything = VideoRecorder(tmp_path / "all", mode="all")
    result = run_episode([failed_only, everything], contract, steps=5, success=True)
    assert failed_only.flush(10) and everything.flush(10)
    assert list((tmp_path / "all").glob("*.mp4")) == [Path(result.artefacts["video"])]
    assert not (tmp_path / "failed").exists() or not list((tmp_path / "failed").iterdir())
    failed_only.close()
    everything.close()


def test_an_errored_episode_gets_a_video_and_its_paths_stay_on_the_recorder(tmp_path: Path) -> None:
    contract = make_contract({"top": (16, 16)})
    recorder = VideoRecorder(tmp_path, mode="failed")
    episode = SimpleNamespace(contract=contract, seed=1)
    recorder.on_start(episode, frame(contract, 0))
    recorder.on_step(np.zeros(2, np.float32), frame(contract, 1), 0.0)
    recorder.on_end(episode, None, "bridge went away")  # no result: the agent loop lost the slot
    assert recorder.flush(10)
    assert decode(recorder.last_artefacts["video"])[0] == 2
    recorder.close()


def test_odd_sizes_are_padded_to_even_and_several_cameras_get_one_file_each(tmp_path: Path) -> None:
    contract = make_contract({"wrist": (15, 21), "top": (24, 32)})
    recorder = VideoRecorder(tmp_path, mode="all", fps=5)
    result = run_episode([recorder], contract, steps=4, success=True)
    assert set(result.artefacts) == {"video/wrist", "video/top"}
    assert recorder.flush(30)
    assert decode(result.artefacts["video/wrist"])[:3] == (5, 22, 16)
    assert decode(result.artefacts["video/top"])[:3] == (5, 32, 24)
    recorder.close()


def test_episodes_without_cameras_record_nothing_silently(tmp_path: Path) -> None:
    contract = make_contract({})
    recorder = VideoRecorder(tmp_path / "videos", mode="all")
    result = run_episode([recorder], contract, steps=3, success=False)
    assert recorder.flush(5)
    assert "video" not in result.artefacts and recorder.errors == []
    assert not (tmp_path / "videos").exists()


def test_max_frames_keeps_the_end_of_a_long_episode(tmp_path: Path) -> None:
    contract = make_contract({"top": (16, 16)})
    recorder = VideoRecorder(tmp_path, mode="all", max_frames=6)
    result = run_episode([recorder], contract, steps=20, success=False)
    assert recorder.flush(10)
    assert decode(result.artefacts["video"])[0] == 6
    recorder.close()


def test_encoding_happens_off_the_episode_thread(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    import pytest_hud.recording.video as video

    release = threading.Event()
    real = video.encode_mp4
    threads: list[str] = []

    def slow_encode(*args, **kwargs):
        threads.append(threading.current_thread().name)
        release.wait(10)
        return real(*args, **kwargs)

    monkeypatch.setattr(video, "encode_mp4", slow_encode)
    recorder = VideoRecorder(tmp_path, mode="all")
    result = run_episode([recorder], make_contract({"top": (16, 16)}), steps=3, success=False)
    # on_end returned with the encode blocked: the path is known, the file is not there yet.
    assert recorder.pending == 1 and not Path(result.artefacts["video"]).exists()
    assert recorder.flush(timeout=0.05) is False
    release.set()
    assert recorder.flush(timeout=30) and Path(result.artefacts["video"]).exists()
    assert threads and threads[0] != threading.current_thread().name
    recorder.close()


def test_a_broken_encode_is_collected_not_raised(tmp_path: Path) -> None:
    contract = make_contract({"top": (16, 16)})
    recorder = VideoRecorder(tmp_path, mode="all")
    episode = SimpleNamespace(contract=contract, seed=0)
    recorder.on_start(episode, {"top": np.zeros((4,), np.uint8), "terminated": False})  # not an image
    recorder.on_end(episode, None, "boom")
    assert recorder.flush(10)
    assert len(recorder.errors) == 1 and "no frame" in recorder.errors[0][1]
    assert not list(tmp_path.glob("*.mp4*"))


def test_unknown_video_mode_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="failed, all, none"):
        VideoRecorder("x", mode="sometimes")


def test_encode_mp4_accepts_gray_chw_and_float_frames(tmp_path: Path) -> None:
    frames = [np.zeros((9, 9), np.uint8), np.ones((3, 9, 9), np.float32) * 0.5, np.zeros((9, 9, 4), np.uint8)]
    assert encode_mp4(frames, tmp_path / "mixed.mp4", fps=12.5) == 3
    assert decode(str(tmp_path / "mixed.mp4"))[:3] == (3, 10, 10)


# ------------------------------------------------------------------------------------------ traces


def test_a_trace_loads_in_one_line_and_matches_the_step_count(tmp_path: Path) -> None:
    contract = make_contract({"top": (8, 8)}, state_dim=3)
    recorder = TraceRecorder(tmp_path / "traces")
    recorder.label_next("evals/test_push.py::test_push", "4")
    result = run_episode([recorder], contract, steps=9, success=True, seed=4)

    path = Path(result.artefacts["trace"])
    assert path.name == "test_push.py__test_push__4.npz"
    trace = np.load(path)  # the documented one-liner: no pickles needed
    steps = result.steps
    assert trace["step"].tolist() == list(range(steps))
    assert trace["action"].shape == (steps, 2) and trace["action"][0].tolist() == [1.0, -1.0]
    # row t pairs the observation the policy saw (t) with the action it took and what came back
    assert trace["obs/agent_pos"].shape == (steps, 3)
    assert trace["obs/agent_pos"][:, 0].tolist() == list(range(steps))
    assert trace["final/agent_pos"].tolist() == [9.0, 9.0, 9.0]
    assert trace["reward"].tolist() == [0.5 * t for t in range(1, steps + 1)]
    assert trace["terminated"].tolist() == [False] * (steps - 1) + [True]
    assert trace["success"][-1] and not trace["success"][:-1].any()
    assert trace["inference_s"].tolist() == [0.01 if t % 2 else 0.0 for t in range(1, steps + 1)]
    assert np.all(np.diff(trace["wall_s"]) >= 0)
    assert "obs/top" not in trace.files  # images are what the videos are for

    loaded = load_trace(path)
    assert loaded["meta"]["steps"] == steps and loaded["meta"]["task"] == "evals/test_push.py::test_push"
    assert loaded["meta"]["seed"] == 4 and loaded["meta"]["features"] == ["agent_pos"]
    assert json.loads(str(trace["meta"]))["format"] == "pytest-hud/trace/1"


def test_an_episode_with_no_steps_still_gets_a_trace(tmp_path: Path) -> None:
    contract = make_contract({})
    recorder = TraceRecorder(tmp_path)
    result = run_episode([recorder], contract, steps=0, success=False, seed=11)
    trace = load_trace(result.artefacts["trace"])
    assert trace["step"].shape == (0,) and trace["action"].shape == (0, 2)
    assert Path(result.artefacts["trace"]).name == "episode__seed11.npz"


def test_reruns_in_one_process_do_not_overwrite_the_first_trace(tmp_path: Path) -> None:
    contract = make_contract({})
    recorder = TraceRecorder(tmp_path)
    paths = []
    for _ in range(2):
        recorder.label_next("t.py::test_a", "1")
        paths.append(run_episode([recorder], contract, steps=2, success=False).artefacts["trace"])
    assert [Path(p).name for p in paths] == ["t.py__test_a__1.npz", "t.py__test_a__1-2.npz"]


def test_episode_file_stems_are_safe_file_names() -> None:
    stem = episode_file_stem("evals/a b/test_x.py::test_y[<script>/..\\x]", "../../etc")
    assert "/" not in stem and "\\" not in stem and "<" not in stem and " " not in stem
    assert stem.startswith("test_x.py__test_y")


def test_pyav_is_imported_on_the_encoding_thread_when_the_first_episode_with_a_camera_starts(tmp_path: Path) -> None:
    # In a fresh interpreter (this one has PyAV imported already): the first encode, which the
    # episode's report waits for, must not pay for the import too.
    import subprocess
    import sys

    script = f'''
import sys, time
from types import SimpleNamespace
import numpy as np
from pytest_hud.core.contract import Contract
from pytest_hud.recording.video import VideoRecorder

def contract(cameras):
    features = {{"action": {{"role": "action", "type": "box", "dtype": "float32", "shape": [2]}}}}
    for name in cameras:
        features[name] = {{"role": "observation", "type": "rgb", "dtype": "uint8", "shape": [8, 8, 3]}}
    return Contract.from_dict({{"features": features}})

recorder = VideoRecorder({str(tmp_path / "videos")!r}, mode="failed")
assert "av" not in sys.modules
recorder.on_start(SimpleNamespace(contract=contract([])), {{}})
time.sleep(0.5)
assert "av" not in sys.modules, "imported for an episode without a camera"
recorder.on_start(SimpleNamespace(contract=contract(["top"])), {{"top": np.zeros((8, 8, 3), np.uint8)}})
deadline = time.monotonic() + 30
while "av" not in sys.modules:
    assert time.monotonic() < deadline, "PyAV was not imported during the episode"
    time.sleep(0.01)
assert recorder.pending == 0 and recorder.flush(5) and recorder.close(5)
'''
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "videos").exists()  # nothing encoded: the episode never ended
