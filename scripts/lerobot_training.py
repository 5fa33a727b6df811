"""LeRobot training pieces shared by the checkpoint scripts (offline, CPU, deterministic for a seed).

Uses LeRobot's own factories and its ``update_policy`` step, the way ``lerobot-train`` does, without
its command-line parsing (``TrainPipelineConfig.validate`` reads ``sys.argv``). The small ACT every
shipped ACT checkpoint uses (:func:`small_act`), the state-only inputs around it and the open-loop
rollout that scores a checkpoint (:func:`success_rate`) live here too, so the scripts differ only in
their demonstrations and their settings.
"""

from __future__ import annotations

import copy
import itertools
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


def small_act(*, lr: float, n_action_steps: int, state_dim: int | None = None, env_dim: int | None = None,
              dim_model: int = 64, dim_feedforward: int = 256, **extra: Any) -> Any:
    """The small ACT of the shipped checkpoints (2 encoder layers, 1 decoder layer, chunks of 10,
    no pretrained weights: nothing is downloaded), on the CPU.

    With ``state_dim`` its inputs are ``observation.state`` and ``observation.environment_state``
    (``env_dim``, the state's size unless given), each normalized by mean and std: a state-only ACT
    (LeRobot's ACT needs an image or an environment state besides the state; pair it with
    :func:`copy_state_to_env_state` when the data has no environment state). Without it the features
    come from the dataset (``make_policy`` fills them). ``extra`` goes to ``ACTConfig`` as is, e.g.
    ``vision_backbone="resnet18"``.
    """
    from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature
    from lerobot.policies.act.configuration_act import ACTConfig
    from lerobot.utils.constants import OBS_ENV_STATE, OBS_STATE

    if state_dim is not None:
        extra["input_features"] = {
            OBS_STATE: PolicyFeature(FeatureType.STATE, (state_dim,)),
            OBS_ENV_STATE: PolicyFeature(FeatureType.ENV, (env_dim or state_dim,)),
        }
        extra["normalization_mapping"] = {
            "STATE": NormalizationMode.MEAN_STD,
            "ENV": NormalizationMode.MEAN_STD,
            "ACTION": NormalizationMode.MEAN_STD,
        }
    return ACTConfig(
        device="cpu",
        push_to_hub=False,
        chunk_size=10,
        n_action_steps=n_action_steps,
        dim_model=dim_model,
        n_heads=4,
        dim_feedforward=dim_feedforward,
        n_encoder_layers=2,
        n_decoder_layers=1,
        n_vae_encoder_layers=1,
        latent_dim=16,
        pretrained_backbone_weights=None,
        optimizer_lr=lr,
        **extra,
    )


def copy_state_to_env_state(policy: Any, preprocessor: Any) -> None:
    """A ``prepare`` hook for :func:`train`: the saved preprocessor copies ``observation.state`` into
    ``observation.environment_state``, so a state-only policy runs on data that has the state alone."""
    from lerobot.utils.constants import OBS_ENV_STATE, OBS_STATE

    from pytest_hud.agent.lerobot import CopyObservationsProcessorStep

    preprocessor.steps.insert(1, CopyObservationsProcessorStep({OBS_STATE: OBS_ENV_STATE}))


def floor_std(stats: dict, keys: tuple[str, ...], min_std: float) -> dict:
    """A copy of ``stats`` whose std at ``keys`` is at least ``min_std``: dimensions that never vary
    in the demonstrations are not blown up by 1/std."""
    import numpy as np

    stats = copy.deepcopy(stats)
    for key in keys:
        stats[key]["std"] = np.maximum(np.asarray(stats[key]["std"], dtype=np.float32), min_std)
    return stats


def state_as_env_state(stats: dict, min_std: float | None = None) -> dict:
    """The stats for :func:`copy_state_to_env_state`: the environment state's are the state's (its std
    floored at ``min_std`` when given)."""
    from lerobot.utils.constants import OBS_ENV_STATE, OBS_STATE

    stats = copy.deepcopy(stats) if min_std is None else floor_std(stats, (OBS_STATE,), min_std)
    stats[OBS_ENV_STATE] = stats[OBS_STATE]
    return stats


def success_rate(model: Any, env: Any, seeds: range, *, prompt: str | None = None, max_steps: int | None = None,
                 success_key: str = "success") -> float:
    """The share of ``seeds`` on which ``model`` (a ``LeRobotPolicy``) succeeds in ``env``, each chunk
    executed open-loop; an episode ends when the env says so or after ``max_steps``; success is
    ``info[success_key]`` of its last step."""
    successes = 0
    for seed in seeds:
        model.reset()
        observation, info = env.reset(seed=seed)
        queue: list = []
        for _ in itertools.count() if max_steps is None else range(max_steps):
            if not queue:
                queue = list(model.predict(observation, prompt))
            observation, _, terminated, truncated, info = env.step(queue.pop(0))
            if terminated or truncated:
                break
        successes += bool(info[success_key])
    return successes / len(seeds)


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
