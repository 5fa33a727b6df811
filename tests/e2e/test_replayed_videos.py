"""Videos of failed episodes come out complete while renders no one reads are skipped.

A chunking policy reads one observation per chunk, so its episodes render only those frames; the
video recorder (failed episodes) gets its frames from a replay of each failed episode through the
bridge, every step rendered. Through a real bridge with a real gymnasium env rendering
``rgb_array``: the videos are those of rendering every step, frame for frame and bit for bit, and
only the failed episodes are rendered again (the env logs every render it makes).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("av", reason="videos need PyAV: pip install 'pytest-hud[video]'")

from conftest import start_bridge, stop  # noqa: E402

from pytest_hud.agent.loop import Agent  # noqa: E402
from pytest_hud.client.bridge import ControlClient, SlotClient  # noqa: E402
from pytest_hud.client.episode import Episode  # noqa: E402
from pytest_hud.core.results import load_results  # noqa: E402
from pytest_hud.recording.video import VideoRecorder  # noqa: E402

pytestmark = pytest.mark.timeout(600)

SIM = Path(__file__).with_name("pixel_pendulum.py")
CHUNK, STEPS, SEEDS = 10, 30, range(8)


class ChunkModel:
    """``CHUNK`` torques from the state (a fixed linear map)."""

    weights = np.random.default_rng(0).normal(0, 1, (CHUNK, 3))

    def predict(self, obs, prompt=None):
        return np.clip(self.weights @ np.asarray(obs["state"], np.float64), -2, 2).astype(np.float32)[:, None]


class Videos(VideoRecorder):
    """The real recorder, its encodes kept as frame lists by seed (``replays=False``: today's way,
    every step of every episode rendered)."""

    def __init__(self, directory: Path, replays: bool) -> None:
        super().__init__(directory, "failed")
        self._replays, self.videos, self._seed = replays, {}, None

    @property
    def replays(self) -> bool:
        return self._replays

    def on_end(self, episode, result, error):
        self._seed = episode.seed
        super().on_end(episode, result, error)

    def _submit(self, frames, path):
        self.videos[self._seed] = [np.array(f) for f in frames]


def run(address, tmp_path: Path, log: Path, replays: bool, live_above: float = 1.0):
    build = {"log": str(log), "steps": STEPS}
    videos = Videos(tmp_path / "videos", replays)
    agent = Agent(ChunkModel(), observers=[videos])
    agent.live_above = live_above  # 1.0: skip and replay whatever share fails
    results = {}
    with ControlClient(address) as control:
        for seed in SEEDS:
            results[seed] = agent.run(Episode(control, seed=seed, build=build))
    renders = len(log.read_text().splitlines())
    log.write_text("")
    return videos.videos, results, renders


@pytest.mark.parametrize("vectorization", ["sync", "processes"])
def test_failed_episodes_videos_are_bit_identical_and_only_they_render_again(tmp_path, vectorization, monkeypatch):
    # each replay's actions go in one frame (SlotClient.step_many, every frame rendered), and so do
    # the episodes' chunks, with the render flags of each step
    sent: list[tuple[int, list[bool] | None]] = []
    step_many = SlotClient.step_many
    monkeypatch.setattr(SlotClient, "step_many", lambda self, actions, render=None: sent.append(
        (len(actions), None if render is None else list(render))) or step_many(self, actions, render))
    log = tmp_path / "renders.log"
    log.write_text("")
    proc, address = start_bridge(tmp_path, f"{SIM}:make", 2, "--vectorization", vectorization,
                                 "--build-args", json.dumps({"log": str(log), "steps": STEPS}), timeout=120)
    log.write_text("")  # the bridge's first resets at start-up
    try:
        every, results_every, renders_every = run(address, tmp_path, log, replays=False)
        replayed, results, renders = run(address, tmp_path, log, replays=True)
        mixed, results_mixed, renders_mixed = run(address, tmp_path, log, replays=True, live_above=0.5)
    finally:
        stop(proc)
    failed = sorted(seed for seed, r in results.items() if not r.success)
    assert 0 < len(failed) < len(SEEDS)  # both kinds, so that "only the failed ones" means something
    assert {s: r.total_reward for s, r in results.items()} == {s: r.total_reward for s, r in results_every.items()}
    # the same episodes got videos, with the same frames bit for bit
    assert sorted(every) == sorted(replayed) == failed
    for seed in failed:
        assert len(replayed[seed]) == len(every[seed]) == STEPS + 1
        for a, b in zip(every[seed], replayed[seed]):
            assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
        # the video moves: its frames were rendered, not repeated
        assert sum(not np.array_equal(a, b) for a, b in zip(replayed[seed], replayed[seed][1:])) > STEPS // 2
    # today: every step of every episode; now: one frame per chunk (and the reset's), plus every
    # step of each failed episode's replay, and nothing more for the episodes that succeeded
    assert renders_every == len(SEEDS) * (STEPS + 1)
    assert renders == len(SEEDS) * (1 + STEPS // CHUNK) + len(failed) * (STEPS + 1)
    # where most episodes so far failed, the next one renders every step live instead: the same
    # videos, and the renders of whichever way each episode went
    returns = {s: r.total_reward for s, r in results.items()}
    assert {s: r.total_reward for s, r in results_mixed.items()} == returns
    assert sorted(mixed) == failed
    for seed in failed:
        assert [f.tobytes() for f in mixed[seed]] == [f.tobytes() for f in every[seed]]
    expected, watched, wanted, replays = 0, 0, 0, len(failed)
    for seed in SEEDS:
        taped = wanted <= 0.5 * watched
        expected += (1 + STEPS // CHUNK + (STEPS + 1) * (seed in failed)) if taped else STEPS + 1
        replays += taped and seed in failed
        watched, wanted = watched + 1, wanted + (seed in failed)
    assert renders_mixed == expected and renders_mixed != renders  # both ways were taken
    # every replay's actions in one frame; every chunk of the episodes in one frame, its last step's
    # images read unless the episode renders every step (the render counts above: the same renders
    # as one frame per step gave)
    assert [n for n, render in sent if render is None] == [STEPS] * replays
    chunks = [render for _, render in sent if render is not None]
    assert chunks and all(len(r) == CHUNK and (all(r) or r == [False] * (CHUNK - 1) + [True]) for r in chunks)
    assert any(not all(r) for r in chunks) and any(all(r) for r in chunks)  # skipping, and live


REACH = Path(__file__).resolve().parents[2] / "evals" / "sims" / "reach_pixels.py"
CHUNKED = f'''
import numpy as np
import pytest

pytestmark = pytest.mark.hud(sim={str(REACH) + ":reach_pixels"!r})

def drift():
    """A chunk of 8 small pushes right: the agent moves but never reaches the goal (fails)."""
    return lambda obs: np.tile(np.array([[0.3, 0.0]], np.float32), (8, 1))

@pytest.mark.parametrize("seed", range(2))
def test_reach(shared_sim, robot_agent, seed):
    robot_agent.policy = "test_chunks:drift"
    assert robot_agent.run(shared_sim.episode(seed=seed)).success
'''


def test_the_plugin_replays_a_chunking_policys_failed_episodes_into_complete_videos(pytester):
    import av

    pytester.makepyfile(test_chunks=CHUNKED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--hud-results=r.jsonl",
                                           "-W", "error::pytest_hud.agent.replay.ReplayWarning", timeout=240)
    result.assert_outcomes(failed=2)
    records = load_results(pytester.path / "r.jsonl").episodes
    assert sorted(r.episode for r in records) == ["0", "1"]  # a replay is not an episode of the run
    for record in records:
        with av.open(record.artefacts["video"]) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert len(frames) == record.steps + 1 == 41
        assert not np.array_equal(frames[0], frames[-1])  # the agent moved: the frames are new ones


def test_an_episode_that_failed_last_run_renders_its_video_live_with_the_same_frames(pytester):
    """pytest's own record of the last run's failures (its cache) says which episodes will likely
    want a video: the second run renders them as they run, with no replay, and its videos are the
    first run's replayed ones frame for frame; without the cache the episodes are replayed again."""
    import av

    def videos(path):
        out = {}
        for record in load_results(path).episodes:
            with av.open(record.artefacts["video"]) as container:
                out[record.episode] = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        return out

    pytester.makepyfile(test_chunks=CHUNKED)
    args = ("-n", "2", "-W", "error::pytest_hud.agent.replay.ReplayWarning")
    runs = {}
    for name, extra in (("first", ()), ("second", ()), ("no cache", ("-p", "no:cacheprovider"))):
        result = pytester.runpytest_subprocess(*args, *extra, f"--hud-results={name}.jsonl",
                                               f"--hud-video-dir=videos-{name}", timeout=240)
        result.assert_outcomes(failed=2)
        records = load_results(pytester.path / f"{name}.jsonl").episodes
        runs[name] = ({r.episode: bool(r.extra.get("replay_s")) for r in records},
                      videos(pytester.path / f"{name}.jsonl"))
    assert runs["first"][0] == {"0": True, "1": True}  # no last run: taped, replayed for the video
    assert runs["second"][0] == {"0": False, "1": False}  # both failed last run: rendered live
    assert runs["no cache"][0] == {"0": True, "1": True}
    for name in ("second", "no cache"):
        for episode, frames in runs["first"][1].items():
            assert len(frames) == len(runs[name][1][episode]) == 41
            for a, b in zip(frames, runs[name][1][episode]):
                np.testing.assert_array_equal(a, b)
