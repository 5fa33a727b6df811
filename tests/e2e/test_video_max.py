"""``--hud-video-max``: at most N videos per task, shared by the workers, and the episodes past the
limit render only what their policy reads.

A pixel env of the test's own logs every render it makes; its episodes succeed for seeds divisible
by 3 and fail for the others, so a failed episode wants a video and a successful one gives back the
video it took as it started."""

from __future__ import annotations

import pytest

pytest.importorskip("av", reason="videos need PyAV: pip install 'pytest-hud[video]'")

from pytest_hud.core.results import load_results  # noqa: E402

pytestmark = pytest.mark.timeout(300)

STEPS, CHUNK, SEEDS = 20, 5, 9

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
            f.write("r\\n")
        return np.full((8, 8, 3), (self._seed * 31 + self._t * 7) % 256, np.uint8)

    def _obs(self):
        return {{"state": np.array([self._t], np.float32), "pixels": self._pixels}}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._seed, self._t, self._skip = seed or 0, 0, False
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
@pytest.mark.parametrize("seed", range({SEEDS}))
def test_blink(shared_sim, robot_agent, seed):
    assert robot_agent.run(shared_sim.episode(seed=seed)).success
'''


def _run(pytester: pytest.Pytester, *args: str, succeeds: bool = True) -> tuple[list, int]:
    (pytester.path / "renders.log").write_text("")
    pytester._monkeypatch.setenv("BLINK_SUCCEEDS", "1" if succeeds else "0")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--hud-width=2",
                                           "--hud-results=r.jsonl", "--hud-video-dir=videos", *args, timeout=240)
    failed = [s for s in range(SEEDS) if s % 3 or not succeeds]
    result.assert_outcomes(passed=SEEDS - len(failed), failed=len(failed))
    records = load_results(pytester.path / "r.jsonl").episodes
    return records, len((pytester.path / "renders.log").read_text().splitlines())


def test_at_most_n_videos_per_task_and_the_rest_render_only_what_is_read(pytester):
    import av

    pytester.makepyfile(sims=SIMS, test_blink=TESTS)
    _, renders_none = _run(pytester, "--hud-video=none")  # the bridge's own, and the frames read
    every, renders_every = _run(pytester)
    assert sorted(int(r.seed) for r in every if r.artefacts.get("video")) == [s for s in range(SEEDS) if s % 3]
    for limit in (2, 1):
        records, renders = _run(pytester, f"--hud-video-max={limit}")
        with_video = [r for r in records if r.artefacts.get("video")]
        # the limit holds across both workers, and only failed episodes got one
        assert len(with_video) == limit and all(not r.success for r in with_video), records
        for record in with_video:
            with av.open(record.artefacts["video"]) as container:
                frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
            assert len(frames) == STEPS + 1 and len({int(f[0, 0, 0]) for f in frames}) == STEPS + 1
        # the episodes past the limit rendered only the frames their policy read: beyond a run
        # without videos, every step of an episode per video (by a replay or live), and of at most
        # one more per worker (a success that took a video as it started, rendering live)
        assert renders_none < renders < renders_every
        assert renders - renders_none <= (limit + 2) * STEPS, (renders, renders_none, renders_every)


def test_past_the_limit_episodes_render_no_more_than_without_videos(pytester):
    # Every episode fails: each worker's first episode takes a video (while there is one) and is
    # replayed for it; after a failure the agent would render the next episode live for its video,
    # but past the limit there is none to make, so every later episode renders only what is read.
    pytester.makepyfile(sims=SIMS, test_blink=TESTS)
    _, renders_none = _run(pytester, "--hud-video=none", succeeds=False)
    for limit in (2, 1):
        records, renders = _run(pytester, f"--hud-video-max={limit}", succeeds=False)
        assert sum(bool(r.artefacts.get("video")) for r in records) == limit
        assert renders - renders_none == limit * (STEPS + 1), (renders, renders_none)
