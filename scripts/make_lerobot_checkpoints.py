"""Make the LeRobot ACT checkpoints shipped with the PointReach evals.

Records scripted-expert demonstrations on ``make_reach()`` as a LeRobot v3 dataset, trains a small
state-only ACT on CPU with LeRobot's own pieces (``make_dataset``, ``make_policy``,
``make_pre_post_processors``, ``make_optimizer_and_scheduler``, ``update_policy``), and saves two
checkpoints (policy + processors, no optimizer state):

    evals/checkpoints/reach_act/early/   after a few updates: clearly worse
    evals/checkpoints/reach_act/final/   the trained policy

Both are then loaded back through ``pytest_hud.agent.lerobot.LeRobotPolicy`` and rolled out on
held-out seeds; the success rates are printed. Runs offline, in the LeRobot venv, in a few minutes
on 2 CPU cores::

    .venv-lerobot/bin/python scripts/make_lerobot_checkpoints.py

LeRobot 0.4.4's ACT needs an image or ``observation.environment_state`` besides
``observation.state``; the dataset has only ``observation.state`` (the sim's ``state``), so the
saved preprocessor copies it to ``observation.environment_state``
(``pytest_hud.agent.lerobot.CopyObservationsProcessorStep``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from lerobot_training import (  # noqa: E402
    copy_state_to_env_state,
    save_checkpoint,
    small_act,
    state_as_env_state,
    success_rate,
    train,
)

DEFAULT_OUT = REPO / "evals" / "checkpoints" / "reach_act"
REPO_ID = "pytest-hud/reach_expert"  # a local name only; nothing is pushed or pulled
TASK = "reach the green goal"
DEMO_SEED_BASE = 10_000  # demonstration episodes use seeds 10000, 10001, ...; evaluation uses 0..N-1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="Folder receiving early/ and final/")
    parser.add_argument(
        "--dataset-dir",
        type=Path,
        default=None,
        help="Keep the recorded dataset here (default: a temporary folder)",
    )
    parser.add_argument("--episodes", type=int, default=400, help="Demonstration episodes to record")
    parser.add_argument("--noise", type=float, default=0.1, help="Std of the expert's action noise")
    parser.add_argument("--steps", type=int, default=2000, help="Training updates for the final checkpoint")
    parser.add_argument(
        "--early-steps",
        type=int,
        default=10,
        help="Training updates for the early checkpoint (the task is learnt in ~50)",
    )
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--eval-episodes", type=int, default=50, help="Seeded rollouts per checkpoint")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, default=2, help="torch CPU threads (fixed for reproducibility)"
    )
    return parser.parse_args(argv)


def record_demonstrations(root: Path, episodes: int, noise: float, seed: int) -> None:
    """Scripted-expert episodes on make_reach() as a LeRobot v3 dataset at ``root``."""
    import numpy as np
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from evals.sims.reach import expert_action, make_reach

    dataset = LeRobotDataset.create(
        repo_id=REPO_ID,
        fps=10,
        root=root,
        use_videos=False,
        features={
            "observation.state": {
                "dtype": "float32",
                "shape": (4,),
                "names": ["agent_x", "agent_y", "goal_x", "goal_y"],
            },
            "action": {"dtype": "float32", "shape": (2,), "names": ["vx", "vy"]},
        },
    )
    env = make_reach()
    rng = np.random.default_rng(seed)
    for episode in range(episodes):
        observation, _ = env.reset(seed=DEMO_SEED_BASE + episode)
        while True:
            # The executed (noisy) action is what gets recorded, as in teleoperation.
            action = expert_action(observation["state"], noise=noise, rng=rng)
            dataset.add_frame({"observation.state": observation["state"], "action": action, "task": TASK})
            observation, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
        dataset.save_episode()
    dataset.finalize()
    env.close()


def reach_success_rate(checkpoint: Path, seeds: range, inference_steps: int | None = None) -> float:
    """Roll the checkpoint out on make_reach() through LeRobotPolicy, executing chunks open-loop;
    ``inference_steps`` overrides a diffusion checkpoint's number of denoising steps."""
    from evals.sims.reach import make_reach
    from pytest_hud.agent.lerobot import LeRobotPolicy

    model = LeRobotPolicy.from_checkpoint(checkpoint, {"state": ((4,), "float32")})
    if inference_steps is not None:
        model.policy.diffusion.num_inference_steps = inference_steps
    env = make_reach()
    try:
        return success_rate(model, env, seeds, success_key="is_success")
    finally:
        env.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Nothing may come from the Hugging Face hub; set before huggingface_hub is imported.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    # save_episode() shows a progress bar per episode; LeRobot then warns it cannot re-enable them.
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore", message="Cannot enable progress bars")
    sys.path.insert(0, str(REPO))
    started = time.perf_counter()

    import torch

    torch.set_num_threads(args.threads)
    print(f"imports: {time.perf_counter() - started:.1f}s", flush=True)

    with tempfile.TemporaryDirectory(prefix="reach-dataset-") as scratch:
        root = args.dataset_dir if args.dataset_dir is not None else Path(scratch) / "reach_expert"
        if root.exists():
            shutil.rmtree(root)
        tick = time.perf_counter()
        record_demonstrations(root, args.episodes, args.noise, args.seed)
        print(f"recorded {args.episodes} demonstrations: {time.perf_counter() - tick:.1f}s", flush=True)

        config = small_act(lr=args.lr, n_action_steps=10, state_dim=4)

        def snapshot(step, policy, preprocessor, postprocessor) -> None:
            if step == args.early_steps:
                save_checkpoint(policy, preprocessor, postprocessor, args.out / "early")

        policy, preprocessor, postprocessor = train(
            config, root, REPO_ID, seed=args.seed, batch_size=args.batch_size, steps=args.steps,
            adapt_stats=state_as_env_state, prepare=copy_state_to_env_state, on_step=snapshot, log_every=500,
        )
        save_checkpoint(policy, preprocessor, postprocessor, args.out / "final")

    tick = time.perf_counter()
    seeds = range(args.eval_episodes)
    for name in ("early", "final"):
        folder = args.out / name
        size = sum(path.stat().st_size for path in folder.iterdir())
        rate = reach_success_rate(folder, seeds)
        print(
            f"{name}: success {rate:.0%} on seeds 0..{len(seeds) - 1}, {size / 1e6:.2f} MB at {folder}",
            flush=True,
        )
    print(f"evaluation: {time.perf_counter() - tick:.1f}s; total {time.perf_counter() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
