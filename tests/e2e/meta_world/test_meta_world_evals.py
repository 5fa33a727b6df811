"""The shipped Meta-World suites run as a user runs them: every episode graded, experts near 100 %.

Skipped without Meta-World (``pip install "pytest-hud[metaworld]"``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("metaworld", reason='Meta-World is not installed: pip install "pytest-hud[metaworld]"')

from pytest_hud.core.results import load_results  # noqa: E402

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[3]
MT10 = ("reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3", "drawer-close-v3",
        "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3")


def pytest_evals(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=880)


def check_suite(out: subprocess.CompletedProcess, results: Path, test: str, per_task: int, min_successes: int) -> None:
    assert out.returncode in (0, 1), out.stdout[-3000:] + out.stderr[-3000:]
    n = per_task * len(MT10)
    assert f"coverage: {n}/{n} declared episodes reported, {n} graded, 0 errors" in out.stdout, out.stdout[-3000:]
    for task in MT10:  # one summary row per task, with its rate (long ids are cut at the front)
        row = re.compile(rf"(::{test}|…[\w.:]*)\[task={re.escape(task)}\] +{per_task} +\d+ +[\d.]+%")
        assert sum(bool(row.search(line)) for line in out.stdout.splitlines()) == 1, out.stdout[-3000:]
    loaded = load_results(results)
    assert sorted({r.task.rpartition("=")[2].rstrip("]") for r in loaded.episodes}) == sorted(MT10)
    assert sum(bool(r.success) for r in loaded.episodes) >= min_successes


def test_the_mt10_state_suite_runs_in_one_multi_task_bridge(tmp_path):
    results = tmp_path / "state.jsonl"
    out = pytest_evals("evals/test_meta_world.py", "-n", "2", "--hud-width=2", f"--hud-results={results}")
    check_suite(out, results, "test_mt10", 10, 95)  # the experts: 98/100 here
    # One sim (the ten tasks are claims, not builds), run by one bridge that both workers shared:
    # the results file's summary lists each sim with every bridge the run started for it.
    (sim,) = load_results(results).provenance["sims"]
    assert sim["build"] == {} and len(sim["bridges"]) == 1, sim


def test_the_mt10_pixel_suite_renders_and_runs(tmp_path):
    results = tmp_path / "pixels.jsonl"
    out = pytest_evals("evals/test_meta_world_pixels.py", "-n", "2", "--hud-width=2", f"--hud-results={results}")
    check_suite(out, results, "test_mt10_pixels", 2, 18)
