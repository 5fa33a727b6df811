"""pytest-hud vs the naive way, on the same episodes, measured in one run.

    python benchmarks/plugin_overhead.py [--suite cartpole|mountain_car|reach_pixels|reach_act] [--workers 8]

(``reach_act`` loads a LeRobot checkpoint: run it with LeRobot installed.)

1. ``pytest evals/test_<suite>.py -n W --hud-width=W`` (shared bridge, one episode per test).
2. The naive way: the same parametrized tests, but each test builds its own env and loads its own
   policy in-process (``pytest -n W``, no sharing), as hand-written eval suites do.
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
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

SUITES = {  # suite: (sim target, policy spec, number of seeds) -- the same as in evals/test_<suite>.py
    "cartpole": (f"{EVALS}/sims/classic.py:cartpole", f"{EVALS}/policies/numpy_policies.py:cartpole", 32),
    "mountain_car": (f"{EVALS}/sims/classic.py:mountain_car", f"{EVALS}/policies/numpy_policies.py:mountain_car", 24),
    "reach_pixels": (f"{EVALS}/sims/reach_pixels.py:reach_pixels", f"{EVALS}/policies/numpy_policies.py:reach_pixels", 24),
    "reach_act": (f"{EVALS}/sims/reach.py:make_reach", str(EVALS / "checkpoints" / "reach_act" / "final"), 24),
}

NAIVE_TEST = """
import sys
sys.path.insert(0, {bench!r})
import pytest
from naive_support import build_env, build_policy

@pytest.mark.parametrize("seed", range({n}))
def test_naive(seed):
    env = build_env({sim!r})            # what a hand-written suite does: its own env per test...
    policy = build_policy({policy!r}, env)  # ...and its own model
    obs, _ = env.reset(seed=seed)
    queue = []
    while True:
        if not queue:
            queue = list(policy.predict(obs if isinstance(obs, dict) else {{"state": obs}}))
        obs, reward, terminated, truncated, info = env.step(queue.pop(0))
        if terminated or truncated:
            break
    env.close()
    assert info.get("is_success")
"""


def in_process(sim: str, policy: str, n: int) -> tuple[float, float]:
    """Mean per-episode seconds in env steps and in policy calls (env and model built once)."""
    from naive_support import build_env, build_policy

    env_s = pol_s = 0.0
    env = build_env(sim)
    pol = build_policy(policy, env)
    obs, _ = env.reset(seed=0)
    pol.predict(obs if isinstance(obs, dict) else {"state": obs})  # warm-up (lazy inits)
    for seed in range(n):
        obs, _ = env.reset(seed=seed)
        queue: list = []
        while True:
            t0 = time.perf_counter()
            if not queue:
                queue = list(pol.predict(obs if isinstance(obs, dict) else {"state": obs}))
            action = queue.pop(0)
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
    parser.add_argument("--policy-server", action="store_true",
                        help="Serve the policy from one batched policy server (--hud-policy-server)")
    args = parser.parse_args()
    sim, policy, n = SUITES[args.suite]
    w = str(args.workers)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        results = tmp / "hud.jsonl"
        (tmp / "naive").mkdir()
        (tmp / "naive" / "test_naive.py").write_text(NAIVE_TEST.format(sim=sim, policy=policy, n=n, bench=str(ROOT / "benchmarks")))
        base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", w]
        extra = ["--hud-policy-server"] if args.policy_server else []
        hud_s = timed(base + extra + [f"--hud-width={w}", f"--hud-results={results}",
                              str(EVALS / f"test_{args.suite}.py")], ROOT)
        naive_s = timed(base + ["-p", "no:hud", str(tmp / "naive")], tmp)
        from pytest_hud.core.results import load_results

        episodes = load_results(results).episodes
    env_s, pol_s = in_process(sim, policy, n)
    durations = np.array([e.duration_s for e in episodes])
    steps = np.array([e.steps for e in episodes])
    overhead = durations.mean() - env_s - pol_s
    print(f"suite {args.suite}: {n} episodes, {steps.mean():.0f} steps/episode on average, -n {w}")
    served = ", policy server" if args.policy_server else ""
    print(f"  pytest-hud (shared bridge, width {w}{served}) wall {hud_s:6.2f} s")
    print(f"  naive (env built per test, in-process) wall {naive_s:6.2f} s")
    print(f"  wall ratio naive / pytest-hud          {naive_s / hud_s:6.2f}")
    print(f"  per episode: duration {durations.mean() * 1e3:7.1f} ms = env {env_s * 1e3:6.1f} ms + policy "
          f"{pol_s * 1e3:6.1f} ms + pytest-hud {overhead * 1e3:6.1f} ms "
          f"({overhead / steps.mean() * 1e6:5.0f} µs per step)")


if __name__ == "__main__":
    main()
