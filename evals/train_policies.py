"""Train the example evals' numpy policies and write their checkpoints (a few hundred bytes each).

    python evals/train_policies.py

Deterministic (fixed seeds). Training seeds are disjoint from the evaluation seeds the suites use
(evals use seeds 0..N-1; training uses 10_000 and up). Prints each policy's success rate on
held-out seeds at the end.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
sys.path[:0] = [str(HERE / "sims"), str(HERE / "policies")]

from classic import cartpole, mountain_car  # noqa: E402
from numpy_policies import CHECKPOINTS, LinearDiscrete, LinearTanh, PixelReach, reach_features  # noqa: E402
from reach import expert_action, make_reach  # noqa: E402
from reach_pixels import reach_pixels  # noqa: E402


EARLY_ITERATION = 6  # the earlier, worse CartPole checkpoint of the same run


def rollout(make_env, policy, seed: int) -> tuple[bool, float, float]:
    """(success, return, furthest first state coordinate) of one episode."""
    env = make_env()
    obs, _ = env.reset(seed=seed)
    total, furthest = 0.0, -np.inf
    while True:
        view = obs if isinstance(obs, dict) else {"state": obs}
        obs, reward, terminated, truncated, info = env.step(policy.predict(view))
        total += float(reward)
        if not isinstance(obs, dict):
            furthest = max(furthest, float(obs[0]))
        if terminated or truncated:
            env.close()
            return bool(info.get("is_success")), total, furthest


def success_rate(make_env, policy, seeds) -> float:
    return float(np.mean([rollout(make_env, policy, s)[0] for s in seeds]))


def cem(score, dim: int, rng: np.random.Generator, iters: int = 12, pop: int = 24, elite: int = 6,
        std0: float = 2.0, snapshots: dict[int, np.ndarray] | None = None) -> np.ndarray:
    """Cross-entropy method: sample parameters, keep the best, refit the Gaussian.

    ``snapshots`` (iteration → None) is filled with the mean after those iterations (earlier,
    worse checkpoints of the same run, for the gate demonstration).
    """
    mean, std = np.zeros(dim), np.ones(dim) * std0
    for it in range(iters):
        if snapshots is not None and it in snapshots:
            snapshots[it] = mean.copy()
        cand = mean + std * rng.standard_normal((pop, dim))
        scores = np.array([score(c) for c in cand])
        best = cand[np.argsort(scores)[-elite:]]
        mean, std = best.mean(0), best.std(0) + 0.05
    return mean


def _cartpole_policy(params) -> LinearDiscrete:
    return LinearDiscrete(np.stack([np.zeros(4), params[:4]]), np.array([0.0, params[4]]))


def train_cartpole(rng, snapshots=None) -> LinearDiscrete:
    make = _cartpole_policy

    def train(p):  # mean return: dense, unlike success
        return np.mean([rollout(cartpole, make(p), s)[1] for s in range(10_000, 10_008)]) / 500
    return make(cem(train, 5, rng, iters=20, pop=40, elite=8, snapshots=snapshots))


def train_mountain_car(rng) -> LinearTanh:
    def make(params):
        return LinearTanh(params[None, :2], params[2:3])

    def train(p):  # success first, then how far up the hill the car got
        runs = [rollout(mountain_car, make(p), s) for s in range(10_000, 10_003)]
        return np.mean([ok + 0.1 * furthest for ok, _, furthest in runs])
    return make(cem(train, 3, rng, iters=10, std0=30.0))  # velocities are ~0.05: large gains


def train_reach_pixels(rng, episodes: int = 150) -> PixelReach:
    """Behaviour cloning: least squares from pixel features to the scripted expert's actions."""
    feats, actions = [], []
    for ep in range(episodes):
        env = make_reach(image=True)
        obs, _ = env.reset(seed=10_000 + ep)
        for _ in range(40):
            act = expert_action(obs["state"], noise=0.1, rng=rng)
            feats.append(reach_features(obs["pixels"]))
            actions.append(expert_action(obs["state"]))  # label: the noiseless expert
            obs, _, terminated, truncated, _ = env.step(act)
            if terminated or truncated:
                break
    head, *_ = np.linalg.lstsq(np.array(feats), np.array(actions), rcond=None)
    return PixelReach(head.T)


def main() -> None:
    CHECKPOINTS.mkdir(parents=True, exist_ok=True)
    held_out = range(20_000, 20_030)
    t0 = time.perf_counter()
    snapshots = {EARLY_ITERATION: None}
    cp = train_cartpole(np.random.default_rng(0), snapshots)
    np.savez(CHECKPOINTS / "cartpole_linear.npz", weights=cp.weights, bias=cp.bias)
    print(f"cartpole      trained in {time.perf_counter() - t0:5.1f} s, "
          f"held-out success {success_rate(cartpole, cp, held_out):.0%}")
    early = _cartpole_policy(snapshots[EARLY_ITERATION])
    np.savez(CHECKPOINTS / "cartpole_linear_early.npz", weights=early.weights, bias=early.bias)
    print(f"cartpole (early, iteration {EARLY_ITERATION}) held-out success {success_rate(cartpole, early, held_out):.0%}")
    t0 = time.perf_counter()
    mc = train_mountain_car(np.random.default_rng(1))
    np.savez(CHECKPOINTS / "mountain_car_linear.npz", weights=mc.weights, bias=mc.bias)
    print(f"mountain car  trained in {time.perf_counter() - t0:5.1f} s, "
          f"held-out success {success_rate(mountain_car, mc, held_out):.0%}")
    t0 = time.perf_counter()
    rp = train_reach_pixels(np.random.default_rng(2))
    np.savez(CHECKPOINTS / "reach_pixels_head.npz", head=rp.head)
    print(f"reach pixels  trained in {time.perf_counter() - t0:5.1f} s, "
          f"held-out success {success_rate(reach_pixels, rp, held_out):.0%}")


if __name__ == "__main__":
    main()
