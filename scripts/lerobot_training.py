"""LeRobot training pieces shared by the checkpoint scripts (offline, CPU, deterministic for a seed).

Uses LeRobot's own factories and its ``update_policy`` step, the way ``lerobot-train`` does, without
its command-line parsing (``TrainPipelineConfig.validate`` reads ``sys.argv``).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def save_checkpoint(policy: Any, preprocessor: Any, postprocessor: Any, folder: Path) -> None:
    """Policy weights + config and both processors, as LeRobot saves them; nothing else."""
    if folder.exists():
        shutil.rmtree(folder)
    policy.save_pretrained(folder)
    preprocessor.save_pretrained(folder)
    postprocessor.save_pretrained(folder)
    for path in folder.iterdir():
        path.chmod(0o644)  # safetensors writes 0600; these files are shared through git


def endless(loader: Any) -> Any:
    """The loader's batches epoch after epoch (each pass a fresh iterator, so a shuffling loader
    reshuffles); written here because LeRobot's own helper moved between 0.4 and 0.6."""
    while True:
        yield from loader


def train(
    config: Any,
    dataset_root: Path,
    repo_id: str,
    *,
    seed: int,
    batch_size: int,
    steps: int,
    adapt_stats: Callable[[dict], dict] | None = None,
    prepare: Callable[[Any, Any], None] | None = None,
    on_step: Callable[[int, Any, Any, Any], None] | None = None,
    log_every: int = 50,
    preload: bool = False,
    episodes: list[int] | None = None,
) -> tuple[Any, Any, Any]:
    """Train ``config`` on the LeRobot dataset at ``dataset_root``; returns (policy, pre, post).

    ``adapt_stats(stats)`` may change the normalization stats before the processors are built;
    ``prepare(policy, preprocessor)`` runs before the optimizer is made (freeze parameters, add a
    processor step); ``on_step(step, policy, pre, post)`` runs after every update (snapshots).
    ``episodes`` trains on those dataset episodes only (e.g. the successful ones).
    """
    import torch
    from accelerate import Accelerator
    from lerobot.configs.default import DatasetConfig
    from lerobot.configs.train import TrainPipelineConfig
    from lerobot.datasets.factory import make_dataset
    from lerobot.optim.factory import make_optimizer_and_scheduler
    from lerobot.policies.factory import make_policy, make_pre_post_processors
    from lerobot.scripts.lerobot_train import update_policy
    from lerobot.utils.logging_utils import AverageMeter, MetricsTracker
    from lerobot.utils.random_utils import set_seed

    train_config = TrainPipelineConfig(
        dataset=DatasetConfig(repo_id=repo_id, root=str(dataset_root), episodes=episodes),
        policy=config,
        seed=seed,
        batch_size=batch_size,
        steps=steps,
        num_workers=0,
        # what validate() does with use_policy_training_preset=True
        optimizer=config.get_optimizer_preset(),
        scheduler=config.get_scheduler_preset(),
    )
    set_seed(seed)
    tick = time.perf_counter()
    dataset = make_dataset(train_config)  # loads the dataset back, with the policy's delta timestamps
    policy = make_policy(config, ds_meta=dataset.meta)
    stats = dataset.meta.stats if adapt_stats is None else adapt_stats(dataset.meta.stats)
    preprocessor, postprocessor = make_pre_post_processors(config, dataset_stats=stats)
    if prepare is not None:
        prepare(policy, preprocessor)
    optimizer, lr_scheduler = make_optimizer_and_scheduler(train_config, policy)
    parameters = sum(p.numel() for p in policy.parameters())
    print(f"dataset {dataset.num_episodes} episodes / {dataset.num_frames} frames, {type(policy).__name__} "
          f"{parameters:,} parameters: {time.perf_counter() - tick:.1f}s", flush=True)

    accelerator = Accelerator(cpu=True)
    items = dataset
    if preload:
        tick = time.perf_counter()
        items = [dataset[index] for index in range(len(dataset))]
        print(f"preloaded {len(items)} frames: {time.perf_counter() - tick:.1f}s", flush=True)
    loader = torch.utils.data.DataLoader(
        items, batch_size=batch_size, shuffle=True, num_workers=0, drop_last=False,
        generator=torch.Generator().manual_seed(seed),
    )
    batches = endless(loader)
    meters = {
        "loss": AverageMeter("loss", ":.3f"),
        "grad_norm": AverageMeter("grdn", ":.3f"),
        "lr": AverageMeter("lr", ":0.1e"),
        "update_s": AverageMeter("updt_s", ":.3f"),
        "dataloading_s": AverageMeter("data_s", ":.3f"),
    }
    tracker = MetricsTracker(batch_size, dataset.num_frames, dataset.num_episodes, meters, accelerator=accelerator)
    policy.train()
    tick = time.perf_counter()
    for step in range(1, steps + 1):
        loading = time.perf_counter()
        batch = preprocessor(next(batches))
        tracker.dataloading_s = time.perf_counter() - loading
        tracker, _ = update_policy(tracker, policy, batch, optimizer, train_config.optimizer.grad_clip_norm,
                                   accelerator=accelerator, lr_scheduler=lr_scheduler)
        tracker.step()
        if on_step is not None:
            on_step(step, policy, preprocessor, postprocessor)
        if step % log_every == 0 or step == steps:
            print(f"step {step}: {tracker} ({time.perf_counter() - tick:.0f}s)", flush=True)
            tracker.reset_averages()
    print(f"trained {steps} updates: {time.perf_counter() - tick:.1f}s", flush=True)
    return policy, preprocessor, postprocessor
