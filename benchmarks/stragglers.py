"""Straggler stalls: env-steps/s of ready-mode ticks vs lockstep, side by side in one run.

    python benchmarks/stragglers.py [--workers 8] [--seconds 6] [--repeats 3] [--windows 0.001,...]

Bridges serve ``Pendulum-v1`` at width ``--workers``: one with ``--tick lockstep`` and one with
``--tick ready`` per ``--tick-window`` in ``--windows``. For each, ``--workers`` client processes (the blocking ``ControlClient`` and
``SlotClient`` an xdist worker runs) claim episodes and step them for ``--seconds``, their policies
taking a random 2-40 ms per step (lognormal, median 8 ms, seeded per client: the same draws in
both modes). Phases alternate (lockstep, ready, lockstep, ready, ...) so that the shared machine's
noise hits both alike. Then the same with instant policies (the fast case), where ready mode must
cost little. Besides env-steps/s, each phase prints the bridge process's CPU time per slot-step and
the mean number of slots stepped per tick (ready mode's smaller ticks are its only extra cost).

Not a test: the machine is shared and noisy, so only side-by-side ratios count.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_hud.client.bridge import BridgeAddress, ControlClient, SlotClient  # noqa: E402

TARGET = "Pendulum-v1"  # 200-step episodes, never terminated early: claims are rare, steps dominate


def start_bridge(tick: str, width: int, window: float, workdir: str) -> tuple[subprocess.Popen, BridgeAddress]:
    announce = Path(workdir) / f"{tick}-{window}.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "pytest_hud.bridge", TARGET, "--width", str(width), "--vectorization", "sync",
                             "--tick", tick, "--tick-window", str(window), "--announce", str(announce)],
                            env=env)
    while not announce.exists():
        if proc.poll() is not None:
            raise SystemExit(f"the {tick} bridge failed to start")
        time.sleep(0.02)
    return proc, BridgeAddress.from_announce(announce)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def client(index: int, address: dict, seconds: float, slow: bool, seed: int, barrier, out) -> None:
    """One worker: episodes back to back until the phase ends; puts its step count on ``out``."""
    rng = np.random.default_rng([seed, index])
    address = BridgeAddress.from_dict(address)
    action = np.zeros(1, np.float32)
    steps, episode = 0, index
    with ControlClient(address) as control:
        barrier.wait()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            claim = control.claim(seed=episode)
            episode += 1000
            with SlotClient(address, claim.token) as ws:
                frame = ws.first_observation
                while not frame["terminated"] and time.monotonic() < end:
                    if slow:  # the policy: 2-40 ms, lognormal around 8 ms
                        time.sleep(float(np.clip(rng.lognormal(np.log(0.008), 0.8), 0.002, 0.040)))
                    frame = ws.step(action)
                    steps += 1
            control.result(claim.token)
    out.put(steps)


def phase(address: BridgeAddress, workers: int, seconds: float, slow: bool, seed: int) -> tuple[float, float, float]:
    """Run ``workers`` client processes against one bridge.

    Returns env-steps/s, the bridge's CPU µs per slot-step and the mean slots stepped per tick.
    """
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(workers + 1), ctx.Queue()
    procs = [ctx.Process(target=client, args=(i, address.to_dict(), seconds, slow, seed, barrier, out))
             for i in range(workers)]
    for p in procs:
        p.start()
    with ControlClient(address) as control:
        before = control.stats()
        barrier.wait(120)  # every client connected: start the clock
        cpu0, t0 = cpu_seconds(address.pid), time.monotonic()
        steps = sum(out.get(timeout=seconds + 120) for _ in procs)
        wall, cpu = time.monotonic() - t0, cpu_seconds(address.pid) - cpu0
        after = control.stats()
    for p in procs:
        p.join(30)
    ticks = after["ticks"] - before["ticks"]
    per_tick = (after["slot_steps"] - before["slot_steps"]) / max(1, ticks)
    # the clients stopped at ``seconds``; the last few ms are their goodbyes
    return steps / min(wall, seconds), cpu / steps * 1e6, per_tick


def name(mode: tuple[str, float]) -> str:
    return "lockstep" if mode[0] == "lockstep" else f"ready {mode[1] * 1e3:g} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=6.0, help="Length of each phase")
    parser.add_argument("--repeats", type=int, default=3, help="Lockstep/ready phase pairs per case")
    parser.add_argument("--windows", default="0.001", help="Ready mode's --tick-window values, comma-separated")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", default="slow,fast", help="Comma-separated: slow (2-40 ms policies), fast")
    args = parser.parse_args()
    modes = [("lockstep", 0.0)] + [("ready", float(w)) for w in args.windows.split(",")]
    with tempfile.TemporaryDirectory() as workdir:
        bridges = {mode: start_bridge(mode[0], args.workers, mode[1], workdir) for mode in modes}
        try:
            for case in args.cases.split(","):
                slow = case == "slow"
                seen: dict[tuple, list[tuple[float, float, float]]] = {mode: [] for mode in modes}
                for rep in range(args.repeats):
                    for mode, (_, address) in bridges.items():
                        rate, cpu, per_tick = phase(address, args.workers, args.seconds, slow, args.seed + rep)
                        seen[mode].append((rate, cpu, per_tick))
                        print(f"  {case:<4} rep {rep}  {name(mode):<16} {rate:8.0f} env-steps/s   "
                              f"bridge CPU {cpu:6.1f} µs/slot-step   {per_tick:4.2f} slots/tick", flush=True)
                label = "policies 2-40 ms (lognormal)" if slow else "instant policies"
                print(f"{label}, {args.workers} workers, width {args.workers} (medians of {args.repeats}):")
                lock = seen[modes[0]]
                for mode in modes:
                    rates, cpus, ticks = zip(*seen[mode])
                    ratios = [r / lk[0] for r, lk in zip(rates, lock)]
                    print(f"  {name(mode):<16} {statistics.median(rates):8.0f} env-steps/s   "
                          f"x{statistics.median(ratios):.2f} of lockstep (pairs {', '.join(f'{r:.2f}' for r in ratios)})   "
                          f"bridge CPU {statistics.median(cpus):5.0f} µs/slot-step   "
                          f"{statistics.median(ticks):4.2f} slots/tick", flush=True)
        finally:
            for proc, _ in bridges.values():
                proc.terminate()
                proc.wait(10)


if __name__ == "__main__":
    main()
