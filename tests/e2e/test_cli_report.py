"""``python -m pytest_hud report``: the summary table, markdown, and the gate on two results files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from pytest_hud.core.results import EpisodeRecord, ResultsWriter, aggregate

TASK = "evals/test_cartpole.py::test_balance"
OTHER = "evals/test_pendulum.py::test_swing_up"


def write_results(path: Path, rates: dict[str, tuple[int, int]], *, errors: int = 0,
                  summary: bool = True) -> Path:
    """A results file as the plugin writes it: ``rates`` maps task -> (successes, episodes)."""
    writer = ResultsWriter(path, provenance={"policy": "policies/good.pt", "sim": "CartPole-v1"}, run_id="r1")
    records = []
    for task, (succ, n) in rates.items():
        for i in range(n):
            ok = i < succ
            records.append(EpisodeRecord(task=task, episode=str(i), nodeid=f"{task}[{i}]", seed=i,
                                         outcome="passed" if ok else "failed", success=ok, score=float(ok),
                                         total_reward=500.0 if ok else 80.0, steps=500 if ok else 80,
                                         duration_s=1.5))
        for j in range(errors):
            records.append(EpisodeRecord(task=task, episode=str(n + j), nodeid=f"{task}[{n + j}]", seed=n + j,
                                         outcome="error", error="TimeoutError: slot 0 sent no action"))
    for rec in records:
        writer.episode(rec)
    if summary:
        tasks = aggregate(records)
        coverage = {"declared": len(records), "reported": len(records),
                    "graded": sum(t.n for t in tasks.values()),
                    "errors": sum(t.errors for t in tasks.values()),
                    "skipped": 0, "missing": []}
        writer.summary(tasks, coverage, {"policy": "policies/good.pt"})
    writer.close()
    return path


def hud(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest_hud", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60)


@pytest.fixture
def good(tmp_path: Path) -> Path:
    return write_results(tmp_path / "good.jsonl", {TASK: (48, 50), OTHER: (30, 50)})


def test_a_task_whose_episodes_all_errored_shows_no_throughput() -> None:
    records = [EpisodeRecord(task="t", episode=str(i), nodeid=f"t[{i}]", seed=i, outcome="error",
                             error="BadAction", duration_s=0.004, finished_at=100.0 + i * 0.004) for i in range(2)]
    records.append(EpisodeRecord(task="u", episode="0", nodeid="u[0]", seed=0, outcome="passed", success=True,
                                 duration_s=2.0, finished_at=100.0))
    tasks = aggregate(records)
    assert tasks["t"].errors == 2 and tasks["t"].episodes_per_hour is None
    assert tasks["u"].episodes_per_hour == pytest.approx(1800.0)


def test_report_prints_the_summary_table(good: Path, tmp_path: Path) -> None:
    proc = hud("report", str(good), "--width", "120", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == f"results: {good}"
    assert lines[1].split()[:4] == ["task", "n", "succ", "rate"]
    row = next(line for line in lines if line.startswith(TASK))
    assert row.split()[1:4] == ["50", "48", "96.0%"]
    assert "verdict" not in lines[1] and "gate:" not in proc.stdout


def test_report_markdown_prints_a_github_table(good: Path, tmp_path: Path) -> None:
    proc = hud("report", str(good), "--markdown", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("### pytest-hud results")
    assert "| Task | n | Successes | Rate | 95% CI | Errors | Mean return |\n" in proc.stdout
    assert f"| `{TASK}` | 50 | 48 | 96.0% |" in proc.stdout
    assert "Coverage: 100/100 declared episodes reported" in proc.stdout


def test_compare_with_an_identical_run_passes(good: Path, tmp_path: Path) -> None:
    same = write_results(tmp_path / "same.jsonl", {TASK: (48, 50), OTHER: (30, 50)})
    proc = hud("report", str(same), "--compare", str(good), "--width", "140", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "verdict" in proc.stdout.splitlines()[2]
    assert "regression" not in proc.stdout
    assert proc.stdout.rstrip().endswith("gate: PASS")


def test_compare_finds_a_clear_regression_and_exits_1(good: Path, tmp_path: Path) -> None:
    worse = write_results(tmp_path / "worse.jsonl", {TASK: (20, 50), OTHER: (30, 50)})
    proc = hud("report", str(worse), "--compare", str(good), "--width", "140", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith(TASK))
    assert "regression" in row
    assert f"regression: {TASK}:" in proc.stdout  # the gate's reason, on its own line
    assert proc.stdout.rstrip().endswith("gate: FAIL (1 of 2 tasks)")

    md = hud("report", str(worse), "--compare", str(good), "--markdown", cwd=tmp_path)
    assert md.returncode == 1
    assert "| Task | baseline | current | Change | p (adj.) | Verdict |" in md.stdout
    assert f"| `{TASK}` | 96.0% (n=50) | 40.0% (n=50) | -56.0 pts |" in md.stdout
    assert "❌ regression" in md.stdout


def test_a_tolerated_drop_is_not_a_regression(tmp_path: Path) -> None:
    # 8 of 100 paired episodes lost, none gained: a significant drop (McNemar p = 2**-8, Holm-adjusted
    # 2**-7), so without a tolerance it is a regression; an 8-point drop is within --max-drop 0.1.
    base = write_results(tmp_path / "base.jsonl", {TASK: (100, 100), OTHER: (30, 50)})
    slightly = write_results(tmp_path / "slightly.jsonl", {TASK: (92, 100), OTHER: (30, 50)})

    def row(proc: subprocess.CompletedProcess) -> str:
        return next(line for line in proc.stdout.splitlines() if line.startswith(TASK))

    strict = hud("report", str(slightly), "--compare", str(base), "--width", "160", cwd=tmp_path)
    assert strict.returncode == 1, strict.stdout + strict.stderr
    assert "regression" in row(strict) and strict.stdout.rstrip().endswith("gate: FAIL (1 of 2 tasks)")
    tolerant = hud("report", str(slightly), "--compare", str(base), "--width", "160", "--max-drop", "0.1",
                   cwd=tmp_path)
    assert tolerant.returncode == 0, tolerant.stdout + tolerant.stderr
    assert "regression" not in tolerant.stdout and tolerant.stdout.rstrip().endswith("gate: PASS")


def test_errored_episodes_count_against_coverage_not_as_failures(good: Path, tmp_path: Path) -> None:
    crashy = write_results(tmp_path / "crashy.jsonl", {TASK: (48, 50), OTHER: (30, 50)}, errors=20)
    proc = hud("report", str(crashy), "--compare", str(good), "--width", "140", cwd=tmp_path)
    assert proc.returncode == 1
    row = next(line for line in proc.stdout.splitlines() if line.startswith(TASK))
    assert row.split()[1:3] == ["50", "48"] and "insufficient coverage" in row


def test_a_file_from_a_killed_run_still_reports(tmp_path: Path) -> None:
    partial = write_results(tmp_path / "partial.jsonl", {TASK: (3, 4)}, summary=False)
    proc = hud("report", str(partial), cwd=tmp_path)
    assert proc.returncode == 0
    assert "(incomplete)" in proc.stdout and "no summary line" in proc.stderr


def test_missing_and_invalid_files_are_clear_errors_with_exit_4(good: Path, tmp_path: Path) -> None:
    proc = hud("report", str(tmp_path / "nope.jsonl"), cwd=tmp_path)
    assert proc.returncode == 4
    assert "nope.jsonl" in proc.stderr and "does not exist" in proc.stderr and "Traceback" not in proc.stderr

    junk = tmp_path / "junk.json"
    junk.write_text('{"hello": "world"}\n')
    proc = hud("report", str(good), "--compare", str(junk), cwd=tmp_path)
    assert proc.returncode == 4
    assert "BASELINE" in proc.stderr and "not a pytest-hud results" in proc.stderr

    proc = hud("report", str(good), "--compare", str(good), "--alpha", "2", cwd=tmp_path)
    assert proc.returncode == 4 and "alpha" in proc.stderr

    assert hud("report", cwd=tmp_path).returncode == 4  # argparse: RESULTS is required


def test_report_can_also_write_the_html_page(good: Path, tmp_path: Path) -> None:
    page = tmp_path / "out" / "report.html"
    proc = hud("report", str(good), "--html", str(page), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and 'class="hud-summary"' in html and "<svg" in html


def test_a_run_gated_by_pytest_shows_its_recorded_verdicts(tmp_path: Path) -> None:
    path = tmp_path / "gated.jsonl"
    writer = ResultsWriter(path, provenance={}, run_id="r2")
    records = [EpisodeRecord(task=TASK, episode=str(i), nodeid=f"n{i}", outcome="passed", success=True)
               for i in range(5)]
    for rec in records:
        writer.episode(rec)
    gate = {"passed": True, "verdicts": [{"task": TASK, "verdict": "inconclusive", "more_episodes_needed": 45,
                                          "reason": "too few episodes"}]}
    writer.summary(aggregate(records), {}, {}, gate=gate)
    writer.close()
    proc = hud("report", str(path), "--width", "140", cwd=tmp_path)
    assert proc.returncode == 0  # verdicts recorded by pytest are shown; only --compare decides
    row = next(line for line in proc.stdout.splitlines() if line.startswith(TASK))
    assert row.endswith("inconclusive (+45 ep)")
    assert "inconclusive: evals/test_cartpole.py::test_balance: too few episodes" in proc.stdout
