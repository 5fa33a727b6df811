"""Bridge throughput: env-steps/s through the bridge vs the raw vectorized loop, in one run.

    python benchmarks/bridge_throughput.py [--width 8] [--ticks 3000] [--pixel-ticks 600]

Envs: ``Pendulum-v1`` (state) and Pendulum rendered to a 96x96 image (``benchmarks/pixel_env.py``).
For each env: a bridge subprocess at ``--width`` with one asyncio client per slot (all in this
process) sending zero actions for a fixed number of ticks, then the same vector env stepped raw
in this process. Prints env-steps/s for both, their ratio, and the bridge's overhead per
slot-step in µs. Not a test: the machine is shared and noisy, so only side-by-side ratios count.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # the same as bridges, so raw and bridge render alike
sys.path.insert(0, str(ROOT))

from pytest_hud.client import AsyncControlClient, AsyncSlotClient, BridgeAddress  # noqa: E402
from pytest_hud.sim.target import load_sim  # noqa: E402

PIXEL_TARGET = f"{ROOT / 'benchmarks' / 'pixel_env.py'}:make"


def start_bridge(target: str, width: int, workdir: str) -> tuple[subprocess.Popen, BridgeAddress]:
    announce = Path(workdir) / f"{abs(hash(target))}.json"
    env = dict(os.environ, SDL_VIDEODRIVER="dummy", PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "pytest_hud.sim", target, "--width", str(width),
                             "--announce", str(announce)], env=env)
    while not announce.exists():
        if proc.poll() is not None:
            raise SystemExit(f"bridge for {target} failed to start")
        time.sleep(0.02)
    return proc, BridgeAddress.from_announce(announce)


async def drive_clients(address: BridgeAddress, width: int, ticks: int) -> tuple[float, int]:
    """``width`` clients step until the bridge has done ``ticks`` ticks; returns (seconds, slot-steps)."""
    controls = [await AsyncControlClient.connect(address) for _ in range(width)]
    contract = await controls[0].contract()
    zero = np.zeros(contract.action.shape, dtype=np.float32)
    counts = [0] * width
    stop = asyncio.Event()

    async def client(i: int) -> None:
        control = controls[i]
        seed = i
        while not stop.is_set():
            claim = await control.reset(seed=seed)
            seed += width
            slot = await AsyncSlotClient.connect(address, claim.token)
            frame = slot.first_observation
            while not frame["terminated"] and not stop.is_set():
                frame = await slot.step(zero)
                counts[i] += 1
                if sum(counts) >= ticks * width:
                    stop.set()
            await control.result(claim.token)
            await slot.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(width)))
    elapsed = time.perf_counter() - t0
    for c in controls:
        await c.close()
    return elapsed, sum(counts)


def raw_loop(target: str, width: int, ticks: int) -> tuple[float, int]:
    """The same vector env, stepped directly with zero actions (finished sub-envs reset per slot)."""
    sim = load_sim(target, width)
    action = np.stack([sim.hold_action()] * width)
    t0 = time.perf_counter()
    for _ in range(ticks):
        batch = sim.step(action)
        done = np.flatnonzero(batch.terminated | batch.truncated)
        if done.size:
            sim.reset_slots(list(done), [None] * done.size, [None] * done.size)
    elapsed = time.perf_counter() - t0
    sim.close()
    return elapsed, ticks * width


def measure(label: str, target: str, width: int, ticks: int, workdir: str) -> None:
    proc, address = start_bridge(target, width, workdir)
    try:
        asyncio.run(drive_clients(address, width, min(50, ticks)))  # warm-up
        b_s, b_steps = asyncio.run(drive_clients(address, width, ticks))
    finally:
        proc.terminate()
        proc.wait(10)
    r_s, r_steps = raw_loop(target, width, ticks)
    bridge_rate, raw_rate = b_steps / b_s, r_steps / r_s
    overhead_us = (1 / bridge_rate - 1 / raw_rate) * 1e6
    print(f"{label:<22} width {width}  bridge {bridge_rate:9.0f} env-steps/s   raw {raw_rate:9.0f} env-steps/s   "
          f"bridge/raw {bridge_rate / raw_rate:5.3f}   overhead {overhead_us:6.1f} µs/slot-step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--ticks", type=int, default=3000, help="Ticks for Pendulum-v1")
    parser.add_argument("--pixel-ticks", type=int, default=600, help="Ticks for the 96x96 pixel env")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        measure("Pendulum-v1", "Pendulum-v1", args.width, args.ticks, workdir)
        measure("Pendulum pixels 96x96", PIXEL_TARGET, args.width, args.pixel_ticks, workdir)


if __name__ == "__main__":
    main()
