"""``--hud-video-max``: at most N videos per task, shared by the workers, and the episodes past the
limit render only what their policy reads.

A pixel env of the test's own logs every render it makes with its episode's seed (the bridge's own
resets and timing steps use other seeds, and how many it makes depends on the machine's load, so
they are not counted); its episodes succeed for seeds divisible by 3 and fail for the others, so a
failed episode wants a video and a successful one gives back the video it took as it started."""

from __future__ import annotations

from collections import Counter

import pytest

pytest.importorskip("av", reason="videos need PyAV: pip install 'pytest-hud[video]'")

from pytest_hud.core.results import load_results  # noqa: E402

pytestmark = pytest.mark.timeout(300)

STEPS, CHUNK, SEEDS, FIRST = 20, 5, 9, 100  # the episodes' seeds: FIRST, FIRST + 1, ...

SIMS = f'''
import gymnasium as gym
import numpy as np
from gymnasium import spaces

class Blink(gym.Env):
    """A square that changes colour each step; logs each render to renders.log."""

    observation_space = spaces.Dict({{"state": spaces.Box(-1e3, 1e3, (1,), np.float32),
                                      "pixels": spaces.Box(0, 255, (8, 8, 3), np.uint8)}})
    action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self, succeeds=True):
        self._skip, self._t, self._seed, self._pixels = False, 0, 0, None
        self.succeeds = succeeds

    def hud_skip_render(self, skip):
        self._skip = skip

    def _render(self):
        with open("renders.log", "a") as f:
            f.write(f"{{self._seed}}\\n")
        return np.full((8, 8, 3), (self._seed * 31 + self._t * 7) % 256, np.uint8)

    def _obs(self):
        return {{"state": np.array([self._t], np.float32), "pixels": self._pixels}}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._seed, self._t, self._skip = -1 if seed is None else seed, 0, False
        self._pixels = self._render()
        return self._obs(), {{}}

    def step(self, action):
        self._t += 1
        if not self._skip:
            self._pixels = self._render()
        self._skip = False
        done = self._t >= {STEPS}
        success = bool(done and self.succeeds and self._seed % 3 == 0)
        return self._obs(), 0.0, done, False, {{"is_success": success}}

def blink(succeeds=True):
    return Blink(succeeds)
'''

TESTS = f'''
import os

import numpy as np
import pytest

SUCCEEDS = os.environ.get("BLINK_SUCCEEDS") == "1"

def still():
    return lambda obs: np.zeros(({CHUNK}, 1), np.float32)  # a chunk: the middle renders go unread

@pytest.mark.hud(sim="sims:blink", policy="test_blink:still", build={{"succeeds": SUCCEEDS}})
@pytest.mark.parametrize("seed", range({FIRST}, {FIRST + SEEDS}))
def test_blink(shared_sim, robot_agent, seed):
    assert robot_agent.run(shared_sim.episode(seed=seed)).success
'''


def _run(pytester: pytest.Pytester, *args: str, succeeds: bool = True) -> tuple[list, Counter]:
    """The run's episode records, and how many renders each episode's seed made."""
    (pytester.path / "renders.log").write_text("")
    pytester._monkeypatch.setenv("BLINK_SUCCEEDS", "1" if succeeds else "0")
    # (the shared bridge, as for a sim whose step costs more than a round trip: this one's is cheap
    # enough for the workers to step it themselves, and they render what their env renders)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--hud-width=2", "--hud-inline=never",
                                           "--hud-results=r.jsonl", "--hud-video-dir=videos", *args, timeout=240)
    failed = [s for s in range(FIRST, FIRST + SEEDS) if s % 3 or not succeeds]
    result.assert_outcomes(passed=SEEDS - len(failed), failed=len(failed))
    records = load_results(pytester.path / "r.jsonl").episodes
    seeds = Counter(int(line) for line in (pytester.path / "renders.log").read_text().split())
    return records, Counter({seed: n for seed, n in seeds.items() if seed >= FIRST})  # the episodes' own


READ = 1 + STEPS // CHUNK  # the frames a policy reads: the reset's, and the one after each chunk
REPLAYED, LIVE = STEPS + 1, STEPS + 1 - READ  # what a video adds: a replay of the episode, or rendering it live


def _check_videos(records: list) -> list:
    import av

    with_video = [r for r in records if r.artefacts.get("video")]
    for record in with_video:
        with av.open(record.artefacts["video"]) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert len(frames) == STEPS + 1 and len({int(f[0, 0, 0]) for f in frames}) == STEPS + 1
    return with_video


def test_at_most_n_videos_per_task_and_the_rest_render_only_what_is_read(pytester):
    pytester.makepyfile(sims=SIMS, test_blink=TESTS)
    _, none = _run(pytester, "--hud-video=none")
    assert set(none.values()) == {READ}  # without videos every episode renders what it reads
    every, _ = _run(pytester)
    failed = [s for s in range(FIRST, FIRST + SEEDS) if s % 3]
    assert sorted(int(r.seed) for r in _check_videos(every)) == failed
    for limit in (2, 1):
        records, renders = _run(pytester, f"--hud-video-max={limit}")
        with_video = _check_videos(records)
        # the limit holds across both workers, and only failed episodes got one (a success gave
        # back the video it took as it started)
        assert len(with_video) == limit and all(not r.success for r in with_video), records
        videos = {int(r.seed) for r in with_video}
        for seed, n in renders.items():
            # an episode past the limit rendered only what its policy read
            assert n - READ in ((REPLAYED, LIVE) if seed in videos else (0,)), (seed, n, videos)


def test_past_the_limit_episodes_render_no_more_than_without_videos(pytester):
    # Every episode fails. After a failure the agent would render the next episode live for its
    # video, but past the limit there is none to make, so every later episode renders only what its
    # policy reads.
    pytester.makepyfile(sims=SIMS, test_blink=TESTS)
    for limit in (2, 1):
        records, renders = _run(pytester, f"--hud-video-max={limit}", succeeds=False)
        videos = {int(r.seed) for r in _check_videos(records)}
        assert len(videos) == limit
        for seed, n in renders.items():
            assert n - READ in ((REPLAYED, LIVE) if seed in videos else (0,)), (seed, n, videos)


DIES_AT = FIRST  # the seed whose episode kills its worker after taking its task's one video

DYING_TESTS = TESTS.replace('def still():', f'''def dies_once():
    import os, signal

    def policy(obs):
        pixels = next(v for v in obs.values() if getattr(v, "ndim", 0) == 3)
        step = next(v for v in obs.values() if getattr(v, "ndim", 0) == 1)
        if step[0] == 0 and int(pixels[0, 0, 0]) == ({DIES_AT} * 31) % 256:  # the first frame of seed {DIES_AT}
            os.kill(os.getpid(), signal.SIGKILL)  # mid-episode, its video taken
        return np.zeros(({CHUNK}, 1), np.float32)
    return policy

def still():''').replace('policy="test_blink:still"', 'policy="test_blink:dies_once"')


def test_a_worker_that_dies_mid_episode_gives_its_video_to_a_later_episode(pytester):
    # One worker, so the first episode runs first: it takes the task's only video and kills its
    # worker; xdist starts another, and one of the failed episodes it runs still gets that video.
    pytester.makepyfile(sims=SIMS, test_blink=DYING_TESTS)
    pytester._monkeypatch.setenv("BLINK_SUCCEEDS", "0")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "1", "--hud-width=1", "--hud-inline=never",
                                           "--hud-results=r.jsonl", "--hud-video-dir=videos",
                                           "--hud-video-max=1", timeout=240)
    result.assert_outcomes(failed=SEEDS - 1, errors=1)  # (xdist reports a crash as an error)
    records = load_results(pytester.path / "r.jsonl").episodes
    (died,) = [r for r in records if int(r.seed) == DIES_AT]
    assert died.error and "crashed" in died.error, died.error
    with_video = _check_videos(records)
    # (xdist hands the dead worker's other pending tests to the next one, so which failed episode
    # comes first after the crash is its order's)
    assert len(with_video) == 1 and int(with_video[0].seed) != DIES_AT, [(r.seed, r.error) for r in records]
