"""Record -> train -> evaluate on Meta-World: the ACT checkpoints shipped with ``evals/test_metaworld_act.py``.

1. **Record**: a real pytest run of ``evals/test_metaworld_act.py`` with Meta-World's scripted expert
   as the policy (``--hud-policy evals/policies/meta_world_experts.py:expert``) on demonstration seeds
   (1000 onwards: task variations the evaluation seeds 0..N-1 never use), ``--hud-record`` writing
   every graded episode into one LeRobot v3 dataset (``observation.state`` [39], ``action`` [4]).
2. **Train**: one small state-only ACT for all the tasks, on the CPU, with LeRobot's own training
   step (``scripts/lerobot_training.py``); a snapshot after ``--early-steps`` updates is kept.
3. **Save** (policy + processors, no optimizer state, under 2 MB each)::

       evals/checkpoints/metaworld_act/early/   an earlier snapshot of the same run: clearly worse
       evals/checkpoints/metaworld_act/final/   the trained policy

4. **Evaluate** both on held-out seeds through ``pytest_hud.agent.lerobot.LeRobotPolicy`` in this
   process (the sim env directly, no bridge) and print the success rate per task.

Offline, in the LeRobot + Meta-World venv, a few minutes on 2 CPU cores::

    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MUJOCO_GL=egl .venv-lerobot/bin/python scripts/make_metaworld_checkpoints.py

The expert's episodes are the same in every recording, but their order in the merged dataset
depends on which xdist worker recorded which episode, so the shuffled batches and the trained
weights differ between rebuilds (measured: final reach-v3 75 % in one rebuild, 100 % in the
committed run; the other two tasks 100 % in both). ``--dataset-dir DIR`` keeps a recording and
``--reuse-dataset`` trains on it again (whether that repeats the weights bit for bit was not checked).
LeRobot 0.4.4's ACT needs an image or ``observation.environment_state`` next to ``observation.state``;
the saved preprocessor copies the state to the second (``CopyObservationsProcessorStep``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from lerobot_training import (
    copy_state_to_env_state,
    save_checkpoint,
    small_act,
    state_as_env_state,
    success_rate,
    train,
)

DEFAULT_OUT = REPO / "evals" / "checkpoints" / "metaworld_act"
SUITE = REPO / "evals" / "test_metaworld_act.py"
EXPERT = REPO / "evals" / "policies" / "meta_world_experts.py"
REPO_ID = "pytest-hud/metaworld_expert"  # a local name only; nothing is pushed or pulled
DEMO_FIRST_SEED = 1000  # demonstrations: seeds 1000, 1001, ... (MT1 blocks 20+); evaluation: 0..N-1
STATE_DIM, ACTION_DIM = 39, 4
MIN_STD = 1e-2  # state dims that never vary in the demonstrations are not blown up by 1/std


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="Folder receiving early/ and final/")
    parser.add_argument("--dataset-dir", type=Path, default=None,
                        help="Record into this folder and keep it (default: a temporary folder)")
    parser.add_argument("--reuse-dataset", action="store_true",
                        help="Train on an existing --dataset-dir instead of recording it again")
    parser.add_argument("--episodes", type=int, default=40, help="Demonstrations per task")
    parser.add_argument("--workers", type=int, default=2, help="-n and --hud-width of the recording run")
    parser.add_argument("--steps", type=int, default=1000, help="Training updates for the final checkpoint")
    parser.add_argument("--early-steps", type=int, default=100,
                        help="Training updates for the early checkpoint")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--eval-episodes", type=int, default=20, help="Held-out seeds per task (0..N-1)")
    parser.add_argument("--max-steps", type=int, default=200,
                        help="Step cap of an evaluation episode (the suite's own cap)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (fixed for reproducibility)")
    args = parser.parse_args(argv)
    if not 0 < args.early_steps <= args.steps:
        parser.error(f"--early-steps ({args.early_steps}) must be between 1 and --steps ({args.steps}): "
                     "the early checkpoint is a snapshot taken on the way to the final one")
    if args.dataset_dir is not None and not args.reuse_dataset and args.dataset_dir.exists() \
            and any(args.dataset_dir.iterdir()):
        parser.error(f"--dataset-dir {args.dataset_dir} already exists and is not empty: nothing is deleted "
                     "here; pass --reuse-dataset to train on the dataset in it, or give a new folder")
    return args


def record_demonstrations(root: Path, episodes: int, workers: int) -> None:
    """The expert's rollouts on every task of the suite, through pytest with ``--hud-record``."""
    command = [
        sys.executable, "-m", "pytest", str(SUITE), "-q", "-p", "no:cacheprovider",
        f"--hud-policy={EXPERT}:expert", f"--hud-record={root}", f"--hud-results={root.parent / 'demos.jsonl'}",
    ]
    if workers > 1:
        command += ["-n", str(workers), f"--hud-width={workers}"]
    env = dict(os.environ, METAWORLD_ACT_FIRST_SEED=str(DEMO_FIRST_SEED), METAWORLD_ACT_EPISODES=str(episodes),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    print("recording:", " ".join(command[2:]), flush=True)
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    tail = "\n".join(done.stdout.splitlines()[-12:])
    print(tail, flush=True)
    # exit 1 only means some expert episodes failed (they are recorded too); anything else is broken
    if done.returncode not in (0, 1) or not (root / "meta" / "info.json").is_file():
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"the recording run failed (exit {done.returncode}); see its output above")


def recorded_tasks(root: Path) -> list[str]:
    """The Meta-World tasks in the recording (each episode's prompt is its task), sorted."""
    lines = (root / "meta" / "pytest_hud_episodes.jsonl").read_text(encoding="utf-8").splitlines()
    return sorted({json.loads(line)["prompt"] for line in lines if line.strip()})


def success_rates(checkpoint: Path, tasks: list[str], seeds: range, max_steps: int) -> dict[str, float]:
    """Roll the checkpoint out on each task (the sim env itself, in this process); success per task."""
    sys.path.insert(0, str(REPO / "evals" / "sims"))
    from meta_world import MetaWorldTask

    from pytest_hud.agent.lerobot import LeRobotPolicy

    model = LeRobotPolicy.from_checkpoint(checkpoint, {"state": ((STATE_DIM,), "float32")})
    rates = {}
    for task in tasks:
        env = MetaWorldTask(task)
        try:
            rates[task] = success_rate(model, env, seeds, prompt=task, max_steps=max_steps)
        finally:
            env.close()
    return rates


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Nothing may come from the Hugging Face hub; set before huggingface_hub is imported.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ.setdefault("MUJOCO_GL", "egl")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore", message="Cannot enable progress bars")
    sys.path.insert(0, str(REPO))
    started = time.perf_counter()

    import torch

    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="metaworld-dataset-") as scratch:
        root = args.dataset_dir if args.dataset_dir is not None else Path(scratch) / "demos"
        if args.reuse_dataset:
            if not (root / "meta" / "info.json").is_file():
                raise SystemExit(f"--reuse-dataset: no LeRobot dataset at {root}; drop the flag to record one")
        else:
            if root.exists():
                root.rmdir()  # empty (parse_args refuses a folder with anything in it): the recorder makes it
            root.parent.mkdir(parents=True, exist_ok=True)
            tick = time.perf_counter()
            record_demonstrations(root, args.episodes, args.workers)
            print(f"recorded {args.episodes} demonstrations per task: {time.perf_counter() - tick:.1f}s", flush=True)

        config = small_act(lr=args.lr, n_action_steps=5, state_dim=STATE_DIM)
        tasks = recorded_tasks(root)

        def snapshot(step, policy, preprocessor, postprocessor) -> None:
            if step == args.early_steps:
                save_checkpoint(policy, preprocessor, postprocessor, args.out / "early")

        policy, preprocessor, postprocessor = train(
            config, root, REPO_ID, seed=args.seed, batch_size=args.batch_size, steps=args.steps,
            adapt_stats=lambda stats: state_as_env_state(stats, MIN_STD), prepare=copy_state_to_env_state,
            on_step=snapshot, log_every=100, preload=True,
        )
        save_checkpoint(policy, preprocessor, postprocessor, args.out / "final")

    tick = time.perf_counter()
    seeds = range(args.eval_episodes)
    for name in ("early", "final"):
        folder = args.out / name
        size = sum(path.stat().st_size for path in folder.iterdir())
        rates = success_rates(folder, tasks, seeds, args.max_steps)
        per_task = ", ".join(f"{task} {rate:.0%}" for task, rate in rates.items())
        print(f"{name}: held-out seeds 0..{len(seeds) - 1}: {per_task}; {size / 1e6:.2f} MB at {folder}",
              flush=True)
    print(f"evaluation: {time.perf_counter() - tick:.1f}s; total {time.perf_counter() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
