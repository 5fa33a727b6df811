"""pytest-hud vs ``lerobot-eval --env.type=metaworld`` on the Meta-World ACT checkpoint: one run, side by side.

    .venv-lerobot/bin/python benchmarks/vs_lerobot_eval_metaworld.py [--episodes 10] [--width 2]

Both sides get the same checkpoint (``evals/checkpoints/metaworld_act/final``, a state-only ACT
on Meta-World's 39-float observation) and the same tasks (``evals/test_metaworld_act.py``'s three),
each command timed as a whole subprocess:

- ``hud``: ``pytest evals/test_metaworld_act.py -n W --hud-width=W`` (seeds 0..N-1 per task).
- ``lerobot-eval``: ``lerobot-eval --policy.path=CKPT --env.type=metaworld --env.task=T1,T2,T3
  --eval.batch_size=W --eval.n_episodes=N --policy.device=cpu --eval.use_async_envs=false`` (the
  flag where the installed LeRobot knows it: 0.6 defaults to one process per env).

What can and cannot agree:

- **Per seed, never.** LeRobot's ``MetaworldEnv`` builds ``MT1(task, seed=42)``, sets
  ``train_tasks[0]`` once and then unfreezes the random vector, so every reset draws a new object
  and goal position from Meta-World's own RNG, whatever ``--seed`` says; pytest-hud's seed ``s``
  is variation ``s % 50`` of ``MT1(task, seed=s // 50)``. Only success *rates* are comparable, with
  their intervals.
- **Observations.** LeRobot's Meta-World env (0.4.4 and 0.6.1 alike) offers ``pixels`` (480x480,
  camera ``corner2`` moved) and ``pixels_agent_pos`` (those pixels plus ``agent_pos`` = the first 4
  state floats: hand xyz and gripper); ``obs_type="state"`` raises ``NotImplementedError``. A
  policy of the full 39-float state (objects and goal included) therefore cannot be evaluated by
  ``lerobot-eval`` at all; this script runs it anyway and prints the error it ends with, so the
  statement stays checked against the installed LeRobot.

Not a test: the machine is shared and noisy; only side-by-side figures count.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_hud.stats import wilson_interval
from vs_lerobot_eval import sync_env_args  # this script's folder is on sys.path

CHECKPOINT = ROOT / "evals" / "checkpoints" / "metaworld_act" / "final"
TASKS = ("reach-v3", "button-press-topdown-v3", "drawer-close-v3")


def run_timed(command: list[str], env: dict[str, str], log: Path) -> tuple[float, int]:
    started = time.perf_counter()
    with open(log, "w") as out:
        code = subprocess.run(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    return time.perf_counter() - started, code


def rate_text(successes: int, n: int) -> str:
    low, high = wilson_interval(successes, n)
    return f"{successes:3d}/{n:<3d} {successes / n:6.1%}  95% CI [{low:.1%}, {high:.1%}]"


def first_error(log: Path) -> str:
    """The exception the run died of: the first ``SomeError: message`` line (teardown noise comes later)."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    pattern = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception): ")
    errors = [line for line in lines if pattern.match(line)]
    return (errors or lines or ["(no output)"])[0][:300]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=10, help="Episodes per task on each side")
    parser.add_argument("--width", type=int, default=2, help="-n and --hud-width; lerobot-eval's batch size")
    parser.add_argument("--checkpoint", type=Path, default=CHECKPOINT)
    parser.add_argument("--python", type=Path, default=Path(sys.executable),
                        help="Interpreter of the LeRobot venv (lerobot-eval is taken from its bin/)")
    args = parser.parse_args(argv)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    print(f"checkpoint {args.checkpoint}; tasks {', '.join(TASKS)}; {args.episodes} episodes per task, width "
          f"{args.width}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}\n", flush=True)

    with tempfile.TemporaryDirectory(prefix="vs-lerobot-eval-mw-") as scratch:
        scratch = Path(scratch)
        results = scratch / "hud.jsonl"
        hud = [str(args.python), "-m", "pytest", "evals/test_metaworld_act.py", "-n", str(args.width),
               f"--hud-width={args.width}", "-q", "-p", "no:cacheprovider", f"--hud-policy={args.checkpoint}",
               f"--hud-results={results}"]
        wall, code = run_timed(hud, dict(env, METAWORLD_ACT_EPISODES=str(args.episodes)), scratch / "hud.log")
        print(f"hud           wall {wall:6.1f}s  exit {code}  {' '.join(hud[2:])}")
        if results.is_file():
            records = [json.loads(line) for line in results.read_text().splitlines()]
            for task in TASKS:
                graded = [r for r in records if r.get("record") == "episode" and f"[task={task}]" in r["task"]
                          and r["outcome"] in ("passed", "failed")]
                print(f"  {task:26s} {rate_text(sum(bool(r['success']) for r in graded), len(graded))}")
        else:
            print("  no results file; the run's last error:", first_error(scratch / "hud.log"))

        output = scratch / "lerobot-eval"
        theirs = [str(args.python.parent / "lerobot-eval"), f"--policy.path={args.checkpoint}", "--env.type=metaworld",
                  f"--env.task={','.join(TASKS)}", f"--eval.batch_size={args.width}",
                  f"--eval.n_episodes={args.episodes}", "--policy.device=cpu", f"--output_dir={output}",
                  *sync_env_args(args.python, env)]
        wall, code = run_timed(theirs, env, scratch / "lerobot-eval.log")
        print(f"lerobot-eval  wall {wall:6.1f}s  exit {code}  {' '.join(theirs)}")
        info = output / "eval_info.json"
        if code == 0 and info.is_file():
            for entry in json.loads(info.read_text()).get("per_task", []):
                successes = [bool(s) for s in entry["metrics"]["successes"]]
                print(f"  {entry.get('task', '?')!s:26s} {rate_text(sum(successes), len(successes))}")
        else:
            print(f"  lerobot-eval could not evaluate this checkpoint: {first_error(scratch / 'lerobot-eval.log')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
