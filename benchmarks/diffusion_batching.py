"""What the policy server's batching buys a Diffusion Policy: one batched denoising loop vs a copy per worker.

    python benchmarks/diffusion_batching.py [--clients 1 8 32] [--episodes 4] [--device cuda]

A diffusion policy's cost is its denoising loop: every chunk is ``num_inference_steps`` U-Net passes
(10 for the shipped ``evals/checkpoints/reach_diffusion/final``). For each number of concurrent
episodes K, side by side in one run, K clients each run ``--episodes`` PointReach episodes:

- **one copy per worker**: K processes, each with its own ``LeRobotPolicy`` (a denoising loop per
  chunk, batch 1), as ``robot_agent`` runs in K xdist workers without ``--hud-policy-server``;
- **policy server**: one ``python -m pytest_hud.serving`` holding one copy; the K clients are threads
  with a ``RemotePolicy`` each, and the server coalesces their chunk requests into one denoising
  loop per batch (default 2 ms window).

Printed per K: chunks/s (policy queries answered per second, all clients together), U-Net passes/s
actually run (server: one per batch per denoising step), mean per-episode wall time, the server's
mean batch, and the server/per-worker ratios. Model loading is outside the timings. Needs LeRobot
with ``diffusers``. Every process runs torch with ``--threads`` threads (default 1: on a busy 2-core
machine, two threads per process spin against each other).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(Path(__file__).resolve().parent)]

from serving import policy_server_stats, start_policy_server

CHECKPOINT = ROOT / "evals" / "checkpoints" / "reach_diffusion" / "final"


def run_episodes(policy, client: int, episodes: int) -> tuple[list[float], int]:
    """(seconds per episode, chunks asked) for ``episodes`` PointReach episodes, chunks open-loop."""
    from evals.sims.reach import make_reach

    env = make_reach()
    times, chunks = [], 0
    for episode in range(episodes):
        tick = time.perf_counter()
        policy.reset()
        observation, _ = env.reset(seed=client * 1000 + episode)
        queue: list = []
        while True:
            if not queue:
                queue = list(policy.predict(observation))
                chunks += 1
            observation, _, terminated, truncated, _ = env.step(queue.pop(0))
            if terminated or truncated:
                break
        times.append(time.perf_counter() - tick)
    env.close()
    return times, chunks


def worker_copy(client: int, args: argparse.Namespace, barrier, results) -> None:
    """One worker: its own model copy, loaded before the barrier, then its episodes."""
    import torch

    from pytest_hud.agent.lerobot import LeRobotPolicy

    torch.set_num_threads(args.threads)
    policy = LeRobotPolicy.from_checkpoint(args.checkpoint, device=args.device)
    run_episodes(policy, client + 500, 1)  # warm-up
    barrier.wait()
    results.put(run_episodes(policy, client, args.episodes))


def per_worker(k: int, args: argparse.Namespace) -> tuple[float, list[float], int]:
    """(wall seconds, episode times, chunks) with K processes, one model each."""
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(k + 1), context.Queue()
    procs = [context.Process(target=worker_copy, args=(i, args, barrier, results)) for i in range(k)]
    for proc in procs:
        proc.start()
    barrier.wait(timeout=600)
    tick = time.perf_counter()
    gathered = [results.get(timeout=1800) for _ in procs]
    wall = time.perf_counter() - tick
    for proc in procs:
        proc.join(60)
    return wall, [t for times, _ in gathered for t in times], sum(c for _, c in gathered)


def served(k: int, url: str, args: argparse.Namespace) -> tuple[float, list[float], int, dict]:
    """(wall seconds, episode times, chunks, server /stats at the start) with K client threads on one
    server (the warm-up episodes come before those stats)."""
    from pytest_hud.agent.remote import RemotePolicy

    ready, go = threading.Barrier(k + 1), threading.Barrier(k + 1)
    out: list = [None] * k

    def client(i: int) -> None:
        with RemotePolicy(url, timeout=600) as policy:
            run_episodes(policy, i + 500, 1)  # connect + warm-up
            ready.wait()
            go.wait()
            out[i] = run_episodes(policy, i, args.episodes)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(k)]
    for thread in threads:
        thread.start()
    ready.wait(timeout=600)
    before = policy_server_stats(url)  # every warm-up answered, no timed request sent yet
    go.wait(timeout=60)
    tick = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - tick
    return wall, [t for times, _ in out for t in times], sum(c for _, c in out), before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, default=CHECKPOINT)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8], help="Concurrent episodes K")
    parser.add_argument("--episodes", type=int, default=4, help="Episodes per client")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per process")
    parser.add_argument("--skip-per-worker-above", type=int, default=8,
                        help="Run the one-copy-per-worker side only up to this K (each copy is a process)")
    args = parser.parse_args()
    os.environ.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    import json

    steps = json.loads((args.checkpoint / "config.json").read_text())["num_inference_steps"]
    print(f"diffusion checkpoint {args.checkpoint.name}: {steps} denoising steps per chunk; "
          f"device {args.device}, {args.threads} torch thread(s) per process, "
          f"{args.episodes} episodes per client")
    header = f"{'K':>3} {'mode':<22} {'chunks/s':>9} {'unet/s':>8} {'s/episode':>10} {'batch':>6}"
    print(header + "\n" + "-" * len(header))
    with tempfile.TemporaryDirectory() as workdir:
        proc, url = start_policy_server(str(args.checkpoint), ["--device", args.device, "--threads",
                                        str(args.threads)], env, Path(workdir))
        try:
            for k in args.clients:
                rows = {}
                if k <= args.skip_per_worker_above:
                    wall, times, chunks = per_worker(k, args)
                    rows["one copy per worker"] = (chunks / wall, chunks * steps / wall,
                                                   sum(times) / len(times), 1.0)
                wall, times, chunks, before = served(k, url, args)
                after = policy_server_stats(url)
                forwards = after["forwards"] - before["forwards"]
                batch = (after["requests"] - before["requests"]) / max(1, forwards)
                rows["policy server"] = (chunks / wall, forwards * steps / wall,
                                         sum(times) / len(times), batch)
                for mode, (rate, unet, episode, mean_batch) in rows.items():
                    print(f"{k:>3} {mode:<22} {rate:9.1f} {unet:8.0f} {episode:10.3f} {mean_batch:6.2f}")
                if len(rows) == 2:
                    (a, _, ea, _), (b, _, eb, _) = rows["policy server"], rows["one copy per worker"]
                    print(f"{k:>3} server / per-worker: chunks/s x{a / b:.2f}, episode time x{ea / eb:.2f}")
        finally:
            proc.terminate()
            proc.wait(30)


if __name__ == "__main__":
    main()
