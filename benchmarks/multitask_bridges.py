"""One multi-task bridge vs one bridge per task (Meta-World MT10): start-up time and memory, side by side.

    python benchmarks/multitask_bridges.py [--width 2] [--pixels] [--steps 10]

Needs the ``metaworld`` extra. For each layout the bridges are started one after another (what the
pool does as claims arrive) and timed from spawn to announce; then every task gets ``--width``
concurrent episodes of ``--steps`` scripted-expert steps (so every slot has run every task, the
multi-task slots through their env caches), and the resident memory (RSS) of the bridge processes
is summed. Layouts:

- ``multi-task``: ``meta_world.py:meta_world`` with the ten MT10 tasks, ``--width`` slots, each
  slot caching up to 4 envs (the default);
- ``per task``: ten ``meta_world.py:single_task`` bridges, one per task, ``--width`` slots each.

Not a test: the machine is shared and noisy, so only side-by-side ratios count.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("MUJOCO_GL", "egl")
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "evals" / "policies"))

from meta_world_experts import ScriptedExpert  # noqa: E402

from pytest_hud.client.bridge import BridgeAddress, ControlClient, SlotClient  # noqa: E402

SIM = ROOT / "evals" / "sims" / "meta_world.py"
MT10 = ("reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3", "drawer-close-v3",
        "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3")


def start_bridge(target: str, width: int, build: dict, workdir: str) -> tuple[subprocess.Popen, BridgeAddress, float]:
    announce = Path(workdir) / f"bridge-{time.monotonic_ns()}.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    began = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "pytest_hud.bridge", target, "--width", str(width), "--vectorization", "sync",
                             "--build-args", json.dumps(build), "--announce", str(announce)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not announce.exists():
        if proc.poll() is not None:
            raise SystemExit(f"bridge {target} {build} failed to start")
        time.sleep(0.01)
    return proc, BridgeAddress.from_announce(announce), time.perf_counter() - began


def episode(address: BridgeAddress, task: str, seed: int, steps: int, build: dict, barrier: threading.Barrier) -> None:
    expert = ScriptedExpert()
    with ControlClient(address) as control:
        claim = control.claim(seed=seed, task=task, build=build) if "tasks" in build else \
            control.claim(seed=seed, build=build, prompt=task)
        barrier.wait(60)  # every slot holds a claim at once: each runs this task
        with SlotClient(address, claim.token) as ws:
            frame = ws.first_observation
            for _ in range(steps):
                if frame["terminated"]:
                    break
                frame = ws.step(expert.predict(frame, claim.prompt))
        control.release(claim.token)


def run_tasks(addresses: dict[str, BridgeAddress], builds: dict[str, dict], width: int, steps: int) -> float:
    began = time.perf_counter()
    for task in MT10:
        barrier = threading.Barrier(width)
        threads = [threading.Thread(target=episode, args=(addresses[task], task, seed, steps, builds[task], barrier))
                   for seed in range(width)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    return time.perf_counter() - began


def rss_mib(procs: list[subprocess.Popen]) -> float:
    return sum(psutil.Process(p.pid).memory_info().rss for p in procs) / 2**20


def layout(name: str, width: int, pixels: bool, steps: int, workdir: str) -> dict:
    procs, addresses, builds, startup = [], {}, {}, 0.0
    try:
        if name == "multi-task":
            build = {"tasks": list(MT10), "pixels": pixels}
            proc, address, took = start_bridge(f"{SIM}:meta_world", width, build, workdir)
            procs.append(proc)
            startup = took
            addresses = dict.fromkeys(MT10, address)
            builds = dict.fromkeys(MT10, build)
        else:
            for task in MT10:
                build = {"task": task, "pixels": pixels}
                proc, address, took = start_bridge(f"{SIM}:single_task", width, build, workdir)
                procs.append(proc)
                startup += took
                addresses[task], builds[task] = address, build
        rss_start = rss_mib(procs)
        run_s = run_tasks(addresses, builds, width, steps)
        return {"bridges": len(procs), "startup_s": startup, "rss_start": rss_start, "rss": rss_mib(procs),
                "run_s": run_s}
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--width", type=int, default=2)
    p.add_argument("--pixels", action="store_true", help="128-px camera in every observation")
    p.add_argument("--steps", type=int, default=10, help="expert steps per episode")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        rows = {name: layout(name, args.width, args.pixels, args.steps, workdir) for name in ("multi-task", "per task")}
    mode = "pixels 128 px" if args.pixels else "state"
    print(f"MT10, {mode}, width {args.width}, {args.width} episodes x {args.steps} steps per task")
    print(f"{'layout':<12} {'bridges':>7} {'start-up s':>10} {'RSS at start MiB':>17} {'RSS after MiB':>14} "
          f"{'episodes s':>11} {'total s':>8}")
    for name, r in rows.items():
        print(f"{name:<12} {r['bridges']:>7} {r['startup_s']:>10.1f} {r['rss_start']:>17.0f} {r['rss']:>14.0f} "
              f"{r['run_s']:>11.1f} {r['startup_s'] + r['run_s']:>8.1f}")
    multi, per = rows["multi-task"], rows["per task"]
    print(f"per task / multi-task: start-up x{per['startup_s'] / multi['startup_s']:.1f}, "
          f"RSS after x{per['rss'] / multi['rss']:.1f}, episodes x{per['run_s'] / multi['run_s']:.2f} "
          "(the multi-task bridge builds its envs during its first episodes), "
          f"start-up + episodes x{(per['startup_s'] + per['run_s']) / (multi['startup_s'] + multi['run_s']):.1f}")


if __name__ == "__main__":
    main()
