"""How many episodes does the gate need to catch a known regression on the score, against success?

A real sim with a graded score: gymnasium's CartPole (500-step limit) driven by a PD controller
that sees its observations through Gaussian noise drawn from the episode's seed. The score is the
fraction of the 500 steps the pole stayed up (what ``info["score"]`` would report, as PushT's best
coverage does); success is lasting all of them (``is_success``). The *known regression* is the same
controller with noisier observations (sigma 0.05 -> 0.15): both its success rate and its score drop.

Every seed's episode is run once per checkpoint; then, for each number of paired episodes N, the
gate itself (``evaluate_gate`` on the same N seeds, ``metric: success`` and ``metric: score``)
judges ``--resamples`` random draws of N seeds, and the detection rate (verdict ``regression``) is
printed side by side. Reported: the smallest N at which each metric catches the regression in 80%
of draws, and their ratio.

    python benchmarks/score_vs_success.py [--seeds 200] [--resamples 200]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from pytest_hud.gate import GateConfig, TaskOutcomes, evaluate_gate

MAX_STEPS, BASELINE_SIGMA, REGRESSED_SIGMA = 500, 0.05, 0.15


def episode(env: gym.Env, seed: int, sigma: float) -> tuple[bool, float]:
    """(success, score) of one episode: the controller acts on noisy observations."""
    rng = np.random.default_rng([seed, 7])
    obs, _ = env.reset(seed=seed)
    for t in range(1, MAX_STEPS + 1):
        seen = obs + rng.normal(0.0, sigma, obs.shape)
        obs, _, terminated, truncated, _ = env.step(int(seen[2] + 0.5 * seen[3] > 0))
        if terminated or truncated:
            return bool(truncated and not terminated), t / MAX_STEPS
    return True, 1.0


def side(runs: list[tuple[bool, float]], seeds: np.ndarray) -> TaskOutcomes:
    ids = [str(s) for s in seeds]
    return TaskOutcomes({i: runs[s][0] for i, s in zip(ids, seeds, strict=True)}, declared=len(ids),
                        episodes=frozenset(ids), scores={i: runs[s][1] for i, s in zip(ids, seeds, strict=True)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--resamples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    env = gym.make("CartPole-v1", max_episode_steps=MAX_STEPS)
    started = time.perf_counter()
    base = [episode(env, s, BASELINE_SIGMA) for s in range(args.seeds)]
    regressed = [episode(env, s, REGRESSED_SIGMA) for s in range(args.seeds)]
    print(f"{2 * args.seeds} real CartPole episodes in {time.perf_counter() - started:.1f} s")
    for name, runs in (("baseline", base), ("regressed", regressed)):
        print(f"  {name:<9}: success {np.mean([r[0] for r in runs]):.1%}, mean score {np.mean([r[1] for r in runs]):.3f}")
    configs = {"success": GateConfig(), "score": GateConfig(metrics={"t": "score"})}
    rng = np.random.default_rng(args.seed)
    print(f"\n{'N':>4} {'success caught':>15} {'score caught':>13}   ({args.resamples} draws of N paired seeds each)")
    first: dict[str, int | None] = {"success": None, "score": None}
    for n in (5, 10, 15, 20, 30, 40, 50, 60, 80, 100, 120, 150):
        if n > args.seeds:
            break
        caught = dict.fromkeys(configs, 0)
        for _ in range(args.resamples):
            seeds = rng.choice(args.seeds, n, replace=False)
            cur, old = {"t": side(regressed, seeds)}, {"t": side(base, seeds)}
            for metric, config in configs.items():
                caught[metric] += evaluate_gate(cur, old, config)[0].verdict == "regression"
        rates = {m: c / args.resamples for m, c in caught.items()}
        for m, rate in rates.items():
            if first[m] is None and rate >= 0.8:
                first[m] = n
        print(f"{n:>4} {rates['success']:>15.1%} {rates['score']:>13.1%}")
    print()
    for metric, n in first.items():
        print(f"80% detection on {metric}: " + (f"N = {n}" if n else "not within the N tried"))
    if first["success"] and first["score"]:
        print(f"episodes needed, success / score: {first['success'] / first['score']:.1f}x")


if __name__ == "__main__":
    main()
