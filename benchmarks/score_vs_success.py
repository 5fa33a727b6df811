"""How many episodes does the gate need to catch a known regression on the score, against success?

``--suite cartpole`` (the default): a real sim with a graded score: gymnasium's CartPole (500-step
limit) driven by a PD controller
that sees its observations through Gaussian noise drawn from the episode's seed. The score is the
fraction of the 500 steps the pole stayed up (what ``info["score"]`` would report, as PushT's best
coverage does); success is lasting all of them (``is_success``). The *known regression* is the same
controller with noisier observations (sigma 0.05 -> 0.15): both its success rate and its score drop.

Every seed's episode is run once per checkpoint; then, for each number of paired episodes N, the
gate itself (``evaluate_gate`` on the same N seeds, ``metric: success`` and ``metric: score``)
judges ``--resamples`` random draws of N seeds, and the detection rate (verdict ``regression``) is
printed side by side. Reported: the smallest N at which each metric catches the regression in 80%
of draws, and their ratio.

``--suite metaworld``: real runs through pytest-hud (``pytest -n 2``, a Meta-World bridge) of
pick-place-v3 from state with a 200-step budget, one seed per episode: the baseline is Meta-World's
scripted expert (``evals/policies/meta_world_experts.py:expert``), the known regression the repo's
degraded variant of it (``expert_noisy``: Gaussian action noise, sigma 0.5). The score is the sim's
``info["score"]`` (``evals/sims/meta_world.py``: mean progress of the object towards its goal over
the step budget). Both runs write results files; the regressed run is also gated against the baseline
on the score (its gate lines are printed). Then each draw of N episode ids is cut out of both files'
gate outcomes (``outcomes_from_results``) and judged by ``evaluate_gate`` on each metric, as above.
Needs Meta-World (``pytest-hud[metaworld]``).

    python benchmarks/score_vs_success.py [--seeds 200] [--resamples 200]
    python benchmarks/score_vs_success.py --suite metaworld [--seeds 80] [--resamples 200]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from pytest_hud.gate import GateConfig, TaskOutcomes, evaluate_gate

MAX_STEPS, BASELINE_SIGMA, REGRESSED_SIGMA = 500, 0.05, 0.15
EVALS = Path(__file__).resolve().parents[1] / "evals"
NS = (5, 10, 15, 20, 30, 40, 50, 60, 80, 100, 120, 150)
MW_TASK, MW_STEPS = "pick-place-v3", 200
MW_SUITE = f'''
import pytest


@pytest.mark.hud(sim="{EVALS / 'sims' / 'meta_world.py'}:meta_world",
                 policy="{EVALS / 'policies' / 'meta_world_experts.py'}:expert",
                 build={{"tasks": ["{MW_TASK}"], "max_episode_steps": {MW_STEPS}}}, max_steps={MW_STEPS})
@pytest.mark.parametrize("seed", range(int(__import__("os").environ["MW_SEEDS"])))
def test_pick_place(shared_sim, robot_agent, seed):
    assert robot_agent.run(shared_sim.episode(seed=seed, task="{MW_TASK}")).success
'''


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


def detection(sides, ids: list[str], resamples: int, rng: np.random.Generator, label: str) -> None:
    """Print the gate's detection rate per N, on success and on the score, and the N each needs.

    ``sides(draw)`` gives the (current, baseline) outcomes of one draw of episode ids."""
    configs = {"success": GateConfig(), "score": GateConfig(metrics={"*": "score"})}
    print(f"\n{'N':>4} {'success caught':>15} {'score caught':>13}   "
          f"({resamples} draws of N paired {label} each)")
    first: dict[str, int | None] = {"success": None, "score": None}
    for n in NS:
        if n > len(ids):
            break
        caught = dict.fromkeys(configs, 0)
        for _ in range(resamples):
            cur, old = sides(sorted(rng.choice(ids, n, replace=False)))
            for metric, config in configs.items():
                caught[metric] += evaluate_gate(cur, old, config)[0].verdict == "regression"
        rates = {m: c / resamples for m, c in caught.items()}
        for m, rate in rates.items():
            if first[m] is None and rate >= 0.8:
                first[m] = n
        print(f"{n:>4} {rates['success']:>15.1%} {rates['score']:>13.1%}")
    print()
    for metric, n in first.items():
        print(f"80% detection on {metric}: " + (f"N = {n}" if n else "not within the N tried"))
    if first["success"] and first["score"]:
        print(f"episodes needed, success / score: {first['success'] / first['score']:.1f}x")


def cartpole(args: argparse.Namespace) -> None:
    env = gym.make("CartPole-v1", max_episode_steps=MAX_STEPS)
    started = time.perf_counter()
    base = [episode(env, s, BASELINE_SIGMA) for s in range(args.seeds)]
    regressed = [episode(env, s, REGRESSED_SIGMA) for s in range(args.seeds)]
    print(f"{2 * args.seeds} real CartPole episodes in {time.perf_counter() - started:.1f} s")
    for name, runs in (("baseline", base), ("regressed", regressed)):
        print(f"  {name:<9}: success {np.mean([r[0] for r in runs]):.1%}, "
              f"mean score {np.mean([r[1] for r in runs]):.3f}")

    def sides(draw: list[int]) -> tuple[dict[str, TaskOutcomes], dict[str, TaskOutcomes]]:
        seeds = np.asarray(draw)
        return {"t": side(regressed, seeds)}, {"t": side(base, seeds)}

    detection(sides, list(range(args.seeds)), args.resamples, np.random.default_rng(args.seed), "seeds")


def cut(outcomes: TaskOutcomes, ids: list[str]) -> TaskOutcomes:
    """The task's outcomes restricted to these episode ids, as if the run had declared only them."""
    keep = set(ids)
    return dataclasses.replace(
        outcomes, successes={e: ok for e, ok in outcomes.successes.items() if e in keep},
        scores={e: s for e, s in outcomes.scores.items() if e in keep}, declared=len(ids),
        episodes=frozenset(ids), errored=outcomes.errored & keep)


def metaworld(args: argparse.Namespace) -> None:
    from pytest_hud.core.results import load_results
    from pytest_hud.gate.outcomes import outcomes_from_results

    work = Path(tempfile.mkdtemp(prefix="score-vs-success-"))
    (work / "test_mw_score.py").write_text(MW_SUITE)
    (work / "score.yaml").write_text('tasks: {"*": {metric: score}}\n')
    root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, MW_SEEDS=str(args.seeds), SDL_VIDEODRIVER="dummy", MUJOCO_GL="egl",
               PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    runs = {"baseline": [], "regressed": [
        f"--hud-policy={EVALS / 'policies' / 'meta_world_experts.py'}:expert_noisy",
        f"--hud-baseline={work / 'baseline.jsonl'}", f"--hud-gate={work / 'score.yaml'}"]}
    outcomes = {}
    for name, extra in runs.items():
        started = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", str(work / "test_mw_score.py"), "-n", "2", "--hud-width=2",
             "-q", "-p", "no:cacheprovider", "--rootdir", str(work),
             f"--hud-results={work / f'{name}.jsonl'}", *extra],
            cwd=work, env=env, capture_output=True, text=True, check=False)
        results = load_results(work / f"{name}.jsonl")
        if not results.complete:
            sys.exit(f"the {name} run did not finish (exit {proc.returncode}):\n"
                     f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        (outcomes[name],) = outcomes_from_results(results).values()
        o = outcomes[name]
        took = time.perf_counter() - started
        print(f"{name:<9}: {o.n} real {MW_TASK} episodes through pytest-hud in {took:.0f} s, "
              f"success {o.n_success / o.n:.1%}, mean score {np.mean(list(o.scores.values())):.3f}")
        if name == "regressed":
            print("  its gate on the score, all episodes:")
            for line in proc.stdout.splitlines():
                if line.startswith("gate"):
                    print("    " + line)
    ids = sorted(set(outcomes["baseline"].successes) & set(outcomes["regressed"].successes))

    def sides(draw: list[str]) -> tuple[dict[str, TaskOutcomes], dict[str, TaskOutcomes]]:
        return {"t": cut(outcomes["regressed"], draw)}, {"t": cut(outcomes["baseline"], draw)}

    detection(sides, ids, args.resamples, np.random.default_rng(args.seed), "episodes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=("cartpole", "metaworld"), default="cartpole")
    parser.add_argument("--seeds", type=int, help="episodes per side (default: 200 cartpole, 80 metaworld)")
    parser.add_argument("--resamples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.seeds is None:
        args.seeds = 200 if args.suite == "cartpole" else 80
    (cartpole if args.suite == "cartpole" else metaworld)(args)


if __name__ == "__main__":
    main()
