"""Record -> train -> evaluate on LIBERO-Spatial: the ACT checkpoints of ``evals/test_libero_policies.py``.

1. **Record**: a real pytest run of ``evals/test_libero_policies.py::test_expert`` (the scripted
   expert ``evals/policies/libero_expert.py:expert`` on privileged state, no cameras) on every task
   of libero_spatial and demonstration init states (``--first-seed``, 10 onwards by default: the
   evaluation uses 0..9), ``--hud-record`` writing every graded episode into one LeRobot v3 dataset
   (``observation.state`` [8], ``observation.environment_state`` [9], ``action`` [7]).
2. **Train**: one small state-only ACT for the ten tasks, on the CPU, with LeRobot's own training
   step (``scripts/lerobot_training.py``), on the expert's *successful* episodes only; a snapshot
   after ``--early-steps`` updates is kept.
3. **Save** (policy + processors, no optimizer state, about 3.4 MB each)::

       evals/checkpoints/libero_spatial_act/early/   an earlier snapshot of the same run: clearly worse
       evals/checkpoints/libero_spatial_act/final/   the trained policy

4. **Evaluate** both on held-out init states 0..``--eval-episodes``-1 of ``--eval-tasks`` through
   ``pytest_hud.agent.lerobot.LeRobotPolicy`` in this process (the sim's env directly, no bridge) and
   print the success rate per task.

Offline, in the LIBERO + LeRobot venv (and ``accelerate``, LeRobot's training extra); with the
defaults about 22 minutes on 2 busy CPU cores (recording 10 min, training 10 min, evaluation 1 min)::

    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 MUJOCO_GL=egl OMP_NUM_THREADS=1 \\
        .venv-libero/bin/python scripts/make_libero_checkpoints.py

The expert is deterministic, but the order of its episodes in the merged dataset depends on which
xdist worker recorded which, so the shuffled batches (and weights) differ between rebuilds.
``--dataset-dir DIR`` keeps a recording and ``--reuse-dataset`` trains on it again.
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
from lerobot_training import floor_std, save_checkpoint, small_act, success_rate, train

DEFAULT_OUT = REPO / "evals" / "checkpoints" / "libero_spatial_act"
SUITE_FILE = REPO / "evals" / "test_libero_policies.py"
SIM_FILE = REPO / "evals" / "sims" / "libero.py"
REPO_ID = "pytest-hud/libero_spatial_expert"  # a local name only; nothing is pushed or pulled
SUITE = "libero_spatial"
STATE_DIM, ENV_DIM, ACTION_DIM = 8, 9, 7
MIN_STD = 1e-2  # dims that hardly vary in the demonstrations are not blown up by 1/std


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="Folder receiving early/ and final/")
    parser.add_argument("--dataset-dir", type=Path, default=None,
                        help="Record into this folder and keep it (default: a temporary folder)")
    parser.add_argument("--reuse-dataset", action="store_true",
                        help="Train on an existing --dataset-dir instead of recording it again")
    parser.add_argument("--episodes", type=int, default=8, help="Demonstrations per task")
    parser.add_argument("--first-seed", type=int, default=10, help="First demonstration init state")
    parser.add_argument("--workers", type=int, default=2, help="-n and --hud-width of the recording run")
    parser.add_argument("--steps", type=int, default=8000, help="Training updates for the final checkpoint")
    parser.add_argument("--early-steps", type=int, default=100,
                        help="Training updates for the early checkpoint")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--eval-episodes", type=int, default=3, help="Held-out init states per task (0..N-1)")
    parser.add_argument("--eval-tasks", default="0,8", help="Tasks to evaluate: 'all' or indexes, e.g. 0,8")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (fixed for reproducibility)")
    args = parser.parse_args(argv)
    if not 0 < args.early_steps <= args.steps:
        parser.error(f"--early-steps ({args.early_steps}) must be between 1 and --steps ({args.steps}): "
                     "the early checkpoint is a snapshot taken on the way to the final one")
    if not 0 <= args.first_seed or args.first_seed + args.episodes > 50:
        parser.error(f"--first-seed {args.first_seed} + --episodes {args.episodes} must stay within LIBERO's "
                     "50 init states (0-49)")
    if args.dataset_dir is not None and not args.reuse_dataset and args.dataset_dir.exists() \
            and any(args.dataset_dir.iterdir()):
        parser.error(f"--dataset-dir {args.dataset_dir} already exists and is not empty: nothing is deleted "
                     "here; pass --reuse-dataset to train on the dataset in it, or give a new folder")
    return args


def record_demonstrations(root: Path, episodes: int, first_seed: int, workers: int) -> None:
    """The expert's rollouts on every task of the suite, through pytest with ``--hud-record``."""
    command = [
        sys.executable, "-m", "pytest", f"{SUITE_FILE}::test_expert", "-q", "-p", "no:cacheprovider",
        f"--hud-record={root}", f"--hud-results={root.parent / 'demos.jsonl'}",
    ]
    if workers > 1:
        command += ["-n", str(workers), f"--hud-width={workers}"]
    env = dict(os.environ, LIBERO_TASKS="all", LIBERO_FIRST_SEED=str(first_seed),
               LIBERO_EPISODES=str(episodes),
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    print("recording:", " ".join(command[2:]), flush=True)
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    print("\n".join(done.stdout.splitlines()[-12:]), flush=True)
    # exit 1 only means some expert episodes failed (they are recorded too); anything else is broken
    if done.returncode not in (0, 1) or not (root / "meta" / "info.json").is_file():
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"the recording run failed (exit {done.returncode}); see its output above")


def successful_episodes(root: Path) -> list[int]:
    """Dataset episode indexes whose rollout succeeded (the recorder's episode sidecar)."""
    lines = (root / "meta" / "pytest_hud_episodes.jsonl").read_text().splitlines()
    entries = [json.loads(line) for line in lines if line.strip()]
    return [int(entry["episode_index"]) for entry in entries if entry.get("success")]


def _sim_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("_libero_sim_for_checkpoints", SIM_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def success_rates(checkpoint: Path, tasks: list[str], seeds: range) -> dict[str, float]:
    """Roll the checkpoint out on each task (the sim's env, in this process); success per task."""
    from pytest_hud.agent.lerobot import LeRobotPolicy

    sim = _sim_module()
    model = LeRobotPolicy.from_checkpoint(
        checkpoint, {"state": ((STATE_DIM,), "float32"), "environment_state": ((ENV_DIM,), "float32")})
    rates = {}
    for task in tasks:
        env = sim.LiberoTask(SUITE, task, cameras=False, privileged=True)
        try:
            rates[task] = success_rate(model, env, seeds, prompt=env.instruction, max_steps=env.max_episode_steps)
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
    from lerobot.utils.constants import OBS_ENV_STATE, OBS_STATE

    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="libero-dataset-") as scratch:
        root = args.dataset_dir if args.dataset_dir is not None else Path(scratch) / "demos"
        if args.reuse_dataset:
            if not (root / "meta" / "info.json").is_file():
                raise SystemExit(f"--reuse-dataset: no LeRobot dataset at {root}; "
                                 "drop the flag to record one")
        else:
            if root.exists():
                root.rmdir()  # empty (parse_args refuses a folder with anything in it): the recorder makes it
            root.parent.mkdir(parents=True, exist_ok=True)
            tick = time.perf_counter()
            record_demonstrations(root, args.episodes, args.first_seed, args.workers)
            print(f"recorded {args.episodes} demonstrations per task: {time.perf_counter() - tick:.1f}s",
                  flush=True)
        kept = successful_episodes(root)
        print(f"training on the {len(kept)} successful demonstrations", flush=True)

        config = small_act(lr=args.lr, n_action_steps=5, state_dim=STATE_DIM, env_dim=ENV_DIM,
                           dim_model=128, dim_feedforward=512)

        def snapshot(step, policy, preprocessor, postprocessor) -> None:
            if step == args.early_steps:
                save_checkpoint(policy, preprocessor, postprocessor, args.out / "early")

        policy, preprocessor, postprocessor = train(
            config, root, REPO_ID, seed=args.seed, batch_size=args.batch_size, steps=args.steps,
            adapt_stats=lambda stats: floor_std(stats, (OBS_STATE, OBS_ENV_STATE), MIN_STD),
            on_step=snapshot, log_every=200, preload=True, episodes=kept,
        )
        save_checkpoint(policy, preprocessor, postprocessor, args.out / "final")

    tick = time.perf_counter()
    seeds = range(args.eval_episodes)
    indexes = range(10) if args.eval_tasks == "all" else [int(i) for i in args.eval_tasks.split(",")]
    tasks = [f"task_{i:02d}" for i in indexes]
    for name in ("early", "final"):
        folder = args.out / name
        size = sum(path.stat().st_size for path in folder.iterdir())
        rates = success_rates(folder, tasks, seeds)
        per_task = ", ".join(f"{task} {rate:.0%}" for task, rate in rates.items())
        mean = sum(rates.values()) / len(rates)
        print(f"{name}: held-out init states 0..{len(seeds) - 1}: {mean:.0%} ({per_task}); "
              f"{size / 1e6:.2f} MB at {folder}", flush=True)
    print(f"evaluation: {time.perf_counter() - tick:.1f}s; total {time.perf_counter() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
