"""Bridges placed by Ray: scaling, per-step overhead and start-up cost, side by side in one run.

    python benchmarks/ray_scaling.py [--width 4] [--seconds 8] [--sleep-ms 20] [--rounds 3]

Needs ``pip install 'pytest-hud[ray]'``. Starts a ``ray.cluster_utils.Cluster`` on this host (a head
and one node with ``{"sim": 8}``), then:

1. **Scaling.** A sim whose tick sleeps ``--sleep-ms`` (``tests/e2e/cluster/sleepy.py``: a stand-in for a
   render or physics step that does not use this machine's CPU), ``--width`` slots per bridge, one
   asyncio client per slot in this process, for ``--seconds``. One local bridge (the pool's default
   launcher), then 1, 2 and 4 bridges placed by Ray through the same pool. Prints slot-steps/s and
   the ratio to ``n x`` the local bridge (the goal is >= 0.9 of linear) and to the ceiling
   ``width x 1000 / sleep-ms``. Configurations are measured in interleaved rounds (medians).
2. **Per-step overhead.** The same sim without the sleep at width 1, one client: µs per step
   through a local bridge and through a Ray-placed one. On one host both paths are loopback TCP, so
   this measures what Ray placement adds to the data path (nothing is relayed through Ray), not a
   network.
3. **Start-up.** Seconds to start the cluster's daemons (what ``ray start`` costs per node), to
   connect the driver (``--hud-ray``), to place and boot the first bridge, against booting a local
   bridge.

Not a test: the machine is shared and noisy, so only ratios measured side by side count.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p)

from pytest_hud.client.bridge import AsyncControlClient, AsyncSlotClient, BridgeAddress  # noqa: E402
from pytest_hud.controller.pool import BridgeSpec, SimPool  # noqa: E402
from pytest_hud.launch.ray import RayLauncher  # noqa: E402

TARGET = f"{ROOT / 'tests' / 'cluster' / 'sleepy.py'}:make"


async def drive(addresses: list[BridgeAddress], width: int, seconds: float, build: dict) -> tuple[float, int, list[float]]:
    """``width`` clients per bridge step episodes for ``seconds``; (elapsed, slot-steps, step latencies)."""
    stop = asyncio.Event()
    counts: list[int] = []
    latencies: list[float] = []

    async def client(address: BridgeAddress, i: int) -> None:
        control = await AsyncControlClient.connect(address)
        action = np.ones(1, np.float32)
        seed = i
        try:
            while not stop.is_set():
                claim = await control.claim(seed=seed, build=build)
                seed += width
                slot = await AsyncSlotClient.connect(address, claim.token)
                frame = slot.first_observation
                while not frame["terminated"] and not stop.is_set():
                    t0 = time.perf_counter()
                    frame = await slot.step(action)
                    latencies.append(time.perf_counter() - t0)
                    counts.append(1)
                await slot.close()
                await control.release(claim.token) if stop.is_set() else await control.result(claim.token)
        finally:
            await control.close()

    async def timer() -> None:
        await asyncio.sleep(seconds)
        stop.set()

    t0 = time.perf_counter()
    await asyncio.gather(timer(), *(client(a, i) for a in addresses for i in range(width)))
    return time.perf_counter() - t0, len(counts), latencies


def pool(launcher, width: int, bridges: int) -> SimPool:
    spec = BridgeSpec(width=width, cwd=str(ROOT), python_path=[str(ROOT)])
    return SimPool("benchmark-secret", spec, workers=width * bridges, launcher=launcher)


def addresses(p: SimPool, width: int, bridges: int, build: dict) -> list[BridgeAddress]:
    return [p.bridge_for(TARGET, build, worker=g * width) for g in range(bridges)]


def rate(addrs: list[BridgeAddress], width: int, seconds: float, build: dict) -> tuple[float, float]:
    asyncio.run(drive(addrs, width, min(1.0, seconds), build))  # warm-up
    elapsed, steps, latencies = asyncio.run(drive(addrs, width, seconds, build))
    return steps / elapsed, float(np.median(latencies)) * 1e6


def median_pair(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    return float(np.median([a for a, _ in pairs])), float(np.median([b for _, b in pairs]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--sleep-ms", type=float, default=20.0)
    parser.add_argument("--overhead-seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from ray.cluster_utils import Cluster

    sleepy = {"length": 50, "sleep_ms": args.sleep_ms}
    bare = {"length": 50, "sleep_ms": 0.0}

    t0 = time.perf_counter()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    head_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    cluster.add_node(num_cpus=4, resources={"sim": 8})
    cluster.wait_for_nodes()
    node_s = time.perf_counter() - t0
    def placer() -> RayLauncher:  # one per pool: a pool's stop_all closes its launcher
        return RayLauncher(cluster.address, bridge_resources={"sim": 1}, policy_resources={"CPU": 1},
                           cwd=str(ROOT), python_path=[str(ROOT)])

    try:
        # ---- start-up
        t0 = time.perf_counter()
        local = pool(None, 1, 1)
        local_first = addresses(local, 1, 1, bare)
        local_boot_s = time.perf_counter() - t0
        launcher = placer()
        t0 = time.perf_counter()
        placed = pool(launcher, 1, 1)
        placed_first = addresses(placed, 1, 1, bare)
        placed_boot_s = time.perf_counter() - t0
        print(f"start-up: head daemons {head_s:.1f} s, one more node {node_s:.1f} s, driver connect "
              f"{launcher.connect_s:.1f} s; first bridge placed by Ray {placed_boot_s:.2f} s vs local "
              f"{local_boot_s:.2f} s (+{placed_boot_s - local_boot_s:.2f} s)")

        # ---- per-step overhead (width 1, no sleep), interleaved rounds
        runs: dict[str, list[tuple[float, float]]] = {"local": [], "ray": []}
        for _ in range(args.rounds):
            runs["local"].append(rate(local_first, 1, args.overhead_seconds, bare))
            runs["ray"].append(rate(placed_first, 1, args.overhead_seconds, bare))
        (l_rate, l_p50), (r_rate, r_p50) = (median_pair(runs["local"]), median_pair(runs["ray"]))
        print(f"per-step, width 1, no sleep (median of {args.rounds} interleaved rounds): "
              f"local {1e6 / l_rate:5.0f} µs/step (p50 round trip {l_p50:.0f} µs), "
              f"Ray-placed {1e6 / r_rate:5.0f} µs/step (p50 {r_p50:.0f} µs); Ray/local time per step "
              f"{l_rate / r_rate:.3f}")
        local.stop_all()
        placed.stop_all()

        # ---- scaling (sleep-dominated), interleaved rounds
        ideal = args.width * 1000.0 / args.sleep_ms
        one = pool(None, args.width, 1)
        setups = {"local 1 bridge": (addresses(one, args.width, 1, sleepy), one)}
        for n in (1, 2, 4):
            p = pool(placer(), args.width, n)
            setups[f"Ray {n} bridge(s)"] = (addresses(p, args.width, n, sleepy), p)
        got: dict[str, list[float]] = {name: [] for name in setups}
        for _ in range(args.rounds):
            for name, (addrs, _p) in setups.items():
                got[name].append(rate(addrs, args.width, args.seconds, sleepy)[0])
        for _addrs, p in setups.values():
            p.stop_all()
        base = float(np.median(got["local 1 bridge"]))
        print(f"scaling, {args.sleep_ms:g} ms/tick, width {args.width} (median of {args.rounds} interleaved rounds; "
              f"a bridge's ceiling is {ideal:.0f} slot-steps/s):")
        for name, values in got.items():
            n = 1 if name.startswith("local") else int(name.split()[1])
            value = float(np.median(values))
            print(f"  {name:<18} {value:7.1f} slot-steps/s  = {value / (n * base):.3f} x (n x local 1 bridge)"
                  f"  = {value / (n * ideal):.3f} x ceiling")
    finally:
        import ray

        ray.shutdown()  # the cluster refuses to stop its head under a connected driver
        cluster.shutdown()


if __name__ == "__main__":
    main()
