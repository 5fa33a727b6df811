"""Reports through the real plugin: videos, traces, HTML pages and live progress from a pytest run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pytest_hud.recording.trace import load_trace
from pytest_hud.core.results import load_results
from test_report_html_browser import browser, video_states  # noqa: F401 - fixtures (browser: skips or fails without Chromium)

pytestmark = pytest.mark.timeout(240)

REACH = Path(__file__).resolve().parents[2] / "evals" / "sims" / "reach_pixels.py"

POLICIES = '''
import numpy as np

def still():
    """Never moves: every episode runs to the 40-step limit and fails."""
    return lambda obs: np.zeros(2, np.float32)

def toward():
    """Reaches the goal from the image (red agent, green goal) in a few steps."""
    def act(obs):
        img = obs["pixels"].astype(int)
        red = np.argwhere((img[..., 0] > img[..., 1] + 80))
        green = np.argwhere((img[..., 1] > img[..., 0] + 80))
        if len(red) == 0 or len(green) == 0:
            return np.zeros(2, np.float32)
        (ry, rx), (gy, gx) = red.mean(0), green.mean(0)
        return np.clip(np.array([gx - rx, ry - gy]) / 64 * 8, -1, 1).astype(np.float32)
    return act
'''

SUITE = f'''
import pytest

pytestmark = pytest.mark.hud(sim={str(REACH) + ":reach_pixels"!r})

@pytest.mark.parametrize("seed", range(4))
def test_reach(shared_sim, robot_agent, seed):
    policy = "policies:still" if seed % 2 else "policies:toward"
    robot_agent.policy = policy
    assert robot_agent.run(shared_sim.episode(seed=seed)).success
'''


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(policies=POLICIES, test_reach=SUITE)
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=180)


def test_failed_episodes_get_videos_and_every_episode_a_trace(project):
    pytest.importorskip("av")
    import av

    result = run(project, "-n", "2", "--hud-results=r.jsonl", "--hud-trace-dir=traces")
    result.assert_outcomes(passed=2, failed=2)
    records = {r.episode: r for r in load_results(project.path / "r.jsonl").episodes}
    for seed in ("1", "3"):  # the failed ones
        video = Path(records[seed].artefacts["video"])
        assert video.parent == project.path / "hud-videos"
        with av.open(str(video)) as container:
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        assert len(frames) == records[seed].steps + 1 == 41  # the reset observation plus one per step
        assert frames[0].shape == (64, 64, 3)
    for seed in ("0", "2"):  # successes get no video in the default mode
        assert "video" not in records[seed].artefacts
    for seed, rec in records.items():
        trace = load_trace(rec.artefacts["trace"])
        assert len(trace["action"]) == rec.steps and trace["action"].shape[1:] == (2,)
        assert bool(np.asarray(trace["success"])[-1]) == (seed in ("0", "2"))


def test_live_progress_lines_under_xdist(project):
    result = run(project, "-n", "2", "--hud-progress-interval=0.001", "--hud-video=none", "--hud-results=r.jsonl")
    result.assert_outcomes(passed=2, failed=2)
    result.stdout.fnmatch_lines(["hud progress: * of 4 episodes done, */min, * | success so far: test_reach */*"])
    lines = [line for line in result.stdout.lines if line.startswith("hud progress:")]
    assert len(lines) >= 2
    assert not any("hud progress" in line and not line.startswith("hud progress") for line in result.stdout.lines)
    # The last episode's line: all done, nothing left, and the success is read as a count with its interval.
    assert lines[-1].startswith("hud progress: 4 of 4 episodes done, ")
    assert "about 0s left | success so far: test_reach 2/4 = 50% [15-85%]" in lines[-1]
    # The same lines in the results file, for tools that tail it; the file still loads.
    records = [json.loads(line) for line in (project.path / "r.jsonl").read_text().splitlines()]
    progress = [r for r in records if r["record"] == "progress"]
    assert [r["line"] for r in progress] == lines
    assert progress[-1]["done"] == progress[-1]["total"] == 4 and progress[-1]["eta_s"] == 0
    assert progress[-1]["tasks"]["test_reach.py::test_reach"]["successes"] == 2
    assert len(load_results(project.path / "r.jsonl").episodes) == 4


def test_live_progress_is_off_with_interval_zero(project):
    result = run(project, "-p", "no:xdist", "--hud-progress-interval=0", "--hud-video=none")
    assert "hud progress" not in result.stdout.str()


def test_the_standalone_page_lists_tasks_and_episodes(project):
    pytest.importorskip("av")
    result = run(project, "-p", "no:xdist", "--hud-html=out/hud.html")
    result.assert_outcomes(passed=2, failed=2)
    page = (project.path / "out" / "hud.html").read_text()
    assert "test_reach.py::test_reach" in page and "<svg" in page and page.count("<video") == 2
    assert (project.path / "out" / "hud-videos").is_dir()  # videos go beside the page


@pytest.mark.parametrize("mode", [("-n", "2"), ("-p", "no:xdist")], ids=["xdist", "no-xdist"])
def test_pytest_html_gets_episode_columns_when_the_plugin_activates_after_session_start(project, mode):
    """Only --html is given, so pytest-hud activates lazily, after pytest-html built its header."""
    pytest.importorskip("pytest_html")
    pytest.importorskip("av")
    result = run(project, *mode, "--html=report.html")  # no hud option: lazy activation
    result.assert_outcomes(passed=2, failed=2)
    assert "INTERNALERROR" not in result.stdout.str()
    page = (project.path / "report.html").read_text()
    assert 'data-column-type="hud_task"' in page and "col-hud_seed" in page
    # the workers record with the settings the controller completed on activation (videos beside --html)
    assert len(list((project.path / "hud-videos").glob("*.mp4"))) == 2


def test_pytest_html_report_from_a_real_run_plays_the_failed_videos(project, browser):  # noqa: F811
    pytest.importorskip("pytest_html")
    pytest.importorskip("av")
    result = run(project, "-n", "2", "--html=report.html", "--self-contained-html")
    result.assert_outcomes(passed=2, failed=2)
    browser.open((project.path / "report.html").as_uri())
    states = video_states(browser, ".hud-video-extra video")
    assert len(states) == 2
    for state in states:
        assert state["error"] is None and state["readyState"] >= 2 and state["duration"] > 0, state
        assert (state["width"], state["height"]) == (64, 64)
    summary_rows = browser.evaluate("document.querySelectorAll('.hud-summary table.hud-tasks tbody tr').length")
    assert summary_rows == 1
