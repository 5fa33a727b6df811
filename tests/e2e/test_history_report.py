"""A series of runs as a picture: real pytest runs of the CartPole suite, then ``report --history``.

Three checkpoints in order (the final CEM policy, an earlier one, the final again) are three results
files; a checkpoint sweep is one run whose test takes the checkpoint as a parameter, with one
bridge for both. The gate's tests mark the drop and the recovery, and the best run is named with
a statement corrected for having compared every run with every other.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_hud.core.results import load_results

pytestmark = pytest.mark.timeout(400)

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ROOT / "evals" / "policies" / "numpy_policies.py"


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest_hud", "report", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def series(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three real runs of evals/test_cartpole.py: final, early, final (32 seeded episodes each)."""
    out = tmp_path_factory.mktemp("series")
    for i, policy in enumerate(("cartpole", "cartpole_early", "cartpole")):
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "evals/test_cartpole.py", "-n", "2",
             f"--hud-policy={POLICIES}:{policy}", f"--hud-results={out / f'{i}-{policy}.jsonl'}"],
            cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_the_history_of_three_checkpoints_marks_the_drop_and_the_recovery(series, tmp_path):
    files = sorted(str(p) for p in series.glob("*.jsonl"))
    out = cli("--history", *files, "--markdown", "--html", str(tmp_path / "h.html"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    md = out.stdout
    # Labelled by checkpoint from each run's provenance; the earlier checkpoint's 22/32 drop and
    # the recovery are marked, each with the gate's paired test and its Holm-adjusted p.
    assert "| task | policies/numpy_policies.py:cartpole #1 | policies/numpy_policies.py:cartpole_early |" in md
    assert "| `test_cartpole.py::test_balance` | 100% (32/32) | 69% (22/32) ▼ | 100% (32/32) ▲ |" in md
    assert "▼ test_cartpole.py::test_balance: policies/numpy_policies.py:cartpole #1 100% -> " in md
    assert "(paired-mcnemar, p=0.00098, Holm p=0.0039)" in md
    assert ("Best: policies/numpy_policies.py:cartpole #2, 32/32 = 100.0% over the 1 task every run has."
            " Each run was compared with every other (6 one-sided exact tests, Holm-adjusted") in md
    assert "significantly better than policies/numpy_policies.py:cartpole_early" in md
    assert "not distinguishable from policies/numpy_policies.py:cartpole #1 (adjusted p=1)" in md
    page = (tmp_path / "h.html").read_text()
    assert page.count('class="hud-history-chart"') == 1 and page.count('data-change="down"') == 1


def test_a_folder_is_a_series_in_the_order_its_runs_started(series, tmp_path):
    out = cli("--history", str(series), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    header = out.stdout.splitlines()[0].split()
    assert header[1:] == ["policies/numpy_policies.py:cartpole", "#1", "policies/numpy_policies.py:cartpole_early",
                          "policies/numpy_policies.py:cartpole", "#2"]
    assert (tmp_path / "hud-history.html").is_file()  # the page's default path


def test_bad_history_input_is_a_usage_error_that_names_the_fix(series, tmp_path):
    one = next(iter(series.glob("*.jsonl")))
    lonely = cli("--history", str(one), cwd=tmp_path)
    assert lonely.returncode == 4 and "--history needs two or more results files" in lonely.stderr
    several = cli(str(one), str(one), cwd=tmp_path)
    assert several.returncode == 4 and "or --history for a series of runs" in several.stderr
    sweep = cli("--history", "--sweep", "checkpoint", str(one), cwd=tmp_path)
    assert sweep.returncode == 4 and "has the parameter 'checkpoint'" in sweep.stderr


SWEEP = f'''
import pytest

pytestmark = pytest.mark.hud(sim={str(ROOT / "evals" / "sims" / "classic.py") + ":cartpole"!r})


CHECKPOINTS = {{"step_1000": "cartpole", "step_900": "cartpole_early"}}  # the CEM run's checkpoints by step


@pytest.mark.parametrize("checkpoint", list(CHECKPOINTS))
@pytest.mark.parametrize("seed", range(32))
def test_balance(shared_sim, robot_agent, checkpoint, seed):
    robot_agent.policy = {str(POLICIES)!r} + ":" + CHECKPOINTS[checkpoint]
    assert robot_agent.run(shared_sim.episode(seed=seed)).success
'''


def test_a_checkpoint_sweep_in_one_run_shares_one_bridge_and_names_the_best(pytester: pytest.Pytester):
    pytester.makepyfile(test_sweep=SWEEP)
    run = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--hud-width=2",
                                        "--hud-results=sweep.jsonl", timeout=300)
    run.assert_outcomes(passed=54, failed=10)
    (sim,) = load_results(pytester.path / "sweep.jsonl").provenance["sims"]
    assert len(sim["bridges"]) == 1  # both checkpoints' episodes ran in one bridge
    out = cli("--history", "--sweep", "checkpoint", "sweep.jsonl", "--markdown", cwd=pytester.path)
    assert out.returncode == 0, out.stderr
    assert "| task | step_900 | step_1000 |" in out.stdout  # checkpoints in natural order, not as strings
    assert "| `test_sweep.py::test_balance` | 69% (22/32) | 100% (32/32) ▲ |" in out.stdout
    assert "Best: step_1000, 32/32 = 100.0%" in out.stdout and "(2 one-sided exact tests" in out.stdout
    assert "step_1000 is significantly better than step_900." in out.stdout
