"""Rollouts recorded as a LeRobot (v3) dataset, the worker's half: each episode's observations and actions.

    recorder = DatasetRecorder("rollouts/", worker_id="gw0")   # one per worker
    agent = Agent(model, observers=[recorder])
    recorder.label_next("evals/test_reach_act.py::test_reach", "7")  # the plugin does this per test
    agent.run(shared_sim.episode(seed=7))
    recorder.close()                  # finalizes this worker's part, rollouts/parts/gw0/
    merge_parts("rollouts/")          # the controller, once every worker has closed its recorder
    LeRobotDataset("pytest-hud/rollouts", root="rollouts/")  # torch-ready frames

**Frames.** An episode of ``T`` steps gives ``T`` frames. Frame ``t`` pairs the observation the
policy acted on with the action it executed, then what the sim answered (LeRobot's convention):

=================================  =========================================================
LeRobot feature                    what it holds
=================================  =========================================================
``observation.state``              the contract's ``state`` / ``agent_pos`` feature
``observation.environment_state``  ``environment_state``
``observation.image``              ``pixels`` (HWC uint8, stored as a LeRobot ``image``;
``observation.images.<cam>``       ``pixels/<cam>``   ``video`` with ``use_videos=True``)
``observation.<key>``              any other observation feature (``/`` becomes ``.``)
``action``                         the executed action (the contract's dtype and shape)
``next.reward``                    float32 [1]: reward for this step (NaN when the sim sends none)
``next.done``                      bool [1]: the env terminated or truncated at this step
``next.success``                   bool [1]: the sim's success flag after this step
``task``                           the episode's prompt, else the pytest-hud task id
=================================  =========================================================

Names map exactly as for LeRobot checkpoints (:func:`pytest_hud.agent.lerobot.lerobot_feature_name`),
so a policy trained on the recording takes the sim's observations as they come. Dtypes, shapes and
element names come from the contract; LeRobot adds ``timestamp``, ``frame_index``,
``episode_index``, ``index`` and ``task_index``. Images must have 3 channels in LeRobot: gray
images are repeated to RGB and an alpha channel is dropped. ``meta/pytest_hud_episodes.jsonl``
maps each ``episode_index`` to its pytest-hud task, episode id, seed, success and score.

**Whole episodes or none.** Frames are kept in memory during the episode and handed to LeRobot
(``add_frame`` for each, then ``save_episode``) only in ``on_end``, so an episode that is
interrupted leaves nothing behind. Episodes that errored (``on_end`` with an ``error`` or without a
result: a bridge failure, a timeout, the model raised) are dropped and counted in :attr:`dropped`;
they are not evidence of what the policy does. Episodes of zero steps have no frame to record.
Failed (unsuccessful) episodes *are* recorded: ``next.success`` tells them apart.

**Parts and the merge.** Each worker writes its own dataset under ``root/parts/<worker-id>/``
(created at its first recorded episode; ``<worker-id>.2`` and so on if that folder is taken), so
workers never share a file. :meth:`DatasetRecorder.close` finalizes it (LeRobot's parquet files are
only readable once their writers are closed). :func:`merge_parts` then joins every part into one
dataset at ``root`` with LeRobot's own ``aggregate_datasets`` (episodes renumbered, tasks unified,
statistics aggregated) and removes the merged parts. A part whose worker died before closing it is
unreadable: the merge leaves it in place with a :class:`RecordingWarning`.

The merge is the controller's half, :mod:`pytest_hud.recording.dataset_merge`, and what both halves
share is :mod:`pytest_hud.recording.dataset_parts`; this module re-exports their public names
(``merge_parts``, ``check_record_dir``, ``RecordingWarning``, ...) so that this one import keeps
giving the whole recording API.

**Several sims in one run.** A LeRobot dataset has one set of features, so episodes are grouped by
their features (and fps): each group is its own part dataset, named ``<features>-<hash>`` (e.g.
``state-1a2b3c4d``). When a run recorded one group (the usual case) the merged dataset is ``root``
itself; with several, each group is merged into ``root/<group name>/``.

LeRobot (``pip install 'pytest-hud[lerobot]'``) is imported only when a recorder is created or
parts are merged; importing this module costs neither torch nor LeRobot.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pytest_hud.agent.lerobot import lerobot_feature_name
from pytest_hud.core.contract import RESERVED_KEYS, Contract
from pytest_hud.recording.dataset_merge import EPISODES_FILE, check_record_dir, merge_parts
from pytest_hud.recording.dataset_parts import (
    DEFAULT_REPO_ID, PART_EPISODES_FILE, PARTS_DIR, RecordingWarning, quiet_lerobot, recording_available,
    require_lerobot,
)
from pytest_hud.recording.trace import ArtefactNames

__all__ = [
    "DEFAULT_REPO_ID",
    "EPISODES_FILE",
    "DatasetRecorder",
    "RecordingWarning",
    "check_record_dir",
    "dataset_features",
    "merge_parts",
    "recording_available",
]

DEFAULT_FPS = 10
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
MIN_VIDEO_SIDE = 32  # smaller cameras are stored as images even with use_videos=True


# --------------------------------------------------------------------------------------- features
@dataclass(frozen=True)
class _Layout:
    """How one contract's frames become LeRobot frames."""

    name: str  # the part dataset's folder: "<short feature names>-<hash>"
    fps: int | float
    features: dict[str, dict[str, Any]]  # LeRobot features (without LeRobot's own index columns)
    observations: tuple[tuple[str, str, bool], ...]  # (contract name, LeRobot name, is image)
    action_dtype: str
    action_shape: tuple[int, ...]


def _as_fps(rate: float | None) -> int | float:
    value = float(rate) if rate else float(DEFAULT_FPS)
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"fps must be a positive number, got {rate!r}")
    return int(round(value)) if abs(value - round(value)) < 1e-9 else value


def _names(names: list[str], shape: tuple[int, ...]) -> list[str] | None:
    return list(names) if len(shape) == 1 and names and len(names) == shape[0] else None


def dataset_features(contract: Contract, use_videos: bool = False) -> dict[str, dict[str, Any]]:
    """The LeRobot features a recording of ``contract`` has (LeRobot adds its index columns).

        >>> dataset_features(contract)["observation.state"]
        {'dtype': 'float32', 'shape': (4,), 'names': ['agent_x', 'agent_y', 'goal_x', 'goal_y']}
    """
    return dict(_layout(contract, use_videos, None).features)


def _layout(contract: Contract, use_videos: bool, fps: float | None) -> _Layout:
    features: dict[str, dict[str, Any]] = {}
    observations: list[tuple[str, str, bool]] = []
    origin: dict[str, str] = {}
    for name, feat in contract.observation_features.items():
        if name in RESERVED_KEYS:
            continue
        target = lerobot_feature_name(name)
        if not target.startswith("observation."):
            target = "observation." + target
        target = target.replace("/", ".")  # LeRobot refuses "/" in feature names
        if target in origin:
            raise ValueError(
                f"contract features {origin[target]!r} and {name!r} both map to LeRobot feature "
                f"{target!r}; rename one of them in the sim (or in a saved contract.json)"
            )
        origin[target] = name
        image = feat.type == "rgb"
        if image:
            height, width = int(feat.shape[0]), int(feat.shape[1])
            # LeRobot's AV1 encoder (libsvtav1) kills the process (SIGFPE) below 32 pixels a side
            video = use_videos and min(height, width) >= MIN_VIDEO_SIDE
            features[target] = {"dtype": "video" if video else "image", "shape": (height, width, 3),
                                "names": ["height", "width", "channels"]}
        else:
            shape = tuple(int(d) for d in feat.shape) or (1,)
            features[target] = {"dtype": str(np.dtype(feat.dtype)), "shape": shape,
                                "names": _names(feat.names, shape)}
        observations.append((name, target, image))
    action = contract.action
    action_shape = tuple(int(d) for d in action.shape) or (1,)
    action_dtype = str(np.dtype(action.dtype))
    features["action"] = {"dtype": action_dtype, "shape": action_shape,
                          "names": _names(action.names, action_shape)}
    features["next.reward"] = {"dtype": "float32", "shape": (1,), "names": None}
    features["next.done"] = {"dtype": "bool", "shape": (1,), "names": None}
    features["next.success"] = {"dtype": "bool", "shape": (1,), "names": None}
    rate = _as_fps(fps if fps else contract.control_rate)
    digest = hashlib.sha1(
        json.dumps({"features": features, "fps": rate}, sort_keys=True, default=list).encode()
    ).hexdigest()[:8]
    short = "_".join(sorted(t[len("observation."):] for _, t, _ in observations)) or "noobs"
    name = f"{_UNSAFE.sub('_', short)[:60]}-{digest}"
    return _Layout(name, rate, features, tuple(observations), action_dtype, action_shape)


def _rgb(image: Any) -> np.ndarray:
    arr = np.asarray(image)
    if arr.ndim == 3 and arr.shape[-1] == 1:
        arr = np.repeat(arr, 3, axis=-1)
    elif arr.ndim == 3 and arr.shape[-1] == 4:
        arr = arr[:, :, :3]
    return np.ascontiguousarray(arr, dtype=np.uint8)


def _scalar(value: Any, default: float) -> float:
    if value is None:
        return default
    return float(np.asarray(value, dtype=np.float64).reshape(-1)[0])


# --------------------------------------------------------------------------------------- recorder
class DatasetRecorder:
    """A :class:`~pytest_hud.agent.loop.StepObserver` that records episodes into a LeRobot dataset.

    ``root``: the recording's folder (this recorder writes only below ``root/parts/<worker_id>/``).
    ``repo_id``: the dataset's name (a local name; nothing touches the hub). ``fps``: default the
    contract's ``control_rate``, else 10. ``use_videos``: store cameras as LeRobot ``video`` features
    (AV1 MP4s encoded with PyAV; *reading* them back needs system ffmpeg) instead of PNG ``image``
    features; cameras under 32 pixels a side stay images (LeRobot's AV1 encoder crashes on them).
    ``worker_id``: names this recorder's part (the xdist worker id, ``"main"`` without).

    One episode at a time (as for every step observer). Call :meth:`label_next` before an episode
    (the task id is the dataset's ``task`` when the episode has no prompt), :meth:`close` when the
    worker is done. An episode that cannot be recorded never fails the run: the reason goes to
    :attr:`errors` as ``(label, message)`` and is raised as a :class:`RecordingWarning`.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        repo_id: str = DEFAULT_REPO_ID,
        fps: float | None = None,
        use_videos: bool = False,
        *,
        worker_id: str = "main",
    ) -> None:
        require_lerobot()
        if fps is not None:
            _as_fps(fps)  # refuse a bad rate now, not at the first episode
        self.root = Path(root).resolve()
        self.repo_id = repo_id
        self.fps = fps
        self.use_videos = bool(use_videos)
        self.worker_id = _UNSAFE.sub("_", str(worker_id)).strip("._") or "main"
        self.episodes = 0  # committed
        self.frames = 0
        self.dropped = 0  # errored episodes, not recorded
        self.errors: list[tuple[str, str]] = []
        self.last_artefacts: dict[str, str] = {}
        self.part_dir: Path | None = None  # claimed at the first recorded episode
        self._labels = ArtefactNames()
        self._layouts: dict[str, _Layout] = {}
        self._datasets: dict[str, Any] = {}  # layout name -> LeRobotDataset
        self._closed = False
        self._reset()

    # --------------------------------------------------------------- naming
    def label_next(self, task: str, episode: str) -> None:
        """Label the next episode (its dataset ``task`` when it has no prompt, and its index entry)."""
        self._labels.set_next(task, episode)

    # ------------------------------------------------------------- observer
    def _reset(self) -> None:
        self._episode: Any = None
        self._names: list[str] = []
        self._last: dict[str, Any] = {}
        self._steps: list[tuple[dict[str, Any], np.ndarray, float, bool, bool]] = []

    def _keep(self, observation: Mapping[str, Any]) -> dict[str, Any]:
        kept = {}
        for name in self._names:
            value = observation.get(name)
            if value is not None and getattr(value, "flags", None) is not None and value.flags.writeable:
                value = value.copy()  # a local sim may reuse its buffer; wire arrays are read-only
            kept[name] = value
        return kept

    def on_start(self, episode: Any, observation: Mapping[str, Any]) -> None:
        """Start buffering ``episode`` (nothing is written before :meth:`on_end`)."""
        self._reset()
        contract = getattr(episode, "contract", None)
        if not isinstance(contract, Contract):
            return  # no contract: no features to record by
        self._episode = episode
        self._names = [n for n in contract.observation_features if n not in RESERVED_KEYS]
        self._last = self._keep(observation)

    def on_step(self, action: np.ndarray, observation: Mapping[str, Any], inference_s: float) -> None:
        """Buffer one frame: the observation before ``action``, the action, and what came back."""
        if self._episode is None:
            return
        self._steps.append((
            self._last,
            np.array(action, copy=True),
            _scalar(observation.get("reward"), math.nan),
            bool(observation.get("terminated", False)) or bool(observation.get("truncated", False)),
            bool(observation.get("success", False)),
        ))
        self._last = self._keep(observation)

    def on_end(self, episode: Any, result: Any, error: str | None) -> None:
        """Commit the whole episode to this worker's part, or drop it if it errored."""
        buffered, steps = self._episode, self._steps
        self._reset()
        self.last_artefacts = {}
        task, label, _ = self._labels.take(episode)
        if buffered is None:
            return
        if error is not None or result is None or getattr(result, "error", None):
            self.dropped += 1
            return
        if not steps:
            return  # ended at reset: no (observation, action) pair to record
        try:
            if self._closed:
                raise RuntimeError("the recorder is closed")
            self._commit(buffered, steps, task, label, result)
        except Exception as exc:  # a recording problem must not fail the episode
            message = f"{type(exc).__name__}: {exc}"
            self.errors.append((f"{task}[{label}]", message))
            warnings.warn(RecordingWarning(f"episode {task}[{label}] was not recorded: {message}"),
                          stacklevel=2)
            return
        self.last_artefacts = {"dataset": str(self.root)}
        if isinstance(getattr(result, "artefacts", None), dict):
            result.artefacts["dataset"] = str(self.root)

    # ---------------------------------------------------------------- commit
    def _layout_for(self, contract: Contract) -> _Layout:
        key = contract.canonical()
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layouts[key] = _layout(contract, self.use_videos, self.fps)
        return layout

    def _frames(self, layout: _Layout, contract: Contract, steps: list, task: str) -> list[dict[str, Any]]:
        frames = []
        for t, (observation, action, reward, done, success) in enumerate(steps):
            frame: dict[str, Any] = {}
            for name, target, image in layout.observations:
                value = observation.get(name)
                if value is None:
                    raise ValueError(f"step {t}: the observation has no {name!r} feature")
                spec = layout.features[target]
                if image:
                    frame[target] = _rgb(value)
                else:
                    frame[target] = np.asarray(value, dtype=spec["dtype"]).reshape(spec["shape"])
            executed = np.asarray(contract.coerce_action(action))  # what the env was given
            frame["action"] = executed.astype(layout.action_dtype).reshape(layout.action_shape)
            frame["next.reward"] = np.array([reward], dtype=np.float32)
            frame["next.done"] = np.array([done], dtype=bool)
            frame["next.success"] = np.array([success], dtype=bool)
            frame["task"] = task
            frames.append(frame)
        return frames

    def _claim_part_dir(self) -> Path:
        if self.part_dir is None:
            parent = self.root / PARTS_DIR
            parent.mkdir(parents=True, exist_ok=True)
            n = 1
            while True:  # a folder left by a crashed worker of the same id is not ours to append to
                candidate = parent / (self.worker_id if n == 1 else f"{self.worker_id}.{n}")
                try:
                    candidate.mkdir()
                except FileExistsError:
                    n += 1
                    continue
                self.part_dir = candidate
                break
        return self.part_dir

    def _dataset(self, layout: _Layout) -> Any:
        dataset = self._datasets.get(layout.name)
        if dataset is None:
            from lerobot.datasets.lerobot_dataset import LeRobotDataset

            dataset = LeRobotDataset.create(
                repo_id=self.repo_id,
                fps=layout.fps,
                features={key: dict(spec) for key, spec in layout.features.items()},
                root=self._claim_part_dir() / layout.name,
                use_videos=self.use_videos,
            )
            self._datasets[layout.name] = dataset
        return dataset

    def _commit(self, episode: Any, steps: list, task: str, label: str, result: Any) -> None:
        contract: Contract = episode.contract
        layout = self._layout_for(contract)
        prompt = getattr(episode, "prompt", None) or task
        frames = self._frames(layout, contract, steps, prompt)  # every conversion before LeRobot sees any
        dataset = self._dataset(layout)
        with quiet_lerobot():
            try:
                for frame in frames:
                    dataset.add_frame(frame)
                dataset.save_episode()
            except BaseException:
                dataset.clear_episode_buffer()  # nothing of a half-added episode stays
                raise
        entry = {
            "task": task, "episode": label, "prompt": getattr(episode, "prompt", None),
            "seed": getattr(episode, "seed", None), "success": bool(getattr(result, "success", False)),
            "score": float(getattr(result, "score", 0.0) or 0.0), "frames": len(frames),
            "worker": self.worker_id,
        }
        with open(Path(dataset.root) / PART_EPISODES_FILE, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry, default=str) + "\n")
        self.episodes += 1
        self.frames += len(frames)

    # ------------------------------------------------------------- lifecycle
    def flush(self, timeout: float | None = None) -> bool:
        """Always True: each episode is committed to the part inside :meth:`on_end`.

        The part becomes readable (by LeRobot or :func:`merge_parts`) once :meth:`close` returns.
        """
        return True

    def close(self, timeout: float | None = None) -> bool:
        """Finalize this worker's part (closes LeRobot's parquet writers). Idempotent; True when done."""
        self._closed = True
        datasets, self._datasets = self._datasets, {}
        done = True
        for name, dataset in datasets.items():
            try:
                dataset.finalize()
            except Exception as exc:
                done = False
                self.errors.append((name, f"finalize failed: {type(exc).__name__}: {exc}"))
        return done

