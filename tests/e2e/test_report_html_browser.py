"""HTML reports opened in headless Chromium: the summary table, the chart, and videos that really load.

The checks go through the page (the Chrome DevTools Protocol over ``--remote-debugging-pipe``):
the page is left as written, and the browser is asked what it rendered and whether each ``<video>``
decoded its media (``readyState >= 2`` = HAVE_CURRENT_DATA, a positive duration and frame size).
Chromium comes from Debian's ``chromium`` package; without it those tests skip and say so, unless
``HUD_REQUIRE_BROWSER`` is set (to anything but ``0``): then a missing Chromium fails them (CI sets it).
Every wait on the browser is bounded, with deadlines meant for a loaded machine.
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from pytest_hud.core.results import aggregate
from pytest_hud.report.html import write_standalone_page
from reportkit import TASK, episode_records, record_failed_episode

CHROMIUM = "/usr/bin/chromium"
#: Set (to anything but 0) where the browser tests must run: a missing Chromium fails them.
REQUIRE_BROWSER = "HUD_REQUIRE_BROWSER"


def chromium_or_skip() -> None:
    """Skip (or, with ``HUD_REQUIRE_BROWSER`` set, fail) the test where Chromium is missing."""
    if os.access(CHROMIUM, os.X_OK):
        return
    why = (f"{CHROMIUM} not found: install Debian's chromium (apt-get install chromium) to check the "
           "HTML reports in a real browser")
    if os.environ.get(REQUIRE_BROWSER, "").strip() not in ("", "0"):
        pytest.fail(f"{why} ({REQUIRE_BROWSER}={os.environ[REQUIRE_BROWSER]} requires these tests to run)",
                    pytrace=False)
    pytest.skip(f"{why}; {REQUIRE_BROWSER}=1 makes its absence a failure")




def _lift(fd: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return high


class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe (no port, no network)."""

    def __init__(self, profile: Path) -> None:
        cmd_r, self._cmd_w = os.pipe()  # we write commands, Chromium reads them on its fd 3
        self._res_r, res_w = os.pipe()  # Chromium writes replies on its fd 4, we read them
        # Lift the child's ends above 9 first, so that moving them onto 3 and 4 cannot clobber one
        # with the other (a fresh process hands out 3, 4, 5, 6 for these pipes).
        cmd_r, res_w = (_lift(fd) for fd in (cmd_r, res_w))
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-dev-shm-usage",
                 "--autoplay-policy=no-user-gesture-required", f"--user-data-dir={profile}",
                 "--remote-debugging-pipe", "about:blank"]
        # bash moves the pipe ends onto fds 3 and 4, where --remote-debugging-pipe expects them (dash
        # cannot redirect fds above 9; a preexec_fn would be unsafe in a process with threads).
        script = f'exec "$0" "$@" 3<&{cmd_r} 4>&{res_w} {cmd_r}<&- {res_w}>&-'
        self.proc = subprocess.Popen(["/bin/bash", "-c", script, CHROMIUM, *flags], pass_fds=(cmd_r, res_w),
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        os.close(cmd_r)
        os.close(res_w)
        self._buffer = b""
        self._id = 0
        self._session: str | None = None

    def send(self, method: str, params: dict | None = None, timeout: float = 60.0) -> dict:
        self._id += 1
        message: dict = {"id": self._id, "method": method, "params": params or {}}
        if self._session and not method.startswith(("Target.", "Browser.")):
            message["sessionId"] = self._session
        os.write(self._cmd_w, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self._id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply.get("result", {})
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"Chromium did not answer {method} within {timeout} s")
            ready, _, _ = select.select([self._res_r], [], [], left)
            if ready:
                chunk = os.read(self._res_r, 1 << 16)
                if not chunk:
                    raise RuntimeError("Chromium closed the DevTools pipe (did it crash?)")
                self._buffer += chunk

    def open(self, url: str) -> None:
        page = next(t for t in self.send("Target.getTargets")["targetInfos"] if t["type"] == "page")
        attached = self.send("Target.attachToTarget", {"targetId": page["targetId"], "flatten": True})
        self._session = attached["sessionId"]
        self.send("Page.enable")
        self.send("Page.navigate", {"url": url})
        deadline = time.monotonic() + 60
        while self.evaluate("document.readyState") != "complete":
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not finish loading")
            time.sleep(0.05)

    def evaluate(self, expression: str, timeout: float = 60.0):
        result = self.send("Runtime.evaluate", {"expression": expression, "awaitPromise": True,
                                                "returnByValue": True}, timeout)
        if "exceptionDetails" in result:
            raise RuntimeError(f"page script failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
            self.proc.wait(5)
        except Exception:
            pass
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)  # our own session: Chromium and its helpers
                self.proc.wait(5)
            os.close(self._cmd_w)
            os.close(self._res_r)


@pytest.fixture
def browser(tmp_path: Path):
    chromium_or_skip()
    b = Browser(tmp_path / "chromium-profile")
    try:
        yield b
    finally:
        b.close()


# Waits (inside the page) until each matching video has decoded data or failed, then describes it.
# A video with preload="metadata" may stop at HAVE_METADATA; playing it (muted) makes the browser
# fetch and decode frames, which is what a person clicking play would get.
VIDEO_STATE = """
(async (selector) => {
  const videos = Array.from(document.querySelectorAll(selector));
  const settle = (v) => new Promise((resolve) => {
    if (v.readyState >= 2 || v.error) return resolve();
    v.addEventListener('loadeddata', resolve, {once: true});
    v.addEventListener('error', resolve, {once: true});
    setTimeout(resolve, 60000);
    v.muted = true;
    v.play().catch(() => {});
  });
  await Promise.all(videos.map(settle));
  return videos.map((v) => ({readyState: v.readyState, duration: v.duration, width: v.videoWidth,
                             height: v.videoHeight, error: v.error ? v.error.code : null,
                             src: (v.currentSrc || v.src).slice(0, 30)}));
})(%s)
"""


def video_states(browser: Browser, selector: str) -> list[dict]:
    return browser.evaluate(VIDEO_STATE % json.dumps(selector), timeout=90)




@pytest.mark.parametrize("self_contained", [False, True], ids=["linked", "self-contained"])
def test_standalone_page_in_chromium_shows_the_summary_and_plays_the_failed_video(
    tmp_path: Path, browser: Browser, self_contained: bool
) -> None:
    video = record_failed_episode(tmp_path / "videos")
    records = episode_records(video)
    page = write_standalone_page(tmp_path / "report.html", aggregate(records), records,
                                 verdicts={TASK: {"verdict": "regression", "baseline_rate": 1.0}},
                                 self_contained=self_contained)
    if self_contained:  # the page must not need the video directory any more
        shutil.rmtree(tmp_path / "videos")
    browser.open(page.as_uri())

    rendered = browser.evaluate("""(() => ({
        rows: Array.from(document.querySelectorAll('table.hud-tasks tbody tr')).map(r => r.dataset.task),
        bars: document.querySelectorAll('svg.hud-chart rect.hud-bar').length,
        whiskers: document.querySelectorAll('svg.hud-chart .hud-whisker').length,
        chartWidth: document.querySelector('svg.hud-chart').getBoundingClientRect().width,
        episodes: document.querySelectorAll('table.hud-episode-table tbody tr.hud-passed, '
                                            + 'table.hud-episode-table tbody tr.hud-failed, '
                                            + 'table.hud-episode-table tbody tr.hud-error').length,
        verdicts: Array.from(document.querySelectorAll('table.hud-tasks td.hud-verdict'))
                       .map(td => td.textContent),
    }))()""")
    assert rendered["rows"] == ["evals/test_pusht.py::test_hard", TASK]
    assert rendered["bars"] == 1 and rendered["whiskers"] == 1 and rendered["chartWidth"] > 100
    assert rendered["episodes"] == 5 and rendered["verdicts"] == ["-", "regression"]

    [state] = video_states(browser, "video.hud-video")
    assert state["error"] is None, state
    assert state["readyState"] >= 2 and state["duration"] > 0, state
    assert (state["width"], state["height"]) == (64, 48)
    assert state["src"].startswith("data:video/mp4" if self_contained else "file://")


PYTEST_HTML_CONFTEST = """
import pytest
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from pytest_hud.core.contract import Contract
from pytest_hud.client.episode import EpisodeResult
from pytest_hud.report.pytest_html import HtmlReportHooks
from pytest_hud.recording.video import VideoRecorder
from pytest_hud.core.results import EpisodeRecord, aggregate

VIDEOS = Path(__file__).parent / "videos"
RECORDS = []
CONTRACT = Contract.from_dict({"control_rate": 10, "features": {
    "action": {"role": "action", "type": "box", "dtype": "float32", "shape": [1]},
    "cam": {"role": "observation", "type": "rgb", "dtype": "uint8", "shape": [30, 40, 3]},
}})


def pytest_configure(config):
    # as the plugin does: the hooks only where pytest-html renders (the controller)
    if config.pluginmanager.hasplugin("html") and not hasattr(config, "workerinput"):
        summary = lambda: (aggregate(RECORDS), {"t.py::test_episode": {"verdict": "inconclusive"}}, None)
        config.pluginmanager.register(HtmlReportHooks(config, summary), "hud-html")


@pytest.fixture(scope="session")
def recorder():
    rec = VideoRecorder(VIDEOS, mode="failed")
    yield rec
    rec.close()


@pytest.fixture
def episode(request, recorder):
    def run(seed, success):
        recorder.label_next(request.node.nodeid, str(seed))
        ep = SimpleNamespace(contract=CONTRACT, seed=seed)
        for t in range(8):
            frame = {"cam": np.full((30, 40, 3), 30 * t, np.uint8), "terminated": t == 7}
            (recorder.on_start(ep, frame) if t == 0 else recorder.on_step(np.zeros(1), frame, 0.0))
        result = EpisodeResult(success=success, score=float(success), total_reward=0.0, steps=7,
                               duration_s=0.7, seed=seed)
        recorder.on_end(ep, result, None)
        request.node.hud_result = result
        return result
    return run


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    result = getattr(item, "hud_result", None)
    if report.when == "call" and result is not None:
        item.funcargs["recorder"].flush(30)  # the videos are complete before the report leaves the worker
        report.hud_episode = {"task": "t.py::test_episode", "episode": str(result.seed), "seed": result.seed,
                              "success": result.success, "score": result.score, "steps": result.steps,
                              "duration_s": result.duration_s, "artefacts": dict(result.artefacts)}
    return report


def pytest_runtest_logreport(report):
    ep = getattr(report, "hud_episode", None)
    if ep:
        RECORDS.append(EpisodeRecord(task=ep["task"], episode=ep["episode"], nodeid=report.nodeid,
                                     outcome="passed" if ep["success"] else "failed", seed=ep["seed"],
                                     success=ep["success"], steps=ep["steps"], duration_s=ep["duration_s"]))
"""

PYTEST_HTML_TEST = """
import pytest

@pytest.mark.parametrize("seed", range(4))
def test_episode(episode, seed):
    assert episode(seed, success=seed % 2 == 0).success

def test_not_an_episode():
    pass
"""


@pytest.mark.parametrize(
    "args",
    [("-n", "2", "--self-contained-html"), ("-p", "no:xdist")],
    ids=["xdist-self-contained", "linked"],
)
def test_pytest_html_report_in_chromium_has_episode_columns_summary_and_playable_videos(
    pytester: pytest.Pytester, tmp_path: Path, browser: Browser, args: tuple[str, ...]
) -> None:
    pytest.importorskip("pytest_html")
    if "-n" in args:
        pytest.importorskip("xdist")
    pytest.importorskip("av", reason="PyAV is needed to record the videos (pytest-hud[video])")
    pytester.makeconftest(PYTEST_HTML_CONFTEST)
    pytester.makepyfile(t=PYTEST_HTML_TEST)
    result = pytester.runpytest_subprocess("t.py", "-p", "no:hud", "-p", "no:cacheprovider", "--html",
                                           "out/report.html", *args, timeout=120)
    result.assert_outcomes(passed=3, failed=2)
    report = pytester.path / "out" / "report.html"
    assert report.exists()
    if "--self-contained-html" in args:  # one file: the video directory is not needed to play them
        shutil.rmtree(pytester.path / "videos")
    browser.open(report.as_uri())

    rendered = browser.evaluate("""(() => ({
        headers: Array.from(document.querySelectorAll('#results-table-head th'))
                      .map(th => th.textContent.trim()),
        tasks: Array.from(document.querySelectorAll('td.col-hud_task')).map(td => td.textContent),
        seeds: Array.from(document.querySelectorAll('td.col-hud_seed')).map(td => td.textContent).sort(),
        summaryRows: document.querySelectorAll('.hud-summary table.hud-tasks tbody tr').length,
        chart: document.querySelectorAll('.hud-summary svg.hud-chart rect.hud-bar').length,
        verdict: (document.querySelector('.hud-summary td.hud-verdict') || {}).textContent,
    }))()""")
    assert rendered["headers"][:9] == ["Result", "Test", "Task", "Episode", "Seed", "Success", "Score",
                                       "Steps", "Episode time"]
    assert sorted(rendered["tasks"]) == [""] + ["t.py::test_episode"] * 4  # the non-episode test: empty
    assert rendered["seeds"] == ["", "0", "1", "2", "3"]
    assert rendered["summaryRows"] == 1 and rendered["chart"] == 1 and rendered["verdict"] == "inconclusive"

    states = video_states(browser, ".hud-video-extra video")
    assert len(states) == 2  # the two failed episodes, nothing for the passed ones
    for state in states:
        assert state["error"] is None and state["readyState"] >= 2 and state["duration"] > 0, state
        assert (state["width"], state["height"]) == (40, 30)
        assert state["src"].startswith("data:video/mp4" if "--self-contained-html" in args else "file://")
