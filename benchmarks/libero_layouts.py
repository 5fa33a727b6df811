"""LIBERO episodes stepping side by side: a bridge's layouts against separate plain processes.

    MUJOCO_GL=egl python benchmarks/libero_layouts.py [--widths 1 2 4] [--steps 20] [--no-sync]

For each width W: W episodes of libero_spatial task_00 (init states 0..W-1, both 256-px cameras,
every frame rendered, random actions) step at once, and each reports its seconds per step (from
its first step to its last; builds and resets are not counted):

- ``plain``: W separate processes, each a ``LiberoTask`` stepped in a loop (the reference: what W
  copies of a hand-written eval script would do);
- ``bridge auto``: one ``python -m pytest_hud.bridge evals/sims/libero.py:libero --width W``, as
  started by hand or by the plugin (``auto``, the default of both), W slot clients on threads;
- ``bridge sync`` (unless ``--no-sync``): the same with ``--vectorization sync`` (all envs in the
  bridge's process: the layout before ``auto`` followed LIBERO's declaration).

The ratios to ``plain`` are printed side by side, measured in one run. Not a test.
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

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SIM = ROOT / "evals" / "sims" / "libero.py"
TASK = "task_00"


def plain_worker(seed: int, steps: int) -> None:
    """One plain process: build and reset, say ready, wait for go, step, print seconds per step."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_hud_libero_layouts", SIM)
    lib = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lib)
    env = lib.LiberoTask("libero_spatial", TASK)
    env.reset(seed=seed)
    actions = np.random.default_rng(seed).uniform(-1, 1, (steps, 7)).astype(np.float32)
    print("ready", flush=True)
    sys.stdin.readline()
    t0 = time.perf_counter()
    for action in actions:
        env.step(action)
    print(json.dumps({"s_per_step": (time.perf_counter() - t0) / steps}), flush=True)
    env.close()


def plain(width: int, steps: int) -> float:
    procs = [subprocess.Popen([sys.executable, __file__, "--plain-worker", str(seed), "--steps", str(steps)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
             for seed in range(width)]
    try:
        for p in procs:
            while p.stdout.readline().strip() != "ready":
                if p.poll() is not None:
                    raise RuntimeError("a plain process exited before it was ready")
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        times = [json.loads(p.stdout.readline())["s_per_step"] for p in procs]
    finally:
        for p in procs:
            p.wait(60)
    return statistics.mean(times)


def bridged(width: int, steps: int, vectorization: str | None) -> tuple[float, str]:
    from pytest_hud.client.bridge import BridgeAddress, ControlClient, SlotClient

    tmp = Path(tempfile.mkdtemp())
    announce = tmp / "bridge.json"
    cmd = [sys.executable, "-m", "pytest_hud.bridge", f"{SIM}:libero", "--width", str(width),
           "--announce", str(announce), *(["--vectorization", vectorization] if vectorization else [])]
    log = open(tmp / "bridge.log", "wb")
    proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    try:
        while not announce.exists():
            if proc.poll() is not None:
                raise RuntimeError((tmp / "bridge.log").read_text())
            time.sleep(0.05)
        address = BridgeAddress.from_announce(announce)
        layout = json.loads(announce.read_text()).get("vectorization", "?")
        barrier, times = threading.Barrier(width), [0.0] * width

        def episode(k: int) -> None:
            actions = np.random.default_rng(k).uniform(-1, 1, (steps, 7)).astype(np.float32)
            with ControlClient(address) as control:
                claim = control.claim(seed=k, task=TASK)
                with SlotClient(address, claim.token, connect_timeout=600) as ws:  # its env builds first
                    barrier.wait(600)  # every slot reset (and its env built) before anyone steps
                    t0 = time.perf_counter()
                    for action in actions:
                        ws.step(action)
                    times[k] = (time.perf_counter() - t0) / steps
                control.release(claim.token)

        threads = [threading.Thread(target=episode, args=(k,)) for k in range(width)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return statistics.mean(times), layout
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--widths", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--no-sync", action="store_true", help="Leave out the bridge with --vectorization sync")
    ap.add_argument("--plain-worker", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.plain_worker is not None:
        plain_worker(args.plain_worker, args.steps)
        return
    os.environ.setdefault("MUJOCO_GL", "egl")
    print(f"LIBERO libero_spatial {TASK}, 2 x 256-px cameras, {args.steps} steps per episode, "
          f"{os.cpu_count()} cores; seconds per step of each episode, mean over the W episodes")
    print(f"{'W':>2} {'plain':>8} {'bridge auto':>18} {'auto/plain':>10} {'bridge sync':>12} {'sync/plain':>10}")
    for width in args.widths:
        ref = plain(width, args.steps)
        auto, layout = bridged(width, args.steps, None)
        row = f"{width:>2} {ref:>8.3f} {auto:>8.3f} ({layout:>9}) {auto / ref:>10.2f}"
        if not args.no_sync:
            sync, _ = bridged(width, args.steps, "sync")
            row += f" {sync:>12.3f} {sync / ref:>10.2f}"
        print(row, flush=True)


if __name__ == "__main__":
    main()
