"""Drills: the pytest controller is interrupted or killed mid-run (DESIGN §3, §9).

A real ``python -m pytest -n 2`` run of a small project in its own session; the drill signals the
controller itself (not its process group) once bridges are up and episodes are running. Then,
within a few seconds (the tests wait up to 30 s, for a loaded machine): no bridge (nor worker) of
that run is left, no file holding the run's secret is left, and every episode whose PASSED/FAILED
line was printed is in the results file, which a resumed run completes without running those
episodes again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from conftest import SIMKIT
from pytest_hud.core.results import EpisodeRecord, ResultsWriter, load_results

LENGTH = 40
SIMS = f'''
from simkit import CounterSim

def counter(num_envs):
    return CounterSim(num_envs, length={LENGTH})
'''
POLICIES = '''
import numpy as np

def zero():
    return lambda obs: np.zeros(1, np.float32)
'''
INI = """
[pytest]
hud_sim = sims:counter
hud_policy = policies:zero
hud_progress_interval = 0
hud_inline = never
asyncio_default_fixture_loop_scope = function
"""  # (the drill is about bridges: the counter sim's cheap steps would otherwise run in the workers)
EPISODES = '''
import os, time, pytest

@pytest.mark.parametrize("seed", range({n}))
def test_episode(shared_sim, robot_agent, seed):
    with open("ran.txt", "a") as fh:
        fh.write(f"{{seed}} {{shared_sim.stats()['pid']}}\\n")
    result = robot_agent.run(shared_sim.episode(seed=seed))
    time.sleep(float(os.environ.get("DRILL_SLEEP", "0")))
    assert result.success  # CounterSim: seeds 0..4 fail, the others succeed
'''


def make_project(path: Path, episodes: int) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    for name, text in {"simkit.py": SIMKIT.read_text(), "sims.py": SIMS, "policies.py": POLICIES,
                       "pytest.ini": INI, "test_drill.py": EPISODES.format(n=episodes)}.items():
        (path / name).write_text(text)
    return path


class Run:
    """``python -m pytest`` in its own session; stdout lines collected as they come."""

    def __init__(self, path: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=path,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
            env=dict(os.environ, **(env or {})),
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, what, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not what():
            assert self.proc.poll() is None, "the run ended early:\n" + "\n".join(self.lines[-40:])
            assert time.monotonic() < deadline, "timed out; output:\n" + "\n".join(self.lines[-40:])
            time.sleep(0.02)

    def finish(self, timeout: float = 60.0) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(5)
        return code

    def output(self, timeout: float = 30.0) -> list[str]:
        """Every line the run printed: the pipe closes only when the last process holding it (a
        worker still exiting, on a loaded machine) is gone, so wait for the reader to reach its end."""
        self._reader.join(timeout)
        assert not self._reader.is_alive(), "the run's output did not close"
        return self.lines

    def cleanup(self) -> None:
        """Whatever a failed drill left behind (the run's own session only)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait(10)


def ran(path: Path) -> list[tuple[int, int]]:
    """(seed, bridge pid) of every episode started so far.

    The workers append to the file while it is read: only complete lines count (a line without its
    newline may still be being written, e.g. a seed without its pid yet).
    """
    try:
        text = (path / "ran.txt").read_text()
    except FileNotFoundError:
        return []
    complete = text.split("\n")[:-1]  # the last piece is either empty or a line still being written
    return [(int(seed), int(pid)) for seed, pid in (line.split() for line in complete)]


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def in_groups(pgids: set[int]) -> list[psutil.Process]:
    """Live (non-zombie) processes in these process groups: a bridge's own session holds any
    sub-processes it started (async vectorization), the run's session holds its workers."""
    found = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) in pgids:
                found.append(p)
        except (ProcessLookupError, psutil.NoSuchProcess):
            pass
    return alive(found)


def bridges_of(controller_pid: int) -> list[psutil.Process]:
    """Bridge processes spawned for this controller, found by their command line (they outlive
    their parent link once re-parented, so a parent-chain walk alone would miss orphans)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "pytest_hud.bridge" in cmd and "--parent-pid" in cmd:
            if cmd[cmd.index("--parent-pid") + 1] == str(controller_pid):
                found.append(p)
    return alive(found)


# ============================================================================== 6. teardown
@pytest.mark.timeout(180)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
                         ids=["SIGINT", "SIGTERM", "SIGKILL"])
def test_no_bridge_or_secret_outlives_an_interrupted_or_killed_controller(tmp_path, sig):
    project = make_project(tmp_path / "project", 200)
    tmp = tmp_path / "tmp"  # the pool's work dir (announce files with the secret) lands here
    tmp.mkdir()
    run = Run(project, "-n", "2", "--hud-width=1", "-v", env={"TMPDIR": str(tmp), "DRILL_SLEEP": "0.05"})
    try:
        run.wait_for(lambda: len({pid for _, pid in ran(project)}) == 2)  # one bridge per worker, both busy
        descendants = psutil.Process(run.proc.pid).children(recursive=True)
        announced = {pid for _, pid in ran(project)}
        (workdir,) = tmp.glob("pytest-hud-*")
        secrets = {json.loads(f.read_text())["secret"] for f in workdir.glob("*.json")}
        assert len(secrets) == 1 and len(bridges_of(run.proc.pid)) == 2
        started = time.monotonic()
        os.kill(run.proc.pid, sig)
        code = run.finish(30)
        deadline = time.monotonic() + 30  # bounded, generous: a loaded machine may be slow to reap them
        groups = announced | {run.proc.pid}  # each bridge leads its own session; the run has one too

        def left() -> list[psutil.Process]:
            return alive(descendants) + bridges_of(run.proc.pid) + in_groups(groups)

        while left() and time.monotonic() < deadline:
            time.sleep(0.05)
        gone_after = time.monotonic() - started
        assert not left(), [(p.pid, p.cmdline()) for p in left()]
        assert not alive([psutil.Process(pid) for pid in announced if psutil.pid_exists(pid)])
        remaining = sorted(p.name for p in workdir.iterdir()) if workdir.exists() else None
        print(f"\n{sig.name}: every bridge and worker gone {gone_after:.2f} s after the signal; "
              f"pool dir {'removed' if remaining is None else f'left with {remaining}'}")
        # nothing that holds the run's secret is left, whatever the signal
        leftovers = [f for f in tmp.rglob("*") if f.is_file()]
        holding = [f for f in leftovers if any(s in f.read_text(errors="replace") for s in secrets)]
        assert not holding, leftovers
        assert not list(tmp.rglob("bridge-*.json"))
        if sig == signal.SIGINT:
            assert remaining is None  # an orderly stop removes the whole dir
            lines = run.output()
            assert any("KeyboardInterrupt" in line or "Interrupted" in line for line in lines), \
                f"exit code {code}; the run's last lines:\n" + "\n".join(lines[-40:])  # (the summary may follow it)
    finally:
        run.cleanup()


@pytest.mark.timeout(180)
def test_sigterm_to_the_controller_removes_the_pool_dir(tmp_path):
    project = make_project(tmp_path / "project", 200)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    run = Run(project, "-n", "2", "--hud-width=1", env={"TMPDIR": str(tmp), "DRILL_SLEEP": "0.05"})
    try:
        run.wait_for(lambda: len({pid for _, pid in ran(project)}) == 2)
        os.kill(run.proc.pid, signal.SIGTERM)
        run.finish(30)
        deadline = time.monotonic() + 30
        while list(tmp.glob("pytest-hud-*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not list(tmp.glob("pytest-hud-*"))
    finally:
        run.cleanup()


# ============================================================================ 7. nothing lost
def per_episode(path: Path) -> dict[str, tuple]:
    return {r.nodeid: (r.outcome, r.success, r.steps, r.total_reward)
            for r in load_results(path).latest_episodes()}


@pytest.mark.timeout(300)
def test_a_killed_run_loses_no_finished_episode_and_a_resumed_run_completes_it(tmp_path):
    n = 24
    reference_dir = make_project(tmp_path / "reference", n)
    reference = Run(reference_dir, "-n", "2", "--hud-results=r.jsonl")
    project = make_project(tmp_path / "project", n)
    try:
        assert reference.finish(120) == 1, "\n".join(reference.lines[-30:])  # seeds 0..4 fail by design
        expected = per_episode(reference_dir / "r.jsonl")
        assert len(expected) == n

        started = time.monotonic()
        killed = Run(project, "-n", "2", "-v", "--hud-results=r.jsonl", env={"DRILL_SLEEP": "0.3"})
        try:
            def printed() -> list[str]:
                return [line for line in list(killed.lines) if " PASSED " in line or " FAILED " in line]

            killed.wait_for(lambda: len(printed()) >= n // 3)
            descendants = psutil.Process(killed.proc.pid).children(recursive=True)
            shown = printed()  # snapshot, then kill at once: anything printed later is not counted
            os.kill(killed.proc.pid, signal.SIGKILL)
            killed.finish(30)
        finally:
            killed.cleanup()
        deadline = time.monotonic() + 30
        while alive(descendants) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(descendants)

        before = load_results(project / "r.jsonl")
        assert not before.complete
        on_file = {r.nodeid: r for r in before.latest_episodes()}
        for line in shown:
            outcome, nodeid = line.split()[-2:]
            assert nodeid in on_file, f"{nodeid} was printed {outcome} but is not in the results file"
            assert on_file[nodeid].outcome == outcome.lower(), (nodeid, on_file[nodeid].outcome)
        assert len(on_file) < n, "the run finished before the kill: nothing to resume"
        started_before = len(ran(project))  # episodes started before the kill (some never finished)

        resumed = Run(project, "-n", "2", "--hud-resume=r.jsonl", "--hud-results=r.jsonl")
        assert resumed.finish(120) == 1, "\n".join(resumed.lines[-30:])
        took = time.monotonic() - started
        after = load_results(project / "r.jsonl")
        assert after.complete
        # the finished episodes were reused, not run again; the others ran once more
        new = after.episodes[len(before.episodes):]
        reused = {r.nodeid for r in new if r.reused}
        assert reused == set(on_file), (sorted(reused), sorted(on_file))
        assert sum(s.get("reused", 0) for s in after.summary["tasks"].values()) == len(on_file)
        rerun = {int(k.split("[")[1].rstrip("]")) for k in set(expected) - set(on_file)}
        resumed_seeds = [seed for seed, _ in ran(project)][started_before:]
        assert sorted(resumed_seeds) == sorted(rerun), (sorted(resumed_seeds), sorted(rerun))
        # and the final per-episode results are those of the uninterrupted run
        assert per_episode(project / "r.jsonl") == expected
        print(f"\nnothing-lost drill: {len(shown)} printed before the kill, {len(on_file)} on file, "
              f"{len(reused)} reused, {len(rerun)} run again; kill + resume {took:.1f} s")
    finally:
        reference.cleanup()


def test_resuming_into_a_file_with_a_torn_last_line_keeps_it_readable(tmp_path):
    path = tmp_path / "r.jsonl"
    first = ResultsWriter(path, {}, "killed-run")
    first.episode(EpisodeRecord(task="t", episode="0", nodeid="t[0]", outcome="passed", success=True))
    first.close()
    with open(path, "a", encoding="utf-8") as fh:
        fh.write('{"record": "episode", "task": "t", "epi')  # the kill landed mid-write
    assert [r.episode for r in load_results(path).episodes] == ["0"]
    resumed = ResultsWriter(path, {}, "resumed-run", append=True)
    for i in (1, 2):
        resumed.episode(EpisodeRecord(task="t", episode=str(i), nodeid=f"t[{i}]", outcome="passed",
                                      success=True))
    resumed.close()
    assert [r.episode for r in load_results(path).episodes] == ["0", "1", "2"]
