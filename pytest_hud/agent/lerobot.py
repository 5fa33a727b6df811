"""The LeRobot seam: a local LeRobot policy checkpoint as a pytest-hud model.

(Over 400 lines on purpose: LeRobot's factory, processors, feature mapping and chunk queue form one seam; each step's errors name both sides.)

A checkpoint is a folder written by LeRobot (0.4.4 or 0.6.x): ``config.json`` and ``model.safetensors``
(``PreTrainedPolicy.save_pretrained``) plus the processors saved next to them
(``policy_preprocessor.json``, ``policy_postprocessor.json`` and their ``.safetensors`` stats).
:class:`LeRobotPolicy` loads all of it offline with LeRobot's own loaders and answers the Model seam:
``predict(observation, prompt) -> [T, A]`` (an action chunk), ``predict_batch`` and ``reset``.

Observation keys arrive as contract feature names and are matched to the policy's input features
by name (see :func:`lerobot_feature_name`); images are converted HWC uint8 → CHW float in [0, 1]
exactly as LeRobot's env preprocessing does, then the checkpoint's preprocessor (rename, batch,
device, normalize) runs, ``predict_action_chunk`` predicts, and the postprocessor unnormalizes.

torch and lerobot are imported only when a policy is loaded; :func:`looks_like_lerobot_checkpoint`
and :func:`lerobot_feature_name` are cheap. ::

    policy = LeRobotPolicy.from_checkpoint("evals/checkpoints/reach_act/final")
    chunk = policy.predict({"state": obs["state"]})  # float32 [T, 2]
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pytest_hud.core.specs import CONFIG_FILE, WEIGHTS_FILE, checkpoint_type, looks_like_lerobot_checkpoint

__all__ = [
    "CONFIG_FILE",
    "WEIGHTS_FILE",
    "LeRobotPolicy",
    "lerobot_feature_name",
    "looks_like_lerobot_checkpoint",
]

PREPROCESSOR_FILE = "policy_preprocessor.json"
POSTPROCESSOR_FILE = "policy_postprocessor.json"

# Contract names that LeRobot spells differently (the bridge flattens nested observations to slash
# keys). ``agent_pos``, ``environment_state`` and ``pixels[/cam]`` follow LeRobot's own gym mapping
# (``lerobot.envs.utils.preprocess_observation``).
_ALIASES = {
    "state": "observation.state",
    "agent_pos": "observation.state",
    "observation/state": "observation.state",
    "environment_state": "observation.environment_state",
    "pixels": "observation.image",
}

_IMAGE_KINDS = frozenset({"rgb", "uint8"})  # contract type or dtype of an HWC uint8 image

# Their predict_action_chunk reads an observation history that only select_action fills, so a
# stateless chunk call (and batching across episodes) would be wrong for them. (Diffusion with
# n_obs_steps=1 runs through lerobot_diffusion instead.)
_HISTORY_POLICIES = frozenset({"vqbet", "tdmpc", "sac"})

_FIX_HINT = (
    "Fix: name the sim's observation keys the way the policy expects (state/agent_pos -> "
    "observation.state, environment_state -> observation.environment_state, pixels -> "
    "observation.image, pixels/<cam> -> observation.images.<cam>, or the LeRobot name itself), "
    "or map them explicitly with LeRobotPolicy.from_checkpoint(path, rename={'<observation key>': "
    "'<policy input feature>'})."
)


def offline() -> None:
    """Keep LeRobot and the Hugging Face libraries off the network (a checkpoint is a local folder),
    unless the environment says otherwise. Before they are imported: they read it then."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def preload() -> None:
    """Import what :meth:`LeRobotPolicy.from_checkpoint` imports before it knows the policy's type
    (torch, torchvision, LeRobot's config parser and factory: 4-8 CPU-seconds on LeRobot 0.6.1),
    offline. A standby policy server calls it while the run starts (:mod:`pytest_hud.launch.standby`)."""
    offline()
    from pytest_hud.agent.lerobot_import import import_policy_code

    import_policy_code()


def lerobot_feature_name(key: str) -> str:
    """The LeRobot feature a contract observation key feeds.

    >>> [lerobot_feature_name(k) for k in ("state", "pixels", "pixels/top", "observation.state")]
    ['observation.state', 'observation.image', 'observation.images.top', 'observation.state']
    """
    if key in _ALIASES:
        return _ALIASES[key]
    if key.startswith("pixels/"):
        return "observation.images." + key[len("pixels/") :].replace("/", ".")
    if key.startswith("observation/"):
        return key.replace("/", ".")
    return key


def __getattr__(name: str) -> Any:
    # The processor step class subclasses a lerobot class, so it is built on first use; LeRobot
    # resolves it by import path ("pytest_hud.agent.lerobot.CopyObservationsProcessorStep") when
    # it loads a checkpoint whose preprocessor uses it.
    if name == "CopyObservationsProcessorStep":
        cls = _define_copy_step()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _define_copy_step() -> type:
    from dataclasses import dataclass, field

    from lerobot.configs.types import PipelineFeatureType
    from lerobot.processor.pipeline import ObservationProcessorStep

    @dataclass
    class CopyObservationsProcessorStep(ObservationProcessorStep):
        """Copies observation features under more names (``copy_map``: source -> copy).

        LeRobot 0.4.4's ACT needs ``observation.state`` *and* either an image or
        ``observation.environment_state``; a state-only sim has one state vector, so a state-only
        ACT checkpoint feeds it to both tokens with ``{"observation.state":
        "observation.environment_state"}``. Unlike LeRobot's rename step, the source stays.
        """

        copy_map: dict[str, str] = field(default_factory=dict)

        def observation(self, observation: dict[str, Any]) -> dict[str, Any]:
            copied = dict(observation)
            for source, target in self.copy_map.items():
                if source in observation:
                    copied[target] = observation[source]
            return copied

        def get_config(self) -> dict[str, Any]:
            return {"copy_map": dict(self.copy_map)}

        def transform_features(self, features: dict) -> dict:
            observation = dict(features.get(PipelineFeatureType.OBSERVATION, {}))
            for source, target in self.copy_map.items():
                if source in observation:
                    observation[target] = observation[source]
            new_features = dict(features)
            new_features[PipelineFeatureType.OBSERVATION] = observation
            return new_features

    CopyObservationsProcessorStep.__module__ = __name__
    CopyObservationsProcessorStep.__qualname__ = "CopyObservationsProcessorStep"
    return CopyObservationsProcessorStep


def _shape_text(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(int(d)) for d in shape) + ("," if len(shape) == 1 else "") + ")"


class LeRobotPolicy:
    """A LeRobot policy checkpoint behind the Model seam. Build it with :meth:`from_checkpoint`."""

    def __init__(
        self,
        policy: Any,
        preprocessor: Any,
        postprocessor: Any,
        path: Path,
        device: str = "cpu",
        n_action_steps: int | None = None,
        rename: Mapping[str, str] | None = None,
    ):
        self.policy = policy
        self.preprocessor = preprocessor
        self.postprocessor = postprocessor
        self.path = path
        self.device = device
        self.rename = dict(rename or {})
        policy.eval()  # no dropout; LeRobot's from_pretrained does the same
        config = policy.config
        if n_action_steps is None:
            n_action_steps = getattr(config, "n_action_steps", None)
        if n_action_steps is not None and n_action_steps < 1:
            raise ValueError(f"n_action_steps must be at least 1, got {n_action_steps}")
        self.n_action_steps = n_action_steps
        # What the preprocessor must be given: the policy's input features, traced back through the
        # checkpoint's own rename/copy steps.
        self.input_features: dict[str, tuple[tuple[int, ...], str]] = _preprocessor_inputs(
            preprocessor, config.input_features
        )
        self._visual = {name for name, (_, kind) in self.input_features.items() if kind == "VISUAL"}
        self._routes: dict[frozenset[str], dict[str, str]] = {}

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        feature_names_and_shapes: Mapping[str, tuple[tuple[int, ...], str]] | None = None,
        device: str = "cpu",
        n_action_steps: int | None = None,
        rename: Mapping[str, str] | None = None,
    ) -> LeRobotPolicy:
        """Load a local LeRobot checkpoint (weights, config, pre/post processors), offline.

        ``feature_names_and_shapes`` (observation key -> (shape, contract type or dtype), e.g. the
        contract's observation features) checks up front that the observations can feed the policy, raising
        ``ValueError`` naming both sides when they cannot. ``n_action_steps`` truncates each
        predicted chunk (default: the policy's own ``n_action_steps``). ``rename`` maps
        observation keys to policy input features where the default naming does not fit.
        """
        folder = Path(path)
        policy_type = checkpoint_type(folder)
        if policy_type is None:
            raise FileNotFoundError(
                f"{folder} is not a LeRobot checkpoint folder: it needs {CONFIG_FILE} (with a policy "
                f"'type') and {WEIGHTS_FILE}, as written by PreTrainedPolicy.save_pretrained"
            )
        for name in (PREPROCESSOR_FILE, POSTPROCESSOR_FILE):
            if not (folder / name).is_file():
                raise FileNotFoundError(
                    f"{folder} has no {name}: the policy's processors must be saved next to the model "
                    "(preprocessor.save_pretrained(path), postprocessor.save_pretrained(path)); "
                    "checkpoints from LeRobot < 0.4 can be migrated with "
                    "`python -m lerobot.processor.migrate_policy_normalization`"
                )

        try:
            from pytest_hud.agent.lerobot_import import import_policy_code

            import_policy_code(policy_type)
            from lerobot.configs.policies import PreTrainedConfig
            from lerobot.policies.factory import get_policy_class, make_pre_post_processors
        except ImportError as error:
            raise ImportError(
                f"{folder} is a LeRobot checkpoint but LeRobot is not importable ({error}); "
                "install it with: pip install 'pytest-hud[lerobot]'"
            ) from error

        config = PreTrainedConfig.from_pretrained(folder)
        if config.type in _HISTORY_POLICIES:
            raise ValueError(
                f"{folder} holds a '{config.type}' policy, whose predict_action_chunk depends on an "
                "observation history kept by select_action; LeRobotPolicy supports chunking policies "
                "without one (act, diffusion with n_obs_steps=1, smolvla, pi0, pi05, ...)"
            )
        if config.type == "diffusion":
            from pytest_hud.agent.lerobot_diffusion import check_diffusion_config

            check_diffusion_config(config, folder)
        config.device = device
        # PreTrainedPolicy.from_pretrained prints a progress line; keep stdout for the test run.
        with contextlib.redirect_stdout(sys.stderr):
            policy = get_policy_class(config.type).from_pretrained(folder, config=config, strict=True)
        preprocessor, postprocessor = make_pre_post_processors(
            config,
            pretrained_path=str(folder),
            preprocessor_overrides=_device_overrides(folder / PREPROCESSOR_FILE, device),
            postprocessor_overrides=_device_overrides(folder / POSTPROCESSOR_FILE, "cpu"),
        )
        model = cls(policy, preprocessor, postprocessor, folder, device, n_action_steps, rename)
        if feature_names_and_shapes is not None:
            model.check_observation_features(feature_names_and_shapes)
        return model

    def check_observation_features(
        self, feature_names_and_shapes: Mapping[str, tuple[tuple[int, ...], str]]
    ) -> None:
        """Raise ``ValueError`` unless observations with these keys and shapes can feed the policy:
        every input feature found, state sizes equal, images HWC with the policy's channel count.

        The second element of each value is the contract feature type (``rgb``, ``state``, ...) or
        a numpy dtype name; an image must be ``rgb`` or ``uint8``.
        """
        shapes = {key: tuple(int(d) for d in shape) for key, (shape, _) in feature_names_and_shapes.items()}
        kinds = {key: str(kind) for key, (_, kind) in feature_names_and_shapes.items()}
        routes = self._route(shapes.keys(), shapes)
        problems = []
        for feature, key in routes.items():
            want, policy_kind = self.input_features[feature]
            got = shapes[key]
            if policy_kind == "VISUAL":
                channels = want[0] if len(want) == 3 else None
                if kinds[key] not in _IMAGE_KINDS or len(got) != 3 or got[2] != channels:
                    problems.append(
                        f"{key} {_shape_text(got)} {kinds[key]} cannot feed {feature} {_shape_text(want)}: "
                        f"it needs an HWC uint8 image with {channels} channels"
                    )
            elif int(np.prod(got)) != int(np.prod(want)):
                problems.append(f"{key} {_shape_text(got)} cannot feed {feature} {_shape_text(want)}")
        if problems:
            raise ValueError(self._mismatch_text(shapes, problems))

    def reset(self) -> None:
        """Clear the policy's per-episode state (action queue); called at each episode start."""
        self.policy.reset()

    def predict(self, observation: Mapping[str, np.ndarray], prompt: str | None = None) -> np.ndarray:
        """An action chunk ``[T, A]`` (float32) for one observation."""
        return self.predict_batch([observation], [prompt])[0]

    def predict_batch(
        self,
        observations: Sequence[Mapping[str, np.ndarray]],
        prompts: Sequence[str | None],
    ) -> list[np.ndarray]:
        """One action chunk ``[T, A]`` per observation, predicted in one batched forward pass."""
        import torch

        from pytest_hud.agent.lerobot_diffusion import diffusion_chunk

        if len(observations) != len(prompts):
            raise ValueError(f"{len(observations)} observations but {len(prompts)} prompts")
        if not observations:
            return []
        keys = observations[0].keys()
        for index, observation in enumerate(observations[1:], start=1):
            if observation.keys() != keys:
                raise ValueError(
                    f"observation {index} has keys {sorted(observation)}, observation 0 has {sorted(keys)}"
                )
        shapes = {key: np.shape(observations[0][key]) for key in keys}
        routes = self._route(keys, shapes)
        batch: dict[str, Any] = {}
        for feature, key in routes.items():
            stacked = np.stack([np.asarray(observation[key]) for observation in observations])
            if feature in self._visual:
                batch[feature] = _images_to_tensor(stacked, key)
            else:
                want = self.input_features[feature][0]
                if stacked[0].size != int(np.prod(want)):
                    got = _shape_text(stacked.shape[1:])
                    problem = f"{key} {got} cannot feed {feature} {_shape_text(want)}"
                    raise ValueError(self._mismatch_text(shapes, [problem]))
                batch[feature] = torch.from_numpy(
                    np.ascontiguousarray(stacked.reshape(len(observations), -1))
                ).float()
        # LeRobot's eval loop sends "" as the task of envs without a language instruction.
        batch["task"] = [prompt or "" for prompt in prompts]
        with torch.inference_mode():
            batch = self.preprocessor(batch)
            if self.policy.config.type == "diffusion":
                chunk = diffusion_chunk(self.policy, batch)
            else:
                chunk = self.policy.predict_action_chunk(batch)
            if self.n_action_steps is not None:
                chunk = chunk[:, : self.n_action_steps]
            chunk = self.postprocessor(chunk)
        actions = chunk.detach().to("cpu", torch.float32).numpy()
        return [np.ascontiguousarray(actions[index]) for index in range(actions.shape[0])]

    def _route(self, keys: Any, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, str]:
        """policy input feature -> observation key, or ValueError naming both sides."""
        key_set = frozenset(keys)
        routes = self._routes.get(key_set)
        if routes is not None:
            return routes
        offered: dict[str, str] = {}
        for key in sorted(key_set):
            feature = self.rename.get(key) or lerobot_feature_name(key)
            if feature in self.input_features and feature in offered:
                raise ValueError(
                    self._mismatch_text(
                        shapes,
                        [f"{offered[feature]} and {key} both feed {feature}; drop one or use rename="],
                    )
                )
            offered[feature] = key
        missing = [feature for feature in self.input_features if feature not in offered]
        if missing:
            raise ValueError(self._mismatch_text(shapes, [f"missing: {', '.join(missing)}"]))
        routes = {feature: offered[feature] for feature in self.input_features}
        self._routes[key_set] = routes
        return routes

    def _mismatch_text(self, shapes: Mapping[str, tuple[int, ...]], problems: list[str]) -> str:
        policy_side = (
            ", ".join(
                f"{name} {_shape_text(shape)} {kind}" for name, (shape, kind) in self.input_features.items()
            )
            or "(none)"
        )
        observation_side = (
            ", ".join(
                f"{key} {_shape_text(shape)} -> {self.rename.get(key) or lerobot_feature_name(key)}"
                for key, shape in sorted(shapes.items())
            )
            or "(none)"
        )
        return (
            f"the LeRobot policy at {self.path} cannot be fed from these observations\n"
            f"  policy input features: {policy_side}\n"
            f"  observation keys:      {observation_side}\n"
            + "".join(f"  {problem}\n" for problem in problems)
            + _FIX_HINT
        )

    def __repr__(self) -> str:
        return (
            f"LeRobotPolicy({str(self.path)!r}, type={self.policy.config.type!r}, "
            f"device={self.device!r}, n_action_steps={self.n_action_steps})"
        )


def _images_to_tensor(images: np.ndarray, key: str) -> Any:
    """``[B, H, W, C]`` uint8 -> ``[B, C, H, W]`` float32 in [0, 1], through LeRobot's own code."""
    from lerobot.envs.utils import preprocess_observation
    from lerobot.utils.constants import OBS_IMAGE

    if (
        images.dtype != np.uint8
        or images.ndim != 4
        or not (images.shape[3] < images.shape[1] and images.shape[3] < images.shape[2])
    ):
        raise ValueError(
            f"observation {key} must be an HWC uint8 image, got shape {images.shape[1:]} {images.dtype}"
        )
    return preprocess_observation({"pixels": np.ascontiguousarray(images)})[OBS_IMAGE]


def _preprocessor_inputs(
    preprocessor: Any, input_features: Mapping[str, Any]
) -> dict[str, tuple[tuple[int, ...], str]]:
    """The features the preprocessor must receive so that the policy gets ``input_features``:
    names traced back through rename and copy steps (other steps keep names)."""
    needed = {
        name: (tuple(int(d) for d in feature.shape), feature.type.name)
        for name, feature in input_features.items()
    }
    for step in reversed(list(getattr(preprocessor, "steps", []))):
        rename_map = getattr(step, "rename_map", None)
        copy_map = getattr(step, "copy_map", None)
        if isinstance(rename_map, dict) and rename_map:
            inverse = {new: old for old, new in rename_map.items()}
            needed = {inverse.get(name, name): spec for name, spec in needed.items()}
        elif isinstance(copy_map, dict) and copy_map:
            for source, target in copy_map.items():
                if target in needed:
                    needed.setdefault(source, needed[target])
                    del needed[target]
    return needed


def _device_overrides(config_file: Path, device: str) -> dict[str, dict[str, Any]]:
    """Overrides moving a saved pipeline's device-aware steps to ``device`` (only steps it has:
    LeRobot rejects overrides for steps a pipeline lacks)."""
    try:
        steps = json.loads(config_file.read_text(encoding="utf-8")).get("steps", [])
    except (OSError, ValueError) as error:
        raise ValueError(f"cannot read the LeRobot processor config {config_file}: {error}") from error
    names = {step.get("registry_name") for step in steps if isinstance(step, dict)}
    return {
        name: {"device": device} for name in ("device_processor", "normalizer_processor") if name in names
    }
