"""pytest-hud vs the naive way, on the same episodes, measured in one run.

    python benchmarks/plugin_overhead.py [--suite cartpole|reach_pixels|mountain_car] [--workers 8]

1. ``pytest evals/test_<suite>.py -n W --hud-width=W`` (shared bridge, one episode per test).
2. The naive way: the same parametrized tests, but each test builds its own env in-process and runs
   the same policy (``pytest -n W``, no sharing).
3. In-process reference: the same episodes in a plain loop, timing env steps and policy calls.

Prints wall times, their ratio, and pytest-hud's per-episode overhead: the episode's duration
minus the time the same episode spends in the env and the policy when run in-process.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
EVALS = ROOT / "evals"
sys.path[:0] = [str(ROOT), str(EVALS / "sims"), str(EVALS / "policies")]
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

SUITES = {  # suite: (sim factory module:function, policy factory, number of seeds)
    "cartpole": ("classic:cartpole", "numpy_policies:cartpole", 32),
    "mountain_car": ("classic:mountain_car", "numpy_policies:mountain_car", 24),
    "reach_pixels": ("reach_pixels:reach_pixels", "numpy_policies:reach_pixels", 24),
}

NAIVE_TEST = '''
import sys
sys.path[:0] = [{sims!r}, {policies!r}]
import pytest
from {sim_mod} import {sim_fn} as make_env
from {pol_mod} import {pol_fn} as make_policy

@pytest.mark.parametrize("seed", range({n}))
def test_naive(seed):
    env = make_env()
    policy = make_policy()
    obs, _ = env.reset(seed=seed)
    while True:
        view = obs if isinstance(obs, dict) else {{"state": obs}}
        obs, reward, terminated, truncated, info = env.step(policy.predict(view))
        if terminated or truncated:
            break
    env.close()
    assert info.get("is_success")
'''


def _call(spec: str):
    mod, fn = spec.split(":")
    return getattr(__import__(mod), fn)


def in_process(sim: str, policy: str, n: int) -> tuple[float, float]:
    """Mean per-episode seconds in env steps and in policy calls."""
    make_env, make_policy = _call(sim), _call(policy)
    env_s = pol_s = 0.0
    for seed in range(n):
        env, pol = make_env(), make_policy()
        obs, _ = env.reset(seed=seed)
        while True:
            view = obs if isinstance(obs, dict) else {"state": obs}
            t0 = time.perf_counter()
            action = pol.predict(view)
            t1 = time.perf_counter()
            obs, _, terminated, truncated, _ = env.step(action)
            t2 = time.perf_counter()
            pol_s += t1 - t0
            env_s += t2 - t1
            if terminated or truncated:
                break
        env.close()
    return env_s / n, pol_s / n


def timed(cmd: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=sorted(SUITES), default="cartpole")
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()
    sim, policy, n = SUITES[args.suite]
    w = str(args.workers)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        results = tmp / "hud.jsonl"
        (tmp / "naive").mkdir()
        (tmp / "naive" / "test_naive.py").write_text(NAIVE_TEST.format(
            sims=str(EVALS / "sims"), policies=str(EVALS / "policies"), n=n,
            sim_mod=sim.split(":")[0], sim_fn=sim.split(":")[1],
            pol_mod=policy.split(":")[0], pol_fn=policy.split(":")[1]))
        base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", w]
        hud_s = timed(base + [f"--hud-width={w}", f"--hud-results={results}",
                              str(EVALS / f"test_{args.suite}.py")], ROOT)
        naive_s = timed(base + ["-p", "no:hud", str(tmp / "naive")], tmp)
        from pytest_hud.results import load_results

        episodes = load_results(results).episodes
    env_s, pol_s = in_process(sim, policy, n)
    durations = np.array([e.duration_s for e in episodes])
    steps = np.array([e.steps for e in episodes])
    overhead = durations.mean() - env_s - pol_s
    print(f"suite {args.suite}: {n} episodes, {steps.mean():.0f} steps/episode on average, -n {w}")
    print(f"  pytest-hud (shared bridge, width {w}) wall {hud_s:6.2f} s")
    print(f"  naive (env built per test, in-process) wall {naive_s:6.2f} s")
    print(f"  wall ratio naive / pytest-hud          {naive_s / hud_s:6.2f}")
    print(f"  per episode: duration {durations.mean() * 1e3:7.1f} ms = env {env_s * 1e3:6.1f} ms + policy "
          f"{pol_s * 1e3:6.1f} ms + pytest-hud {overhead * 1e3:6.1f} ms "
          f"({overhead / steps.mean() * 1e6:5.0f} µs per step)")


if __name__ == "__main__":
    main()
