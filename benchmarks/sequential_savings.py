"""How many episodes does ``--hud-sequential`` save, and what does it cost in errors?

Simulates paired evaluations (the same seeds under the baseline and the new policy) and runs, on
the same simulated episodes, side by side:

- **fixed-n**: the exact one-sided McNemar test after N pairs, N planned for 80% power against a
  10-point drop from 90% (``stats.episodes_needed``), at alpha = 0.05;
- **sequential**: ``stats.SequentialTest`` (alpha = 0.05, detect_drop = 0.10, beta = 0.2), checked
  after every pair and stopped at the first decision, capped at N or 2N pairs.

Scenarios: 90% vs 90% (false alarms) and 90% vs 80% (power), with independent runs per seed and
with runs that agree more (rho: the chance that a seed's two runs share the same random draw, as
seeded sims do). Reported: mean pairs used, savings ratio (N / mean), false-alarm rate or power,
and how often the sequential test ends undecided at its cap.

    python benchmarks/sequential_savings.py [--sims 4000] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from pytest_hud.stats import episodes_needed, mcnemar_exact_one_sided, sequential_log_evalues

ALPHA, BETA, BASE, DETECT = 0.05, 0.2, 0.9, 0.10


def simulate_pairs(rng: np.random.Generator, sims: int, n: int, p_base: float, p_new: float, rho: float):
    """(baseline, current) successes; with probability rho a seed's two runs share one uniform draw.

    Sharing the draw keeps both marginal rates exact while making the runs agree more often.
    """
    u = rng.random((sims, n))
    v = np.where(rng.random((sims, n)) < rho, u, rng.random((sims, n)))
    return u < p_base, v < p_new


def mcnemar_critical(n: int) -> np.ndarray:
    """Fewest worse pairs, for each number d of discordant pairs, that the exact test flags at ALPHA."""
    table = np.full(n + 1, n + 2)
    for d in range(1, n + 1):
        worse = d // 2
        while worse <= d and mcnemar_exact_one_sided(worse, d - worse) > ALPHA:
            worse += 1
        table[d] = worse if worse <= d else n + 2
    return table


def fixed_n(base: np.ndarray, cur: np.ndarray, n: int, critical: np.ndarray) -> np.ndarray:
    worse = (base[:, :n] & ~cur[:, :n]).sum(axis=1)
    better = (cur[:, :n] & ~base[:, :n]).sum(axis=1)
    return worse >= critical[worse + better]


def sequential(base: np.ndarray, cur: np.ndarray, cap: int) -> tuple[np.ndarray, np.ndarray]:
    """Decision per simulation (+1 regression, -1 pass, 0 undecided at the cap) and pairs used."""
    b, c = base[:, :cap], cur[:, :cap]
    worse = np.cumsum(b & ~c, axis=1)
    better = np.cumsum(c & ~b, axis=1)
    concordant = np.arange(1, cap + 1)[None, :] - worse - better
    log_reg, log_pass = sequential_log_evalues(worse, better, concordant, detect_drop=DETECT)
    reg = log_reg >= -math.log(ALPHA)
    ok = log_pass >= -math.log(BETA)
    never = cap + 1
    t_reg = np.where(reg.any(axis=1), reg.argmax(axis=1), never)
    t_pass = np.where(ok.any(axis=1), ok.argmax(axis=1), never)
    decision = np.where((t_reg <= t_pass) & (t_reg < never), 1, np.where(t_pass < never, -1, 0))
    used = np.minimum(np.minimum(t_reg, t_pass) + 1, cap)
    return decision, used


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sims", type=int, default=4000, help="Simulated evaluations per scenario")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the numpy Generator")
    args = parser.parse_args()

    start = time.perf_counter()
    n = episodes_needed(DETECT, baseline_rate=BASE, paired=True, alpha=ALPHA, power=1 - BETA)
    assert n is not None
    critical = mcnemar_critical(2 * n)
    rng = np.random.default_rng(args.seed)
    print(
        f"paired episodes, alpha={ALPHA}, fixed n={n} (80% power for {BASE:.0%} -> {BASE - DETECT:.0%},"
        f" independent runs), sequential detect_drop={DETECT}, beta={BETA}, {args.sims} sims/scenario"
    )
    header = (
        f"{'scenario':<22}{'method':<22}{'mean pairs':>11}{'savings':>9}"
        f"{'flagged':>9}{'passed':>8}{'undecided':>10}"
    )
    print(header)
    print("-" * len(header))
    for p_new in (BASE, BASE - DETECT):
        for rho in (0.0, 0.7):
            base, cur = simulate_pairs(rng, args.sims, 2 * n, BASE, p_new, rho)
            name = f"{BASE:.0%} vs {p_new:.0%}, rho={rho}"
            what = "false alarm" if p_new == BASE else "power"
            flagged = fixed_n(base, cur, n, critical).mean()
            fixed = f"fixed n={n}"
            print(f"{name:<22}{fixed:<22}{n:>11.1f}{1.0:>9.2f}{flagged:>9.3f}{'':>18}  ({what})")
            for cap in (n, 2 * n):
                decision, used = sequential(base, cur, cap)
                mean = used.mean()
                rates = [np.mean(decision == d) for d in (1, -1, 0)]
                print(
                    f"{'':<22}{f'sequential, cap {cap}':<22}{mean:>11.1f}{n / mean:>9.2f}"
                    f"{rates[0]:>9.3f}{rates[1]:>8.3f}{rates[2]:>10.3f}"
                )
    print(f"savings = fixed n / mean pairs used; {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
