"""Make the LeRobot ACT checkpoint that drives LeRobot's own PushT (gym-pusht) from pixels.

Records a few scripted-pusher demonstrations on ``evals/sims/pusht.py:make_pusht`` (96x96 camera +
agent position) as a LeRobot v3 dataset (``observation.image`` [3, 96, 96], ``observation.state``
[2], ``action`` [2]), trains an ACT on CPU with LeRobot's own pieces (``make_dataset``,
``make_policy``, ``make_pre_post_processors``, ``make_optimizer_and_scheduler``, ``update_policy``)
for 60 updates (the ResNet-18 backbone stays at its seeded random init unless ``--train-backbone``;
the transformer and heads learn), and saves policy + processors the way LeRobot does (no optimizer
state), plus a ``provenance.json``. Success rate is not the point (the demonstrations are crude and the training
is short): the checkpoint proves the image path with LeRobot's own env, loaded by LeRobot's
factory and its saved processors, both in pytest-hud and in ``lerobot-eval``.

Why it is generated, not committed: the only LeRobot 0.4.4 image policies that pytest-hud's
LeRobot seam can run (stateless ``predict_action_chunk``: ACT, SmolVLA, pi0, ...) are ACT with a
torchvision ResNet (``ACTConfig.vision_backbone`` must start with "resnet"; ResNet-18 minus its
head is 11.2 M parameters, ~45 MB in float32) or multi-GB VLAs. Diffusion and VQ-BeT also require a
ResNet; TD-MPC and SAC have small conv encoders but keep an observation history in
``select_action``, which the seam refuses. So the checkpoint (~46 MB) is built on first use into a
cache folder keyed by the content of this script and of ``lerobot_training.py`` and by LeRobot's major.minor (:func:`ensure_checkpoint`),
~1-2 min on 2 cores::

    .venv-lerobot/bin/python scripts/make_pusht_checkpoint.py            # into the cache folder
    .venv-lerobot/bin/python scripts/make_pusht_checkpoint.py --out DIR  # anywhere

``PUSHT_CHECKPOINT=DIR`` makes the PushT suite and benchmark use (or build) ``DIR`` instead.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lerobot_training import save_checkpoint, small_act, train  # noqa: E402 - shared by the checkpoint scripts

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path(__file__).resolve()
REPO_ID = "pytest-hud/pusht_scripted"  # a local name only; nothing is pushed or pulled
DEMO_SEED_BASE = 100_000  # demonstrations use seeds 100000, ...; lerobot-eval starts at 1000
CHECKPOINT_ENV = "PUSHT_CHECKPOINT"
PROVENANCE_FILE = "provenance.json"


# ---------------------------------------------------------------- where the checkpoint lives
def script_digest() -> str:
    """This script and the training module it builds with: a change to either builds a new checkpoint."""
    return hashlib.sha256(SCRIPT.read_bytes() + (SCRIPT.parent / "lerobot_training.py").read_bytes()).hexdigest()


def lerobot_line() -> str:
    """The installed LeRobot's major.minor, read from its metadata (no import): a checkpoint saved by
    0.6 does not load in 0.4 (its config has fields 0.4 refuses), so each line builds its own."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return ".".join(version("lerobot").split(".")[:2])
    except PackageNotFoundError:
        return "none"


def default_checkpoint_dir() -> Path:
    """``$PUSHT_CHECKPOINT``, else ``$XDG_CACHE_HOME/pytest-hud/pusht_act-<script sha256[:12]>-lerobot<X.Y>``
    (``~/.cache`` by default): editing this script, or another LeRobot line, makes a new checkpoint."""
    explicit = os.environ.get(CHECKPOINT_ENV)
    if explicit:
        return Path(explicit).expanduser().resolve()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "pytest-hud" / f"pusht_act-{script_digest()[:12]}-lerobot{lerobot_line()}"


def is_complete(folder: Path) -> bool:
    """The provenance file is written last, so its presence means a whole checkpoint."""
    return (folder / PROVENANCE_FILE).is_file() and (folder / "model.safetensors").is_file()


def ensure_checkpoint(folder: Path | None = None, python: str | None = None, quiet: bool = True) -> Path:
    """The checkpoint folder, built first (in a subprocess, under a file lock, so concurrent
    xdist workers build it once) when it is not there yet. Imports neither torch nor lerobot."""
    import fcntl

    folder = Path(folder) if folder is not None else default_checkpoint_dir()
    if is_complete(folder):
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the others wait here while one builds
        if not is_complete(folder):
            command = [python or sys.executable, str(SCRIPT), "--out", str(folder)]
            done = subprocess.run(command, capture_output=quiet, text=True)
            if done.returncode != 0 or not is_complete(folder):
                tail = (done.stderr or "")[-4000:] if quiet else ""
                raise RuntimeError(
                    f"building the PushT checkpoint failed (exit {done.returncode}): "
                    f"{' '.join(command)}\n{tail}"
                )
    return folder


# ---------------------------------------------------------------- building it
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None,
                        help="Checkpoint folder (default: the cache folder)")
    parser.add_argument("--dataset-dir", type=Path, default=None,
                        help="Keep the recorded dataset here (default: a temporary folder)")
    parser.add_argument("--episodes", type=int, default=12, help="Demonstration episodes to record")
    parser.add_argument("--demo-steps", type=int, default=100, help="Steps recorded per demonstration")
    parser.add_argument("--noise", type=float, default=3.0, help="Std (pixels) of the pusher's action noise")
    parser.add_argument("--steps", type=int, default=60, help="Training updates")
    parser.add_argument("--train-backbone", action="store_true",
                        help="Also train the ResNet-18 (default: keep its seeded random init frozen, ~3x "
                             "cheaper per update on CPU)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--eval-episodes", type=int, default=0,
                        help="Roll the checkpoint out on this many seeds (1000, ...) through LeRobotPolicy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    return parser.parse_args(argv)


def record_demonstrations(root: Path, episodes: int, demo_steps: int, noise: float, seed: int) -> None:
    """Scripted-pusher episodes as a LeRobot v3 dataset at ``root`` (images stored as PNG)."""
    import numpy as np
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from pusht import expert_action, make_pusht

    dataset = LeRobotDataset.create(
        repo_id=REPO_ID,
        fps=10,
        root=root,
        use_videos=False,
        features={
            "observation.image": {"dtype": "image", "shape": (96, 96, 3),
                                  "names": ["height", "width", "channel"]},
            "observation.state": {"dtype": "float32", "shape": (2,), "names": ["agent_x", "agent_y"]},
            "action": {"dtype": "float32", "shape": (2,), "names": ["target_x", "target_y"]},
        },
    )
    env = make_pusht()
    rng = np.random.default_rng(seed)
    for episode in range(episodes):
        observation, _ = env.reset(seed=DEMO_SEED_BASE + episode)
        for _ in range(demo_steps):
            action = expert_action(env, rng, noise)  # the executed (noisy) action is recorded
            dataset.add_frame({
                "observation.image": observation["pixels"],
                "observation.state": observation["agent_pos"].astype(np.float32),
                "action": action,
                "task": "",  # PushT has no language instruction; lerobot-eval sends ""
            })
            observation, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
        dataset.save_episode()
    dataset.finalize()
    env.close()


def rollout(checkpoint: Path, seeds: range) -> list[tuple[int, bool, float, int]]:
    """(seed, success, max reward, steps) per seed, executing chunks open-loop via LeRobotPolicy."""
    from pusht import make_pusht

    from pytest_hud.agent.lerobot import LeRobotPolicy

    model = LeRobotPolicy.from_checkpoint(
        checkpoint, {"pixels": ((96, 96, 3), "uint8"), "agent_pos": ((2,), "float64")}
    )
    env = make_pusht()
    rows = []
    for seed in seeds:
        model.reset()
        observation, info = env.reset(seed=seed)
        queue: list = []
        steps = 0
        while True:
            if not queue:
                queue = list(model.predict(observation))
            observation, _, terminated, truncated, info = env.step(queue.pop(0))
            steps += 1
            if terminated or truncated:
                break
        rows.append((seed, bool(info["is_success"]), float(info["score"]), steps))
    env.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = (args.out or default_checkpoint_dir()).resolve()
    os.environ["HF_HUB_OFFLINE"] = "1"  # nothing may come from the hub; set before huggingface_hub loads
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    warnings.filterwarnings("ignore", message="Cannot enable progress bars")
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated")
    sys.path[:0] = [str(REPO), str(REPO / "evals" / "sims")]
    started = time.perf_counter()

    import torch

    torch.set_num_threads(args.threads)

    out.parent.mkdir(parents=True, exist_ok=True)
    # built beside the target and renamed into place at the end: a folder at `out` is whole
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        provenance = build(args, staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out)
    staging.replace(out)
    print(json.dumps(provenance, indent=2), flush=True)
    print(f"checkpoint: {out} ({provenance['bytes'] / 1e6:.1f} MB)", flush=True)

    if args.eval_episodes:
        tick = time.perf_counter()
        rows = rollout(out, range(1000, 1000 + args.eval_episodes))
        for seed, success, score, steps in rows:
            print(f"  seed {seed}: success={success} max_reward={score:.3f} steps={steps}")
        rate = sum(r[1] for r in rows) / len(rows)
        print(f"success {rate:.0%} on {len(rows)} seeds: {time.perf_counter() - tick:.1f}s", flush=True)
    print(f"total {time.perf_counter() - started:.1f}s")
    return 0


def build(args: argparse.Namespace, staging: Path) -> dict:
    """Record, train and save into ``staging``; returns the provenance written there."""
    import torch

    with tempfile.TemporaryDirectory(prefix="pusht-dataset-") as scratch:
        root = args.dataset_dir if args.dataset_dir is not None else Path(scratch) / "pusht_scripted"
        if root.exists():
            shutil.rmtree(root)
        tick = time.perf_counter()
        record_demonstrations(root, args.episodes, args.demo_steps, args.noise, args.seed)
        print(f"recorded {args.episodes} demonstrations: {time.perf_counter() - tick:.1f}s", flush=True)

        # input/output features come from the dataset (make_policy fills them): observation.image
        # [3, 96, 96] VISUAL, observation.state [2] STATE, action [2] ACTION.
        config = small_act(lr=args.lr, n_action_steps=10, vision_backbone="resnet18", optimizer_lr_backbone=args.lr)

        def freeze_backbone(policy, preprocessor) -> None:
            if not args.train_backbone:  # ACT's get_optim_params leaves out frozen parameters
                policy.model.backbone.requires_grad_(False)

        tick = time.perf_counter()
        policy, preprocessor, postprocessor = train(
            config, root, REPO_ID, seed=args.seed, batch_size=args.batch_size, steps=args.steps,
            prepare=freeze_backbone,
        )
        train_s = time.perf_counter() - tick
        save_checkpoint(policy, preprocessor, postprocessor, staging)
        frames = json.loads((root / "meta" / "info.json").read_text())["total_frames"]
        parameters = sum(p.numel() for p in policy.parameters())
        backbone = sum(p.numel() for n, p in policy.named_parameters() if n.startswith("model.backbone"))

    import importlib.metadata

    import lerobot

    size = sum(path.stat().st_size for path in staging.iterdir())
    provenance = {
        "made_by": str(SCRIPT.relative_to(REPO)),
        "script_sha256": script_digest(),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "policy": "act",
        "parameters": parameters,
        "backbone_parameters": backbone,
        "backbone": f"resnet18, random init (seed {args.seed}), "
                    + ("trained" if args.train_backbone else "frozen"),
        "demonstrations": {"episodes": args.episodes, "frames": frames,
                           "seeds": f"{DEMO_SEED_BASE}..{DEMO_SEED_BASE + args.episodes - 1}"},
        "train_s": round(train_s, 1),
        "versions": {"lerobot": lerobot.__version__, "torch": torch.__version__,
                     "gym_pusht": importlib.metadata.version("gym-pusht"),
                     "python": sys.version.split()[0]},
        "bytes": size,
    }
    (staging / PROVENANCE_FILE).write_text(json.dumps(provenance, indent=2) + "\n", encoding="utf-8")
    (staging / PROVENANCE_FILE).chmod(0o644)
    return provenance


if __name__ == "__main__":
    sys.exit(main())
