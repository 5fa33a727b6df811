"""Memory per episode: does any process of a pytest-hud run grow with the number of episodes?

    python benchmarks/episode_memory.py [--small 2000] [--large 22000] [--workers 2] [--steps 3]

Runs, side by side in one go, four pytest runs with ``-n W``:

1. ``--small`` and ``--large`` cheap CartPole episodes (``--steps`` steps each, one bridge of width
   W shared by the workers, the evals' CEM policy), each with a results file;
2. the same numbers of plain tests (``def test_plain(seed): pass``, parametrized the same way).

A sampler reads every process's resident memory from ``/proc`` four times a second and keeps each
role's peak: the controller (the pytest process), the xdist workers (summed) and the bridge. The
cost per episode is the slope between the two sizes, ``(peak_large - peak_small) / (large - small)``,
so start-up costs (imports, the bridge's env) cancel. Plain pytest's slope is its own cost per
test item: the goal is a controller within 1 KB per episode of it. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EVALS = ROOT / "evals"

HUD_TEST = """
import pytest

pytestmark = pytest.mark.hud(sim={sim!r}, policy={policy!r}, max_steps={steps})


@pytest.mark.parametrize("seed", range({n}))
def test_cheap(shared_sim, robot_agent, seed):
    robot_agent.run(shared_sim.episode(seed=seed))
"""

PLAIN_TEST = """
import pytest


@pytest.mark.parametrize("seed", range({n}))
def test_plain(seed):
    pass
"""


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                out += [int(p) for p in fh.read().split()]
    except OSError:
        pass
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _role(cmd: str) -> str | None:
    if "pytest_hud.bridge" in cmd or "pytest_hud.sim" in cmd:
        return "bridge"
    if "execnet" in cmd or "exec(eval(sys.stdin" in cmd or "xdist" in cmd:
        return "workers"
    return None


def measure(cmd: list[str], cwd: Path) -> tuple[dict[str, int], float, str]:
    """Run ``cmd``; each role's peak resident bytes (workers summed), the wall time and the output's tail."""
    peaks = {"controller": 0, "workers": 0, "bridge": 0}
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), PYTHONDONTWRITEBYTECODE="1"))
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            now = {"controller": _rss(proc.pid), "workers": 0, "bridge": 0}
            stack = _children(proc.pid)
            while stack:
                pid = stack.pop()
                stack += _children(pid)
                role = _role(_cmdline(pid))
                if role is not None:
                    now[role] += _rss(pid)
            for role, value in now.items():
                peaks[role] = max(peaks[role], value)
            done.wait(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = proc.communicate()
    done.set()
    sampler.join()
    tail = "\n".join(out.strip().splitlines()[-3:])
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{out[-4000:]}")
    return peaks, time.monotonic() - started, tail


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", type=int, default=2000)
    parser.add_argument("--large", type=int, default=22000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3, help="steps per CartPole episode")
    args = parser.parse_args()
    sim = f"{EVALS}/sims/classic.py:cartpole"
    policy = f"{EVALS}/policies/numpy_policies.py:cartpole"
    pytest_args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(args.workers)]
    rows: dict[str, dict[int, dict[str, int]]] = {"pytest-hud": {}, "plain pytest": {}}
    with tempfile.TemporaryDirectory(prefix="hud-memory-") as tmp:
        for n in (args.small, args.large):
            for name, source, extra in (
                ("pytest-hud", HUD_TEST.format(sim=sim, policy=policy, steps=args.steps, n=n),
                 [f"--hud-width={args.workers}", "--hud-results=r.jsonl", "--hud-video=none"]),
                ("plain pytest", PLAIN_TEST.format(n=n), []),
            ):
                project = Path(tmp) / f"{name.replace(' ', '-')}-{n}"
                project.mkdir()
                (project / "test_memory.py").write_text(source)
                peaks, wall, tail = measure(pytest_args + extra + ["test_memory.py"], project)
                rows[name][n] = peaks
                mb = {role: f"{value / 2**20:.1f} MB" for role, value in peaks.items()}
                print(f"{name:>12} {n:>6} tests: {wall:6.1f} s  peak RSS {mb}   [{tail.splitlines()[-1]}]",
                      flush=True)
    span = args.large - args.small
    print(f"\nbytes per episode (slope of peak RSS from {args.small} to {args.large}; -n {args.workers}):")
    print(f"{'':>14}{'controller':>12}{'workers':>12}{'bridge':>12}")
    slopes = {}
    for name, by_n in rows.items():
        slopes[name] = {role: (by_n[args.large][role] - by_n[args.small][role]) / span for role in by_n[args.large]}
        cells = "".join(f"{slopes[name][r]:>12.0f}" if name == "pytest-hud" or r != "bridge" else f"{'-':>12}"
                        for r in ("controller", "workers", "bridge"))
        print(f"{name:>14}{cells}")
    extra = {r: slopes["pytest-hud"][r] - slopes["plain pytest"][r] for r in ("controller", "workers")}
    print(f"{'hud - plain':>14}{extra['controller']:>12.0f}{extra['workers']:>12.0f}{'':>12}")
    print(f"controller: {'within' if extra['controller'] <= 1024 else 'over'} 1 KB per episode of plain pytest")


if __name__ == "__main__":
    main()
