"""The live progress line: progress first, success second, no number that reads as the other."""

from __future__ import annotations

from pytest_hud.controller.ledger import Ledger
from pytest_hud.controller.progress import Progress, progress_record
from pytest_hud.core.results import EpisodeRecord, aggregate


def _records(n_pass: int, n_fail: int, errors: int = 0, start: float = 1000.0) -> list[EpisodeRecord]:
    out = []
    for i in range(n_pass + n_fail + errors):
        outcome = "passed" if i < n_pass else "failed" if i < n_pass + n_fail else "error"
        out.append(EpisodeRecord(task="t.py::test_soak", episode=str(i), nodeid=f"t.py::test_soak[{i}]",
                                 outcome=outcome, success=None if outcome == "error" else outcome == "passed",
                                 duration_s=1.0, finished_at=start + 1.0 + i))
    return out


def test_a_task_at_100_percent_success_early_in_a_long_run_does_not_read_as_done():
    tasks = aggregate(_records(221, 0), {"t.py::test_soak": 10000})
    line = Progress(done=221, total=10000, ran=221, elapsed_s=88.4, tasks=tasks).line()
    assert line.startswith("hud progress: 221 of 10000 episodes done, 150/min, about 1h05m left | success so far: ")
    assert line.endswith("test_soak 221/221 = 100% [98-100%]")
    assert "100% (" not in line


def test_errors_unstarted_tasks_and_an_unknown_rate_are_named():
    tasks = aggregate(_records(1, 2, errors=2), {"t.py::test_soak": 10, "t.py::test_other": 5})
    line = Progress(done=5, total=15, ran=0, elapsed_s=0.0, tasks=tasks).line()
    assert "5 of 15 episodes done, rate -, time left - |" in line
    assert "test_other none graded yet" in line
    assert "test_soak 1/3 = 33% [6-79%], 2 errors" in line


def test_the_ledger_times_the_rate_from_the_first_episode_start_and_the_record_carries_the_line():
    ledger = Ledger()
    ledger.declare([{"nodeid": f"t.py::test_soak[{i}]", "task": "t.py::test_soak", "episode": str(i)}
                    for i in range(40)])
    for rec in _records(15, 5):
        ledger.add(rec)
    progress = ledger.progress(now=1000.0 + 60.0)  # first start at 1000.0, 20 episodes in a minute
    assert (progress.done, progress.total, progress.per_min, progress.eta_s) == (20, 40, 20.0, 60.0)
    record = progress_record(progress)
    assert record["record"] == "progress" and record["line"] == progress.line()
    assert "about 1m00s left" in record["line"]
    assert record["tasks"]["t.py::test_soak"]["successes"] == 15


def test_many_tasks_name_the_lowest_rates_and_count_the_rest():
    from pytest_hud.core.results import TaskSummary

    def task(n, successes):
        rate = successes / n if n else None
        return TaskSummary(f"t.py::test_t[{n}-{successes}]", n, successes, 0, 0, 10, rate,
                           None if rate is None else max(0.0, rate - 0.2), None if rate is None else min(1.0, rate + 0.2),
                           None, None, None)

    tasks = {s.task: s for s in (task(10, 9), task(10, 2), task(0, 0), task(10, 10), task(10, 5), task(10, 7), task(0, 0))}
    line = Progress(done=50, total=70, ran=50, elapsed_s=60.0, tasks=tasks).line()
    tail = line.split("success so far: ", 1)[1]
    assert tail.startswith("lowest test_t[10-2] 2/10 = 20%")
    assert [p.split(" ")[0] for p in tail.split("; ")[1:3]] == ["test_t[10-5]", "test_t[10-7]"]
    assert tail.endswith("; 2 more tasks graded; 1 task none graded yet")  # two ids alike: one entry
    assert len(line) < 240  # bounded whatever the number of tasks
