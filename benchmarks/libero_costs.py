"""What a LIBERO episode costs on this machine: env build, reset (hard reset, init state, 10 settle
steps) and policy step, with both 256-px cameras and state only; then the full protocol extrapolated
(4 suites x 10 tasks x 50 init states, every episode to its step limit); then the time per step of
a chunking policy's episode, whose env renders only the frames the policy reads (one per chunk of
10 or 50 actions), against rendering every step, measured side by side (alternating blocks of
steps in one env). Not a test.

    MUJOCO_GL=egl python benchmarks/libero_costs.py [--steps 20] [--resets 2] [--chunk-rounds 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from pathlib import Path

import numpy as np

SIM = Path(__file__).resolve().parents[1] / "evals" / "sims" / "libero.py"


def load_sim():
    spec = importlib.util.spec_from_file_location("_hud_libero_bench", SIM)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure(lib, cameras: bool, steps: int, resets: int) -> dict[str, float]:
    t0 = time.perf_counter()
    env = lib.LiberoTask("libero_spatial", "task_00", cameras=cameras)
    build = time.perf_counter() - t0
    reset_times, step_times = [], []
    rng = np.random.default_rng(0)
    try:
        for r in range(resets):
            t0 = time.perf_counter()
            env.reset(seed=r)
            reset_times.append(time.perf_counter() - t0)
            for _ in range(steps):
                action = rng.uniform(-1, 1, 7).astype(np.float32)
                t0 = time.perf_counter()
                env.step(action)
                step_times.append(time.perf_counter() - t0)
    finally:
        env.close()
    return {"build": build, "reset": statistics.median(reset_times), "step": statistics.median(step_times)}


def chunked(lib, chunks: tuple[int, ...], rounds: int) -> dict[int, float]:
    """Mean seconds per step with cameras, rendering every step (chunk 1) and only each chunk's last
    step (the frame its policy reads), in alternating blocks of 50 steps of one env."""
    env = lib.LiberoTask("libero_spatial", "task_00", max_episode_steps=990)
    rng = np.random.default_rng(0)
    spent = {c: 0.0 for c in (1, *chunks)}
    counted = {c: 0 for c in spent}
    try:
        for r in range(rounds):
            for chunk in spent:
                env.reset(seed=r)
                t0 = time.perf_counter()
                for t in range(50):
                    env.hud_skip_render((t + 1) % chunk != 0)
                    env.step(rng.uniform(-1, 1, 7).astype(np.float32))
                spent[chunk] += time.perf_counter() - t0
                counted[chunk] += 50
    finally:
        env.close()
    return {c: spent[c] / counted[c] for c in spent}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--resets", type=int, default=2)
    ap.add_argument("--chunk-rounds", type=int, default=3, help="Alternating rounds of 50 steps per chunk size")
    args = ap.parse_args()
    lib = load_sim()
    episodes = len(lib.MAX_STEPS) * 10 * lib.INIT_STATES
    steps = 10 * lib.INIT_STATES * sum(lib.MAX_STEPS.values())
    for cameras in (True, False):
        m = measure(lib, cameras, args.steps, args.resets)
        hours = (episodes * m["reset"] + steps * m["step"]) / 3600
        print(f"{'cameras' if cameras else 'state  '}: build {m['build']:.1f} s, reset {m['reset']:.2f} s, "
              f"step {m['step'] * 1e3:.0f} ms -> full protocol ({episodes} episodes, {steps} steps at the "
              f"limits) ~{hours:.1f} CPU-hours in one process, policy time not counted")
    per_step = chunked(lib, (10, 50), args.chunk_rounds)
    every = per_step.pop(1)
    print(f"cameras, rendering every step: {every * 1e3:.0f} ms per step")
    for chunk, seconds in per_step.items():
        print(f"cameras, a chunk of {chunk} (renders the frame its policy reads): {seconds * 1e3:.0f} ms per "
              f"step = {seconds / every:.2f} of rendering every step")


if __name__ == "__main__":
    main()
