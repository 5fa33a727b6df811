"""A run of several suites: when their bridges start and stop, against a git ref, side by side.

    MUJOCO_GL=egl python benchmarks/suite_bridges.py --before REF [--rounds 1] [--workers 2] [--suite evals/test_libero.py]

(LIBERO venv for the default suite.) Runs ``pytest SUITE -n W`` with this checkout's ``pytest_hud``
and with ``REF``'s (this tree with the ref's package: ``git_ref.tree_with_package``), alternating,
and prints for each side the wall time, when the first episode started (the run's ``startup``
figures), the peak memory of the run's processes together (pytest, its workers, bridges and their
env processes: the sum of their resident sets, sampled every 0.2 s) and the most bridges alive at
once. The default suite is CI's LIBERO smoke run: four suites (one bridge each, ``width`` envs of
a few GB), two episodes each. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from git_ref import check_package, tree_with_package

ROOT = Path(__file__).resolve().parent.parent


def _tree_memory(root: psutil.Process) -> tuple[int, int]:
    """Summed RSS (bytes) of ``root`` and its descendants, and how many of them are bridges."""
    total, bridges = 0, 0
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0, 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
            bridges += "pytest_hud.bridge" in proc.cmdline()
        except psutil.Error:
            continue
    return total, bridges


def run(tree: Path, suite: str, workers: int, scratch: Path) -> dict[str, float]:
    results = scratch / "r.jsonl"
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "pytest", suite, "-n", str(workers), "-q", "-p", "no:cacheprovider",
           f"--hud-results={results}"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    peak = {"rss": 0, "bridges": 0}

    def sample() -> None:
        root = psutil.Process(proc.pid)
        while proc.poll() is None:
            rss, bridges = _tree_memory(root)
            peak["rss"], peak["bridges"] = max(peak["rss"], rss), max(peak["bridges"], bridges)
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out = proc.communicate()[0]
    wall = time.perf_counter() - t0
    sampler.join()
    if proc.returncode != 0:
        print(out[-3000:])
        raise SystemExit(f"the run failed (exit {proc.returncode})")
    summary = json.loads(results.read_text().splitlines()[-1])
    startup = summary["provenance"]["startup"]
    return {"wall_s": wall, "first_episode_s": startup["first_episode_started_s"],
            "peak_gb": peak["rss"] / 1e9, "bridges": peak["bridges"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="Git ref whose pytest_hud is the other side")
    parser.add_argument("--suite", default="evals/test_libero.py")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        sides = {"checkout": ROOT, args.before: tree_with_package(args.before, scratch / "ref")}
        for tree in sides.values():
            check_package(sys.executable, tree)
        rows: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
        for _ in range(args.rounds):
            for side, package in sides.items():
                rows[side].append(run(package, args.suite, args.workers, scratch))
    print(f"pytest {args.suite} -n {args.workers}: medians of {args.rounds} round(s); checkout / {args.before}")
    for label, key, fmt in (("wall", "wall_s", "{:7.1f} s"), ("first episode", "first_episode_s", "{:7.1f} s"),
                            ("peak memory", "peak_gb", "{:7.1f} GB"), ("bridges at once", "bridges", "{:7.0f}  ")):
        mine = statistics.median(r[key] for r in rows["checkout"])
        theirs = statistics.median(r[key] for r in rows[args.before])
        print(f"  {label:16} checkout {fmt.format(mine)}   {args.before} {fmt.format(theirs)}   x{mine / theirs:.2f}")


if __name__ == "__main__":
    main()
