"""The shipped example evals run as a new user runs them, and the gate demonstration holds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
BASELINE = ROOT / "evals" / "baselines" / "cartpole.jsonl"


def pytest_evals(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=280)


def test_the_example_suites_run_with_eight_workers_on_width_eight(tmp_path):
    out = pytest_evals("evals/", "-n", "8", "--hud-width=8", f"--hud-results={tmp_path / 'r.jsonl'}")
    # 80 numpy-policy episodes, plus 24 LeRobot ones (graded when LeRobot is installed, else skipped)
    assert "coverage: 104/104 declared episodes reported" in out.stdout, out.stdout[-3000:]
    assert ", 0 errors" in out.stdout
    for task in ("test_cartpole.py::test_balance", "test_mountain_car.py::test_reach_the_flag",
                 "test_reach_pixels.py::test_reach_the_goal"):
        assert task in out.stdout
    # The first command ends with a verdict: each suite's floor gates it, and the failed episodes
    # (MountainCar misses the flag on 2 of 24 seeds) are data, not a red run.
    assert out.returncode == 0, out.stdout[-3000:]
    assert "gate: PASSED (" in out.stdout and "failed" in out.stdout.splitlines()[-1]


def test_an_earlier_checkpoint_fails_the_floor_of_the_example_suite(tmp_path):
    """Without a baseline file: the suite's own floor (min_success=0.9) catches the worse checkpoint."""
    out = pytest_evals("evals/test_cartpole.py", "-n", "2",
                       "--hud-policy=evals/policies/numpy_policies.py:cartpole_early",
                       f"--hud-results={tmp_path / 'r.jsonl'}")
    assert out.returncode == 1, out.stdout[-3000:]
    assert "gate: REGRESSION test_cartpole.py::test_balance" in out.stdout and "below the floor 90.0%" in out.stdout


# Each run writes its own results file: evals/pytest.ini's default, hud-results.jsonl in the
# rootdir, would be written by two tests at once under -n 2.
def test_the_earlier_checkpoint_is_a_regression_against_the_committed_baseline(tmp_path):
    out = pytest_evals("evals/test_cartpole.py", "-n", "2",
                       "--hud-policy=evals/policies/numpy_policies.py:cartpole_early",
                       f"--hud-baseline={BASELINE}", f"--hud-results={tmp_path / 'r.jsonl'}")
    assert out.returncode == 1, out.stdout[-3000:]
    assert "gate: REGRESSION test_cartpole.py::test_balance" in out.stdout


def test_the_final_checkpoint_passes_against_its_own_baseline(tmp_path):
    out = pytest_evals("evals/test_cartpole.py", "-n", "2", f"--hud-baseline={BASELINE}",
                       f"--hud-results={tmp_path / 'r.jsonl'}")
    assert out.returncode == 0, out.stdout[-3000:]
    assert "FAILED (" not in out.stdout and "PASSED (" in out.stdout


def test_the_committed_baseline_gates_a_copy_of_the_project_in_another_directory(tmp_path):
    """A CI runner's checkout is not the one the baseline was recorded in: the sim and policy are
    recorded relative to the rootdir, so the same task compares wherever the project lies."""
    import shutil

    copy = tmp_path / "elsewhere" / "evals"
    shutil.copytree(ROOT / "evals", copy, ignore=shutil.ignore_patterns("hud-*", "__pycache__", "*.candidate.jsonl"))
    out = pytest_evals("evals/test_cartpole.py", "-n", "2", f"--hud-results={tmp_path / 'r.jsonl'}",
                       f"--hud-baseline={BASELINE}", cwd=copy.parent)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "INCOMPARABLE" not in out.stdout and "PASSED (" in out.stdout
