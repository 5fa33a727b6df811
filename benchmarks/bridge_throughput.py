"""Bridge throughput: env-steps/s through the bridge vs the raw vectorized loop, in one run.

    python benchmarks/bridge_throughput.py [--width 8] [--ticks 3000] [--pixel-ticks 600]
        [--envs state,pixels,cameras] [--before REF] [--tick auto|lockstep|ready]

Envs: ``Pendulum-v1`` (state), Pendulum rendered to a 96x96 image, and two 224x224 cameras
(``benchmarks/pixel_env.py``). For each env: a bridge subprocess at ``--width`` with one asyncio
client per slot (all in this process) sending zero actions for a fixed number of ticks, then the
same vector env stepped raw in this process. Prints env-steps/s for both, their ratio, the
bridge's overhead per slot-step in µs, and for images the frame size and what encoding and
decoding one frame costs here (the user-space copies of its pixels). ``--before REF`` also runs
the bridge of ``git archive REF`` (e.g. ``main``) right before this checkout's, against the same
raw loop, which is measured before and after the bridges (their mean is the reference: the
machine's speed drifts); ``--repeat N`` runs N such rounds and prints the median ratios. Not a test: the machine is shared and noisy, so only side-by-side ratios count.
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

from git_ref import extract_package

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # the same as bridges, so raw and bridge render alike
sys.path.insert(0, str(ROOT))

from pytest_hud.client.bridge import AsyncControlClient, AsyncSlotClient, BridgeAddress  # noqa: E402
from pytest_hud.sim.target import load_sim  # noqa: E402

PIXEL_TARGET = f"{ROOT / 'benchmarks' / 'pixel_env.py'}:make"
CAMERAS_TARGET = f"{ROOT / 'benchmarks' / 'pixel_env.py'}:make_two_cameras"
ENVS = {"state": ("Pendulum-v1", "Pendulum-v1"), "pixels": ("Pendulum pixels 96x96", PIXEL_TARGET),
        "cameras": ("Pendulum 2 cams 224x224", CAMERAS_TARGET)}


TICK = ["--tick", "auto"]  # the bridges' tick mode (--tick)


def start_bridge(target: str, width: int, workdir: str,
                 code_root: Path = ROOT) -> tuple[subprocess.Popen, BridgeAddress]:
    announce = Path(workdir) / f"{abs(hash(target))}-{time.monotonic_ns()}.json"
    env = dict(os.environ, SDL_VIDEODRIVER="dummy", PYTHONPATH=str(code_root))
    proc = subprocess.Popen([sys.executable, "-m", "pytest_hud.bridge", target, "--width", str(width), "--vectorization", "sync",
                             *TICK, "--announce", str(announce)], env=env)
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
            claim = await control.claim(seed=seed)
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


def bridge_rate(target: str, width: int, ticks: int, workdir: str, code_root: Path) -> float:
    proc, address = start_bridge(target, width, workdir, code_root)
    try:
        asyncio.run(drive_clients(address, width, min(50, ticks)))  # warm-up
        b_s, b_steps = asyncio.run(drive_clients(address, width, ticks))
    finally:
        proc.terminate()
        proc.wait(10)
    return b_steps / b_s


def codec_cost(target: str) -> str:
    """One slot's observation frame: its size, and what packing + unpacking it costs here."""
    from pytest_hud.bridge.engine import _frame
    from pytest_hud.wire.codec import packb, unpackb

    sim = load_sim(target, 1)
    obs = {k: v[0] for k, v in sim.observe().items()}
    sim.close()
    frame = _frame(obs, 0.0, False, False, False)
    data = packb(frame)
    n = 200
    t0 = time.thread_time()
    for _ in range(n):
        unpackb(packb(frame))
    us = (time.thread_time() - t0) / n * 1e6
    pixels = sum(v.nbytes for v in obs.values() if v.dtype == np.uint8)
    return f"frame {len(data) / 1024:6.1f} KiB ({pixels / 1024:.1f} KiB of pixels); pack + unpack {us:6.1f} µs"


def measure(label: str, target: str, width: int, ticks: int, workdir: str, before: Path | None,
            ref: str | None, repeat: int = 1) -> None:
    """``repeat`` rounds of raw loop, bridge(s), raw loop again: each bridge's rate is divided by the
    mean of the raw rates measured around it (the machine's speed drifts), and the median ratio over
    the rounds is printed last."""
    ratios: dict[str, list[float]] = {}
    for round_ in range(repeat):
        r_s, r_steps = raw_loop(target, width, ticks)
        raw_before = r_steps / r_s
        rows = [(f"before ({ref})", bridge_rate(target, width, ticks, workdir, before))] if before is not None else []
        rows.append(("this checkout", bridge_rate(target, width, ticks, workdir, ROOT)))
        r_s, r_steps = raw_loop(target, width, ticks)
        raw_rate = (raw_before + r_steps / r_s) / 2
        for who, bridge in rows:
            overhead_us = (1 / bridge - 1 / raw_rate) * 1e6
            ratios.setdefault(who, []).append(bridge / raw_rate)
            print(f"{label:<23} {who:<15} width {width}  bridge {bridge:9.0f} env-steps/s   raw {raw_rate:9.0f} "
                  f"env-steps/s   bridge/raw {bridge / raw_rate:5.3f}   overhead {overhead_us:6.1f} µs/slot-step",
                  flush=True)
    if repeat > 1:
        for who, values in ratios.items():
            values.sort()
            print(f"{label:<23} {who:<15} median bridge/raw over {repeat} rounds {values[len(values) // 2]:5.3f} "
                  f"({', '.join(f'{v:.3f}' for v in values)})", flush=True)
    if target != "Pendulum-v1":
        print(f"{'':<23} {codec_cost(target)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--ticks", type=int, default=3000, help="Ticks for Pendulum-v1")
    parser.add_argument("--pixel-ticks", type=int, default=600, help="Ticks for the image envs")
    parser.add_argument("--envs", default="state,pixels", help="Comma-separated: state, pixels, cameras")
    parser.add_argument("--before", help="Also run the bridge of this git ref (e.g. main)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="Rounds per env (raw, bridges, raw again); the median ratio is printed")
    parser.add_argument("--tick", default="auto", help="The bridges' tick mode: auto (ready here), lockstep, ready")
    args = parser.parse_args()
    TICK[1] = args.tick
    with tempfile.TemporaryDirectory() as workdir:
        before = extract_package(args.before, Path(workdir) / "before") if args.before else None
        for name in args.envs.split(","):
            label, target = ENVS[name]
            ticks = args.ticks if name == "state" else args.pixel_ticks
            measure(label, target, args.width, ticks, workdir, before, args.before, args.repeat)


if __name__ == "__main__":
    main()
