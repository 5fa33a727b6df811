"""LeRobot's Diffusion Policy behind the LeRobot seam: one stateless, deterministic chunk per observation.

LeRobot's ``DiffusionPolicy.predict_action_chunk`` stacks the last ``n_obs_steps`` observations
from queues that only its ``select_action`` fills, so a batch of observations from different
episodes (the policy server's batches) cannot go through it. With ``n_obs_steps == 1`` that history
is the current observation alone: :func:`diffusion_chunk` builds the ``[B, 1, ...]`` batch
``select_action`` would have stacked and calls LeRobot's own ``DiffusionModel.generate_actions``
(the same denoising loop, scheduler and U-Net). A checkpoint with a longer history is refused by
:func:`check_diffusion_config` with the fix.

The denoising starts from a fixed initial noise (:data:`NOISE_SEED`, the same for every row and
every call) and LeRobot's DDIM step adds no noise of its own, so a DDIM diffusion policy is a
deterministic function of its observation: reruns give the same episodes, and an observation gets
the same chunk alone or in a batch of 32 (to float rounding: ~4e-7 on the shipped checkpoint). (A DDPM scheduler still draws noise in each step from
torch's global generator; the seam leaves that as LeRobot does it.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["NOISE_SEED", "check_diffusion_config", "diffusion_chunk"]

#: Seed of the initial noise every denoising starts from.
NOISE_SEED = 0


def check_diffusion_config(config: Any, folder: Path) -> None:
    """Raise ``ValueError`` unless the diffusion checkpoint at ``folder`` can run without a history."""
    n_obs_steps = int(getattr(config, "n_obs_steps", 1))
    if n_obs_steps != 1:
        raise ValueError(
            f"{folder} holds a 'diffusion' policy with n_obs_steps={n_obs_steps}: its chunk depends on "
            f"the last {n_obs_steps} observations, a history LeRobot keeps inside select_action, which "
            "the seam (one stateless chunk per observation, batched across episodes) cannot give it. "
            "Fix: train it with DiffusionConfig(n_obs_steps=1, ...) (the drop_n_last_frames and "
            "horizon rules stay LeRobot's)"
        )


def diffusion_chunk(policy: Any, batch: dict[str, Any]) -> Any:
    """``[B, n_action_steps, A]`` actions for a preprocessed (normalized) batch of ``B`` observations."""
    import torch
    from lerobot.utils.constants import OBS_ENV_STATE, OBS_IMAGES, OBS_STATE

    config = policy.config
    inputs = {key: batch[key].unsqueeze(1) for key in (OBS_STATE, OBS_ENV_STATE) if key in batch}
    if config.image_features:
        # select_action stacks the cameras on dim -4, then its queue adds the time dim at 1
        cameras = torch.stack([batch[key] for key in config.image_features], dim=-4)
        inputs[OBS_IMAGES] = cameras.unsqueeze(1)
    size = inputs[OBS_STATE].shape[0]
    parameter = next(policy.parameters())
    generator = torch.Generator().manual_seed(NOISE_SEED)
    row = torch.randn((config.horizon, config.action_feature.shape[0]), generator=generator)
    noise = row.to(device=parameter.device, dtype=parameter.dtype).expand(size, -1, -1).contiguous()
    return policy.diffusion.generate_actions(inputs, noise=noise)
