"""Make the LeRobot Diffusion Policy checkpoint shipped with the PointReach diffusion evals.

Records the same scripted-expert demonstrations as ``make_lerobot_checkpoints.py`` (its
``record_demonstrations``: seeds 10000.., the executed noisy actions) as a LeRobot v3 dataset, trains
a small state-only ``DiffusionPolicy`` on CPU with LeRobot's own pieces (``make_dataset``,
``make_policy``, ``make_pre_post_processors``, ``make_optimizer_and_scheduler``, ``update_policy``,
through ``lerobot_training.train``) and saves policy + processors (no optimizer state) to::

    evals/checkpoints/reach_diffusion/final/

It is then loaded back through ``pytest_hud.agent.lerobot.LeRobotPolicy`` and rolled out on held-out
seeds 0..N-1 with the checkpoint's own number of denoising steps and with one step (the clearly
worse variant the gate test uses); both success rates are printed. Offline, a few minutes on 2 cores::

    .venv-lerobot/bin/python scripts/make_diffusion_checkpoints.py

The policy: a 1-D conditional U-Net with ``down_dims=(64, 128)`` (708k parameters, 2.9 MB),
``n_obs_steps=1`` (the seam runs one stateless chunk per observation: no history), a horizon of 8
actions of which 4 are executed, DDIM with 100 training timesteps and 10 denoising steps at
inference (every U-Net pass is one more forward per chunk: CPU CI keeps it at 10). LeRobot's
diffusion needs an image or ``observation.environment_state`` besides ``observation.state``; as for
the ACT reach checkpoint, the saved preprocessor copies the state into the environment state
(``pytest_hud.agent.lerobot.CopyObservationsProcessorStep``).

Train it with LeRobot 0.4.4 (Python 3.11): LeRobot 0.6.1 loads a 0.4.4 diffusion config strictly
(its one new field, ``gradient_checkpointing``, takes its default), while 0.4.4 rejects the config a
0.6.1 training writes (it does not know that field).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from lerobot_training import copy_state_to_env_state, save_checkpoint, state_as_env_state, train
from make_lerobot_checkpoints import REPO_ID, reach_success_rate, record_demonstrations

DEFAULT_OUT = REPO / "evals" / "checkpoints" / "reach_diffusion"
PROVENANCE_FILE = "provenance.json"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="Folder receiving final/")
    parser.add_argument("--dataset-dir", type=Path, default=None,
                        help="Keep the recorded dataset here (default: a temporary folder)")
    parser.add_argument("--episodes", type=int, default=400, help="Demonstration episodes to record")
    parser.add_argument("--noise", type=float, default=0.1, help="Std of the expert's action noise")
    parser.add_argument("--steps", type=int, default=3000, help="Training updates")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--warmup", type=int, default=100, help="Learning-rate warm-up updates")
    parser.add_argument("--down-dims", type=int, nargs="+", default=[64, 128], help="U-Net widths")
    parser.add_argument("--inference-steps", type=int, default=10, help="DDIM denoising steps at inference")
    parser.add_argument("--eval-episodes", type=int, default=50, help="Seeded rollouts per variant")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (fixed for reproducibility; 2 threads on a busy 2-core "
                             "machine ran 30x slower)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may come from the hub; set before huggingface_hub loads
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    warnings.filterwarnings("ignore", message="Cannot enable progress bars")
    sys.path.insert(0, str(REPO))
    started = time.perf_counter()

    import torch
    from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature
    from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
    from lerobot.utils.constants import OBS_ENV_STATE, OBS_STATE

    torch.set_num_threads(args.threads)
    final = args.out / "final"
    with tempfile.TemporaryDirectory(prefix="reach-dataset-") as scratch:
        root = args.dataset_dir if args.dataset_dir is not None else Path(scratch) / "reach_expert"
        if root.exists():
            import shutil

            shutil.rmtree(root)
        tick = time.perf_counter()
        record_demonstrations(root, args.episodes, args.noise, args.seed)
        print(f"recorded {args.episodes} demonstrations: {time.perf_counter() - tick:.1f}s", flush=True)

        config = DiffusionConfig(
            device="cpu",
            push_to_hub=False,
            input_features={
                OBS_STATE: PolicyFeature(FeatureType.STATE, (4,)),
                OBS_ENV_STATE: PolicyFeature(FeatureType.ENV, (4,)),
            },
            normalization_mapping={
                "STATE": NormalizationMode.MIN_MAX,
                "ENV": NormalizationMode.MIN_MAX,
                "ACTION": NormalizationMode.MIN_MAX,
            },
            n_obs_steps=1,
            horizon=8,
            n_action_steps=4,
            drop_n_last_frames=4,  # horizon - n_action_steps - n_obs_steps + 1
            down_dims=tuple(args.down_dims),
            kernel_size=3,
            n_groups=8,
            diffusion_step_embed_dim=64,
            noise_scheduler_type="DDIM",
            num_train_timesteps=100,
            num_inference_steps=args.inference_steps,
            pretrained_backbone_weights=None,  # no image features, but never a download
            optimizer_lr=args.lr,
            scheduler_warmup_steps=args.warmup,
        )

        tick = time.perf_counter()
        policy, preprocessor, postprocessor = train(
            config, root, REPO_ID, seed=args.seed, batch_size=args.batch_size, steps=args.steps,
            adapt_stats=state_as_env_state, prepare=copy_state_to_env_state, log_every=500, preload=True,
        )
        train_s = time.perf_counter() - tick
        save_checkpoint(policy, preprocessor, postprocessor, final)
        parameters = sum(p.numel() for p in policy.parameters())

    import lerobot

    size = sum(path.stat().st_size for path in final.iterdir())
    tick = time.perf_counter()
    seeds = range(args.eval_episodes)
    rates = {
        f"{args.inference_steps} denoising steps": reach_success_rate(final, seeds),
        "1 denoising step": reach_success_rate(final, seeds, inference_steps=1),
    }
    for label, rate in rates.items():
        print(f"final, {label}: success {rate:.0%} on seeds 0..{len(seeds) - 1}", flush=True)
    provenance = {
        "made_by": "scripts/make_diffusion_checkpoints.py",
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "policy": "diffusion",
        "parameters": parameters,
        "train_s": round(train_s, 1),
        "success_rates": {label: rate for label, rate in rates.items()},
        "eval_seeds": f"0..{len(seeds) - 1}",
        "versions": {"lerobot": lerobot.__version__, "torch": torch.__version__,
                     "python": sys.version.split()[0]},
        "bytes": size,
    }
    (final / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n", encoding="utf-8")
    (final / PROVENANCE_FILE).chmod(0o644)
    print(f"{size / 1e6:.2f} MB at {final}; evaluation {time.perf_counter() - tick:.1f}s; "
          f"total {time.perf_counter() - started:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
