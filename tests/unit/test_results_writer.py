"""The results file's writer: each line is in the file at once, the fsync never holds up the run."""

from __future__ import annotations

import os
import threading
import time

from pytest_hud.core.results import EpisodeRecord, ResultsWriter, load_results


def test_an_episode_is_written_at_once_while_its_fsync_runs_apart_and_close_waits_for_the_last(tmp_path, monkeypatch):
    disk = threading.Event()  # the disk answers when the test says so
    synced: list[int] = []
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        disk.wait(10)
        synced.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    path = tmp_path / "r.jsonl"
    writer = ResultsWriter(path, {}, "run-1")  # its header is written; its fsync waits for the disk
    wrote = threading.Event()

    def write_two() -> None:
        for seed in (1, 2):
            writer.episode(EpisodeRecord(task="t", episode=str(seed), nodeid=f"t[{seed}]", outcome="passed",
                                         success=True, seed=seed))
        wrote.set()

    threading.Thread(target=write_two, daemon=True).start()
    assert wrote.wait(30), "writing an episode waited for the disk"
    assert not synced  # the disk has not answered yet: both lines are written, and readable
    assert [e.seed for e in load_results(path).episodes] == [1, 2]
    closed = threading.Event()
    threading.Thread(target=lambda: (writer.close(), closed.set()), daemon=True).start()
    assert not closed.wait(0.2)  # close waits for the fsync under way
    disk.set()
    assert closed.wait(30)
    assert synced  # the lines written during an fsync share the next one, done before close returned


def test_episodes_written_in_a_burst_share_one_fsync_per_interval_and_close_syncs_the_rest(tmp_path, monkeypatch):
    synced: list[float] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(time.monotonic()), real_fsync(fd)))
    monkeypatch.setattr(ResultsWriter, "sync_interval", 60.0)  # longer than the test: only close() ends the pause
    path = tmp_path / "r.jsonl"
    writer = ResultsWriter(path, {}, "run-1")
    deadline = time.monotonic() + 30
    while not synced and time.monotonic() < deadline:  # the header's fsync, at once
        time.sleep(0.01)
    assert len(synced) == 1
    for seed in range(50):  # each line is in the file at once, none wakes the syncer
        writer.episode(EpisodeRecord(task="t", episode=str(seed), nodeid=f"t[{seed}]", outcome="passed",
                                     success=True, seed=seed))
        assert len(load_results(path).episodes) == seed + 1
    time.sleep(0.2)
    assert len(synced) == 1
    writer.close()  # ends the pause: the 50 lines share one fsync before close returns
    assert len(synced) == 2


def test_lines_written_after_an_interval_are_synced_without_waiting_for_close(tmp_path, monkeypatch):
    synced: list[float] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(time.monotonic()), real_fsync(fd)))
    monkeypatch.setattr(ResultsWriter, "sync_interval", 0.05)
    writer = ResultsWriter(tmp_path / "r.jsonl", {}, "run-1")
    try:
        for seed in range(3):
            before = len(synced)
            writer.episode(EpisodeRecord(task="t", episode=str(seed), nodeid=f"t[{seed}]", outcome="passed",
                                         success=True, seed=seed))
            deadline = time.monotonic() + 30
            while len(synced) == before and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(synced) > before, "a line written was never fsynced while the file stayed open"
    finally:
        writer.close()
