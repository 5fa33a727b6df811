"""The LeRobot seam: checkpoints load offline with their processors and drive the reach sim.

Runs only where LeRobot is installed (the ``.venv-lerobot`` environment)::

    .venv-lerobot/bin/python -m pytest tests/e2e/lerobot -q -p no:cacheprovider -p no:hud
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# Not just "lerobot": with tests/ on sys.path this very folder imports as a namespace package of
# that name, so the skip would not happen where LeRobot is missing.
pytest.importorskip("lerobot.policies")

import torch
from lerobot.configs.types import FeatureType, NormalizationMode, PolicyFeature
from lerobot.policies.act.configuration_act import ACTConfig
from lerobot.policies.act.modeling_act import ACTPolicy
from lerobot.policies.factory import make_pre_post_processors

from evals.sims.reach import make_reach
from pytest_hud.agent.lerobot import (
    CopyObservationsProcessorStep, LeRobotPolicy, lerobot_feature_name, looks_like_lerobot_checkpoint,
)

REPO = Path(__file__).resolve().parents[3]
SHIPPED = REPO / "evals" / "checkpoints" / "reach_act"
MEAN_STD = NormalizationMode.MEAN_STD


def stats(mean: list[float], std: list[float]) -> dict[str, torch.Tensor]:
    return {"mean": torch.tensor(mean), "std": torch.tensor(std)}


def save_tiny_act(folder: Path, image_size: int | None = None) -> ACTPolicy:
    """A randomly initialised ACT (state-only, or state + one camera) saved as LeRobot saves one."""
    torch.manual_seed(0)
    features = {"observation.state": PolicyFeature(FeatureType.STATE, (4,))}
    dataset_stats = {
        "observation.state": stats([0.5, 0.5, 0.5, 0.5], [0.3, 0.3, 0.3, 0.3]),
        "action": stats([0.1, -0.2], [0.5, 0.7]),  # not the identity: unnormalizing must matter
    }
    if image_size is None:
        features["observation.environment_state"] = PolicyFeature(FeatureType.ENV, (4,))
        dataset_stats["observation.environment_state"] = dataset_stats["observation.state"]
    else:
        features["observation.images.top"] = PolicyFeature(FeatureType.VISUAL, (3, image_size, image_size))
        dataset_stats["observation.images.top"] = stats([[[0.5]]] * 3, [[[0.25]]] * 3)
    config = ACTConfig(
        device="cpu",
        push_to_hub=False,
        input_features=features,
        output_features={"action": PolicyFeature(FeatureType.ACTION, (2,))},
        normalization_mapping={"STATE": MEAN_STD, "ENV": MEAN_STD, "VISUAL": MEAN_STD, "ACTION": MEAN_STD},
        chunk_size=6,
        n_action_steps=4,
        dim_model=32,
        n_heads=2,
        dim_feedforward=64,
        n_encoder_layers=1,
        n_vae_encoder_layers=1,
        latent_dim=8,
        pretrained_backbone_weights=None,
    )
    policy = ACTPolicy(config)
    preprocessor, postprocessor = make_pre_post_processors(config, dataset_stats=dataset_stats)
    if image_size is None:
        preprocessor.steps.insert(
            1, CopyObservationsProcessorStep({"observation.state": "observation.environment_state"})
        )
    policy.save_pretrained(folder)
    preprocessor.save_pretrained(folder)
    postprocessor.save_pretrained(folder)
    policy.eval()
    policy.preprocessor, policy.postprocessor = preprocessor, postprocessor
    return policy


@pytest.fixture(scope="module")
def tiny_act(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ACTPolicy]:
    folder = tmp_path_factory.mktemp("tiny_act")
    return folder, save_tiny_act(folder)


def reach_success_rate(model: LeRobotPolicy, seeds: range) -> float:
    env = make_reach()
    successes = 0
    for seed in seeds:
        model.reset()
        observation, info = env.reset(seed=seed)
        queue: list[np.ndarray] = []
        terminated = truncated = False
        while not (terminated or truncated):
            if not queue:
                queue = list(model.predict(observation, "reach the green goal"))
            observation, _, terminated, truncated, info = env.step(queue.pop(0))
        successes += info["is_success"]
    return successes / len(seeds)


def test_a_saved_act_reloads_with_its_processors_and_predicts_the_same_actions(tiny_act):
    folder, policy = tiny_act
    observation = {"state": np.array([0.2, 0.9, 0.7, 0.1], dtype=np.float32)}

    in_memory = LeRobotPolicy(policy, policy.preprocessor, policy.postprocessor, folder)
    loaded = LeRobotPolicy.from_checkpoint(folder, {"state": ((4,), "state")})
    expected = in_memory.predict(observation)
    actions = loaded.predict(observation)

    assert actions.shape == (4, 2) and actions.dtype == np.float32  # n_action_steps of the chunk of 6
    np.testing.assert_allclose(actions, expected, rtol=1e-5, atol=1e-6)
    # The same numbers straight from LeRobot: preprocess, predict_action_chunk, unnormalize.
    batch = {
        "observation.state": torch.from_numpy(observation["state"])[None],
        "task": [""],
    }
    with torch.inference_mode():
        raw = policy.postprocessor(policy.predict_action_chunk(policy.preprocessor(batch)))
    np.testing.assert_allclose(actions, raw[0, :4].numpy(), rtol=1e-5, atol=1e-6)


def test_a_batch_predicts_what_single_observations_predict(tiny_act):
    folder, _ = tiny_act
    model = LeRobotPolicy.from_checkpoint(folder, n_action_steps=6)
    rng = np.random.default_rng(0)
    observations = [{"state": rng.uniform(0, 1, 4).astype(np.float32)} for _ in range(3)]

    chunks = model.predict_batch(observations, [None, "reach", None])

    assert [chunk.shape for chunk in chunks] == [(6, 2)] * 3
    for observation, chunk in zip(observations, chunks, strict=True):
        np.testing.assert_allclose(chunk, model.predict(observation), rtol=1e-4, atol=1e-5)
    assert not np.allclose(chunks[0], chunks[1])


def test_a_feature_mismatch_names_the_policy_inputs_and_the_observation_keys(tiny_act):
    folder, _ = tiny_act

    with pytest.raises(ValueError) as excinfo:
        LeRobotPolicy.from_checkpoint(folder, {"pixels": ((64, 64, 3), "rgb"), "joints": ((7,), "state")})

    message = str(excinfo.value)
    assert "observation.state (4,)" in message  # the policy side
    assert "pixels (64, 64, 3) -> observation.image" in message  # the observation side
    assert "joints (7,)" in message
    assert "missing: observation.state" in message
    assert "rename=" in message  # how to fix it


def test_a_state_of_the_wrong_size_is_refused_before_any_episode(tiny_act):
    folder, _ = tiny_act
    with pytest.raises(ValueError, match=r"state \(7,\) cannot feed observation.state \(4,\)"):
        LeRobotPolicy.from_checkpoint(folder, {"state": ((7,), "state")})
    model = LeRobotPolicy.from_checkpoint(folder)
    with pytest.raises(ValueError, match=r"state \(7,\) cannot feed observation.state \(4,\)"):
        model.predict({"state": np.zeros(7, np.float32)})


def test_observations_with_the_wrong_keys_fail_predict_with_the_same_explanation(tiny_act):
    folder, _ = tiny_act
    model = LeRobotPolicy.from_checkpoint(folder)
    with pytest.raises(ValueError, match=r"policy input features: observation\.state"):
        model.predict({"agent": np.zeros(4, np.float32)})
    # rename= is the fix the message suggests
    renamed = LeRobotPolicy.from_checkpoint(folder, rename={"agent": "observation.state"})
    assert renamed.predict({"agent": np.zeros(4, np.float32)}).shape == (4, 2)


def test_a_camera_policy_is_fed_hwc_uint8_pixels_converted_like_lerobot(tmp_path):
    policy = save_tiny_act(tmp_path, image_size=32)
    model = LeRobotPolicy.from_checkpoint(
        tmp_path, {"state": ((4,), "state"), "pixels/top": ((32, 32, 3), "rgb")}
    )
    image = np.random.default_rng(1).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    state = np.array([0.1, 0.2, 0.3, 0.4], dtype=np.float32)

    actions = model.predict({"state": state, "pixels/top": image})

    batch = {
        "observation.state": torch.from_numpy(state)[None],
        "observation.images.top": torch.from_numpy(image).permute(2, 0, 1)[None].float() / 255.0,
        "task": [""],
    }
    with torch.inference_mode():
        raw = policy.postprocessor(policy.predict_action_chunk(policy.preprocessor(batch)))
    np.testing.assert_allclose(actions, raw[0, :4].numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="HWC uint8"):
        model.predict({"state": state, "pixels/top": image.astype(np.float32)})
    with pytest.raises(ValueError, match="needs an HWC uint8 image with 3 channels"):
        LeRobotPolicy.from_checkpoint(tmp_path, {"state": ((4,), "state"), "pixels/top": ((32, 32), "rgb")})


def test_contract_keys_map_to_lerobot_feature_names():
    assert lerobot_feature_name("state") == "observation.state"
    assert lerobot_feature_name("agent_pos") == "observation.state"
    assert lerobot_feature_name("observation/state") == "observation.state"
    assert lerobot_feature_name("environment_state") == "observation.environment_state"
    assert lerobot_feature_name("pixels") == "observation.image"
    assert lerobot_feature_name("pixels/wrist") == "observation.images.wrist"
    assert lerobot_feature_name("observation.images.top") == "observation.images.top"


def test_checkpoint_folders_are_recognised_without_loading_them(tmp_path):
    assert looks_like_lerobot_checkpoint(SHIPPED / "final")
    assert not looks_like_lerobot_checkpoint(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))  # a transformers model
    assert not looks_like_lerobot_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"type": "act"}))
    assert looks_like_lerobot_checkpoint(tmp_path)


def test_a_folder_that_is_not_a_checkpoint_gets_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a LeRobot checkpoint folder"):
        LeRobotPolicy.from_checkpoint(tmp_path)


def test_the_shipped_final_checkpoint_reaches_the_goal_and_the_early_one_is_worse():
    seeds = range(20)
    final = LeRobotPolicy.from_checkpoint(SHIPPED / "final", {"state": ((4,), "state")})
    early = LeRobotPolicy.from_checkpoint(SHIPPED / "early", {"state": ((4,), "state")})

    final_rate = reach_success_rate(final, seeds)
    early_rate = reach_success_rate(early, seeds)

    assert final_rate >= 0.5
    assert early_rate < final_rate
