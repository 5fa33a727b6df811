"""One policy server for 8 workers vs 8 per-worker model copies: episodes/hour and memory, one run.

    .venv-lerobot/bin/python benchmarks/policy_server.py [--workers 8] [--episodes 50]

Both setups run the same episodes of the PointReach sim (``evals/sims/reach.py:make_reach``, env
in each worker process) with the shipped ACT checkpoint (``evals/checkpoints/reach_act/final``),
executing each predicted chunk open-loop as the agent does:

- **server**: ``--workers`` processes that never import torch (``RemotePolicy``), all talking to
  one ``python -m pytest_hud.serving`` that batches their requests;
- **copies**: ``--workers`` processes that each load their own ``LeRobotPolicy``.

Workers are spawned fresh, load (or connect), make one warm-up call, then wait; the clock starts
when all are ready, so start-up (the server's included) is reported separately from episodes/hour.
Memory is the resident set (RSS) summed over every process of a setup (the server included),
sampled during the run (the peak is reported), plus the unique set size (USS) once all are loaded,
which does not count shared library pages once per process. Both setups run twice: with torch's
default thread count (what users get) and with one torch thread per process (server ``--threads 1``),
the best case on a small machine, where per-core threads spin-wait against each other.
Not a test: the machine is shared and noisy; only side-by-side ratios count.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil
from serving import start_policy_server

ROOT = Path(__file__).resolve().parent.parent
CHECKPOINT = ROOT / "evals" / "checkpoints" / "reach_act" / "final"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(ROOT))


def worker(mode: str, where: str, threads: int, seeds: list[int], ready, go, results) -> None:
    """One xdist-worker stand-in: build the model, warm up, wait for go, run the episodes."""
    sys.path.insert(0, str(ROOT))
    from evals.sims.reach import make_reach

    if mode == "server":
        from pytest_hud.agent.remote import RemotePolicy

        model = RemotePolicy(where, timeout=120)
    else:
        import torch

        from pytest_hud.agent.lerobot import LeRobotPolicy

        if threads:
            torch.set_num_threads(threads)
        with contextlib.redirect_stderr(io.StringIO()):  # LeRobot's "Loading weights ..." line
            model = LeRobotPolicy.from_checkpoint(where)
    env = make_reach()
    obs, _ = env.reset(seed=10**6)
    model.predict({"state": obs["state"]}, prompt="")  # warm-up: connection / first forward
    ready.put(os.getpid())
    go.wait()
    started = time.monotonic()
    successes = steps = calls = 0
    for seed in seeds:
        obs, _ = env.reset(seed=seed)
        chunk: list = []
        while True:
            if not chunk:
                chunk = list(model.predict({"state": obs["state"]}, prompt=""))
                calls += 1
            obs, _, terminated, truncated, info = env.step(chunk.pop(0))
            steps += 1
            if terminated or truncated:
                successes += bool(info.get("is_success"))
                break
    results.put({"pid": os.getpid(), "episodes": len(seeds), "successes": successes, "steps": steps,
                 "calls": calls, "seconds": time.monotonic() - started, "torch": "torch" in sys.modules})


def rss_mib(pids: list[int]) -> float:
    """Resident set size summed over ``pids`` (cheap: one small /proc read per process)."""
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            continue
    return total / 2**20


def uss_mib(pids: list[int]) -> float:
    """Unique set size summed over ``pids`` (reads every mapping: measured once, not sampled)."""
    total = 0
    for pid in pids:
        try:
            total += getattr(psutil.Process(pid).memory_full_info(), "uss", 0)
        except psutil.Error:
            continue
    return total / 2**20


def start_server(workdir: str, workers: int, threads: int) -> tuple[subprocess.Popen, str]:
    return start_policy_server(str(CHECKPOINT), ["--max-batch", str(workers), "--threads", str(threads)],
                               dict(os.environ, PYTHONPATH=str(ROOT)), Path(workdir), cwd=ROOT)


def run(mode: str, where: str, workers: int, episodes: int, extra_pids: list[int], threads: int = 0) -> dict:
    ctx = mp.get_context("spawn")  # fresh interpreters: server-mode workers never import torch
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    procs = [
        ctx.Process(target=worker, args=(mode, where, threads, list(range(w * episodes, (w + 1) * episodes)),
                                          ready, go, results))
        for w in range(workers)
    ]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    pids = [ready.get(timeout=300) for _ in procs]
    startup = time.monotonic() - t0
    uss = uss_mib(pids + extra_pids)  # loaded and warmed up
    peak_rss = rss_mib(pids + extra_pids)
    started = time.monotonic()
    go.set()
    done: list[dict] = []
    while len(done) < workers:
        try:
            done.append(results.get(timeout=0.5))
        except Exception:  # queue.Empty: sample memory while the episodes run
            peak_rss = max(peak_rss, rss_mib(pids + extra_pids))
            if time.monotonic() - started > 600:
                raise SystemExit(f"{mode}: workers did not finish")
    wall = time.monotonic() - started
    for p in procs:
        p.join(30)
    total = sum(r["episodes"] for r in done)
    return {
        "mode": mode,
        "startup_s": startup,
        "wall_s": wall,
        "episodes": total,
        "episodes_per_hour": total / wall * 3600,
        "success_rate": sum(r["successes"] for r in done) / total,
        "steps": sum(r["steps"] for r in done),
        "calls": sum(r["calls"] for r in done),
        "rss_mib": peak_rss,
        "uss_mib": uss,
        "threads": threads,
        "processes": len(pids) + len(extra_pids),
        "torch_in_workers": any(r["torch"] for r in done),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8, help="Worker processes per setup")
    parser.add_argument("--episodes", type=int, default=50, help="Episodes per worker")
    args = parser.parse_args()

    import torch  # only to report its defaults; the workers import their own

    print(f"PointReach + ACT ({CHECKPOINT.relative_to(ROOT)}), {args.workers} workers x {args.episodes} "
          f"episodes per setup, {os.cpu_count()} CPUs, torch {torch.__version__} "
          f"(default {torch.get_num_threads()} threads per process)")
    rows = []
    for threads in (0, 1):  # torch's default (what users get), then one thread per process
        rows.append((threads, serve_and_run(args.workers, args.episodes, threads),
                     run("copies", str(CHECKPOINT), args.workers, args.episodes, [], threads)))

    for threads, (served, stats), copies in rows:
        kind = "default threads" if not threads else f"{threads} thread"
        for label, r in ((f"1 server + workers, {kind}", served), (f"per-worker copies, {kind}", copies)):
            print(f"{label:<36} {r['episodes']:4d} episodes in {r['wall_s']:6.2f} s = "
                  f"{r['episodes_per_hour']:9.0f} episodes/h  success {r['success_rate']:.3f}  "
                  f"start-up {r['startup_s']:5.1f} s  RSS {r['rss_mib']:6.0f} MiB  "
                  f"USS {r['uss_mib']:5.0f} MiB  "
                  f"({r['processes']} processes, torch in workers: {r['torch_in_workers']})")
        sizes = stats["batch_sizes"]
        mean = sum(int(k) * v for k, v in sizes.items()) / max(1, sum(sizes.values()))
        print(f"  server: {stats['requests']} requests (warm-ups included) in {stats['forwards']} forwards "
              f"(mean batch {mean:.2f}, max {stats['max_batch_seen']})")
        speed = served["episodes_per_hour"] / copies["episodes_per_hour"]
        print(f"  ratio server / copies ({kind}): episodes/h x{speed:.2f}   "
              f"RSS x{served['rss_mib'] / copies['rss_mib']:.2f}   "
              f"USS x{served['uss_mib'] / copies['uss_mib']:.2f}   "
              f"start-up x{served['startup_s'] / copies['startup_s']:.2f}")


def serve_and_run(workers: int, episodes: int, threads: int) -> tuple[dict, dict]:
    """Start a server, run the workers against it, and return (result, the server's stats)."""
    with tempfile.TemporaryDirectory() as workdir:
        t0 = time.monotonic()
        server, url = start_server(workdir, workers, threads)
        server_startup = time.monotonic() - t0
        try:
            served = run("server", url, workers, episodes, [server.pid])
            served["startup_s"] += server_startup  # the workers only start once the server is up
            port = url.rsplit(":", 1)[1]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=10) as response:
                stats = json.loads(response.read())
        finally:
            server.terminate()
            server.wait(10)
    return served, stats


if __name__ == "__main__":
    main()
