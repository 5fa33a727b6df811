"""Instructions per CartPole step: the naive loop against pytest-hud's, counted by callgrind.

    python benchmarks/step_instructions.py [--episodes 2 12]

Wall and CPU times on a shared 2-core machine move by 10-30 % from run to run, which hides the
per-step costs that decide ``vs_naive.py``'s CartPole ratios. An instruction count does not move
with the load. Each side runs in one process under ``valgrind --tool=callgrind`` twice, with the
two episode counts of ``--episodes``. The difference between those two runs, divided by the steps
between them, is the count per step, with start-up and imports taken out and each episode's own
work (building the env, a claim and a grade) spread over its steps. ``PYTHONHASHSEED=0`` and one
OpenBLAS thread (its idle threads spin for as long as the timing lets them) keep the counts the
same from run to run. The sides:

- **env + policy**: the env stepped with the policy's action and nothing else (a floor);
- **naive**: ``naive_support.py``'s loop, the env and the policy built in each episode;
- **pytest-hud**: the agent loop over a worker's own env (what ``--hud-inline=auto`` runs),
  configured as the ``robot_agent`` fixture configures it (a video recorder for failed episodes and
  the default timeouts' watchdog), outside pytest.

The ratio printed is naive / pytest-hud per step (>= 1.0: pytest-hud's step is no dearer). It
counts instructions, not time, and leaves out pytest's own per-test work on both sides.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIM = str(ROOT / "evals" / "sims" / "classic.py") + ":cartpole"
POLICY = str(ROOT / "evals" / "policies" / "numpy_policies.py") + ":cartpole"
STEPS = 500  # CartPole-v1's limit, which the checkpoint's policy reaches on every seed
SIDES = ("env + policy", "naive", "pytest-hud")


def child(side: str, episodes: int) -> None:
    """The workload measured: ``episodes`` CartPole episodes of ``side``."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from naive_support import build_env, build_model, build_policy, run_episode

    if side == "naive":
        for seed in range(episodes):
            env = build_env(SIM)
            run_episode(env, build_policy(POLICY, env), seed)
            env.close()
        return
    if side == "env + policy":
        for seed in range(episodes):
            env = build_env(SIM)
            model, _ = build_model(POLICY, env)
            obs, _ = env.reset(seed=seed)
            ended = False
            while not ended:
                obs, _, terminated, truncated, _ = env.step(model.predict({"state": obs}))
                ended = terminated or truncated
            env.close()
        return
    from pytest_hud.agent.loop import Agent
    from pytest_hud.agent.model import load_policy
    from pytest_hud.client.episode import Episode
    from pytest_hud.recording.video import VideoRecorder
    from pytest_hud.worker.inline import InlineBridge

    class InlineEpisode(Episode):  # what the worker's episode does when its sim is inline
        def open_slot(self, recv_timeout: float):
            return self.control.open_slot(self.token)

    bridge = InlineBridge(SIM, {})
    contract = bridge.contract()
    agent = Agent(load_policy(POLICY, contract), observers=[VideoRecorder(tempfile.mkdtemp(), "failed")],
                  first_action_timeout=300.0, step_timeout=60.0)
    for seed in range(episodes):
        result = agent.run(InlineEpisode(bridge, contract, seed=seed))
        assert result.steps == STEPS, result.steps


def instructions(side: str, episodes: int) -> int:
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONHASHSEED="0", OPENBLAS_NUM_THREADS="1")
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__,
         "--child", side, str(episodes)],
        capture_output=True, text=True, check=False, env=env)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode != 0 or found is None:
        raise SystemExit(f"{side}: the run under callgrind failed:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, nargs=2, default=(2, 12), metavar=("FEW", "MANY"),
                        help="Episode counts of the two runs of each side")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind): it counts the instructions")
    few, many = args.episodes
    print(f"CartPole, instructions (callgrind) of {many} episodes less {few}, per step "
          f"(each episode's own work spread over its {STEPS})")
    per_step: dict[str, float] = {}
    for side in SIDES:
        small, large = instructions(side, few), instructions(side, many)
        per_step[side] = (large - small) / ((many - few) * STEPS)
        print(f"  {side:<13} {per_step[side] / 1000:8.1f}k per step", flush=True)
    floor = per_step["env + policy"]
    print(f"  above env + policy: naive {(per_step['naive'] - floor) / 1000:.1f}k, "
          f"pytest-hud {(per_step['pytest-hud'] - floor) / 1000:.1f}k per step")
    print(f"  naive / pytest-hud {per_step['naive'] / per_step['pytest-hud']:.2f}")


if __name__ == "__main__":
    main()
