"""Per-episode traces: what happened at every tick, one ``.npz`` file per episode.

    recorder = TraceRecorder("traces/")
    agent = Agent(model, observers=[recorder])
    recorder.label_next("evals/test_cartpole.py::test_balance", "7")   # the plugin does this per test
    agent.run(shared_sim.episode(seed=7))
    trace = np.load("traces/test_cartpole.py__test_balance__7.npz")   # or load_trace(path)

File format ``pytest-hud/trace/1``: a NumPy ``.npz`` (uncompressed zip of ``.npy`` arrays), no
pickles, so ``np.load(path)`` reads it with the default ``allow_pickle=False``. One row per tick, ``T``
rows for an episode of ``T`` steps; row ``t`` pairs what the policy saw with what it did and what
came back (the LeRobot dataset convention):

==================  ===========  ======================================================================
key                 shape        meaning
==================  ===========  ======================================================================
``step``            [T] int64    tick index 0..T-1
``action``          [T, *A]      the action sent at tick t (the contract's action shape and dtype)
``obs/<feature>``   [T, *S]      each non-image observation feature the policy saw before acting
``final/<feature>`` [*S]         the same features after the last action
``reward``          [T] float64  reward returned for the tick (NaN when the sim sends none)
``terminated``      [T] bool     the episode ended at this tick
``truncated``       [T] bool     the env truncated at this tick (False when the sim sends none)
``success``         [T] bool     the sim's success flag after this tick (False when it sends none)
``inference_s``     [T] float64  seconds the policy spent planning before this action (0 for actions
                                 taken from an already predicted chunk)
``wall_s``          [T] float64  seconds since the episode's first observation when this tick's
                                 observation arrived
``meta``            [] str       JSON: format, task, episode, seed, steps, success, error, features
==================  ===========  ======================================================================

Camera images are left out (that is what the videos are for); ``<feature>`` is the contract's
feature name, which may itself contain ``/``. For pandas, the one-dimensional arrays are columns:
``pd.DataFrame({k: v for k, v in np.load(p).items() if v.ndim == 1})``.

The file is written at the end of the episode (``on_end``), for failed, errored and successful
episodes alike, to a temporary name first and then renamed, so a file that exists is complete.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from pytest_hud.recording.recorder import ArtefactNames, RecorderBase, episode_file_stem

__all__ = ["TRACE_FORMAT", "ArtefactNames", "TraceRecorder", "episode_file_stem", "load_trace"]

TRACE_FORMAT = "pytest-hud/trace/1"


class TraceRecorder(RecorderBase):
    """A :class:`~pytest_hud.agent.loop.StepObserver` that writes one ``.npz`` trace per episode.

    One episode at a time per recorder (the observer protocol does not say which episode a step
    belongs to); a worker runs one episode at a time. Call :meth:`label_next` before an episode to
    name its file after the task and episode id; without it the file is ``episode__seed<N>.npz``.
    ``last_path`` is the most recent file; ``result.artefacts["trace"]`` gets it too.
    """

    #: Traces leave camera images out, so an episode traced still skips the renders its policy
    #: does not read (:mod:`pytest_hud.sim.renders`); every feature a trace keeps is fresh each step.
    reads_images = False

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory).resolve()
        self.last_path: str | None = None
        self._labels = ArtefactNames()
        self._reset()

    # --------------------------------------------------------------- naming
    def label_next(self, task: str, episode: str) -> None:
        """Name the next episode's file ``<safe task>__<episode>.npz``."""
        self._labels.set_next(task, episode)

    # ------------------------------------------------------------- observer
    def _reset(self) -> None:
        self._episode: Any = None
        self._features: list[str] = []
        self._last_obs: dict[str, np.ndarray] = {}
        self._rows: dict[str, list[Any]] = {}
        self._actions: list[np.ndarray] = []
        self._t0 = 0.0

    def _state(self, observation: Mapping[str, Any]) -> dict[str, np.ndarray]:
        return {name: np.array(observation[name]) for name in self._features if name in observation}

    def on_start(self, episode: Any, observation: Mapping[str, Any]) -> None:
        """Remember the first observation; the first row pairs it with the first action."""
        self._reset()
        self._episode = episode
        contract = getattr(episode, "contract", None)
        cameras = set(getattr(contract, "cameras", []) or [])
        if contract is not None:
            self._features = [n for n in contract.observation_features if n not in cameras]
        else:  # no contract: every non-reserved, non-image array
            self._features = [k for k, v in observation.items()
                              if k not in ("reward", "terminated", "truncated", "success", "error")
                              and np.ndim(v) < 3]
        self._last_obs = self._state(observation)
        scalars = ("reward", "terminated", "truncated", "success", "inference_s", "wall_s")
        self._rows = {k: [] for k in scalars}
        self._rows.update({f"obs/{n}": [] for n in self._features})
        self._t0 = time.perf_counter()

    def on_step(self, action: np.ndarray, observation: Mapping[str, Any], inference_s: float) -> None:
        """Append one row: the observation before ``action``, the action, and what came back."""
        if self._episode is None:
            return  # on_start never came: nothing consistent to record
        now = time.perf_counter() - self._t0
        for name in self._features:
            if name in self._last_obs:
                self._rows[f"obs/{name}"].append(self._last_obs[name])
        self._actions.append(np.array(action))
        reward = observation.get("reward")
        # NaN, not 0, when the sim sends no reward: "unknown" must not read as "nothing earned"
        self._rows["reward"].append(np.nan if reward is None else float(np.asarray(reward).reshape(-1)[0]))
        self._rows["terminated"].append(bool(observation.get("terminated", False)))
        self._rows["truncated"].append(bool(observation.get("truncated", False)))
        self._rows["success"].append(bool(observation.get("success", False)))
        self._rows["inference_s"].append(float(inference_s))
        self._rows["wall_s"].append(now)
        self._last_obs = self._state(observation)

    def on_end(self, episode: Any, result: Any, error: str | None) -> None:
        """Write the trace (whatever the outcome) and put its path in ``result.artefacts["trace"]``."""
        if self._episode is None:
            return
        task, ep, stem = self._labels.take(episode)
        steps = len(self._actions)
        arrays: dict[str, np.ndarray] = {"step": np.arange(steps, dtype=np.int64)}
        if self._actions:
            arrays["action"] = np.stack(self._actions)
        else:
            action = getattr(getattr(episode, "contract", None), "action", None)
            shape = tuple(getattr(action, "shape", ()) or ())
            arrays["action"] = np.zeros((0, *shape), dtype=getattr(action, "dtype", "float32") or "float32")
        arrays["reward"] = np.asarray(self._rows["reward"], dtype=np.float64)
        for key in ("terminated", "truncated", "success"):
            arrays[key] = np.asarray(self._rows[key], dtype=bool)
        for key in ("inference_s", "wall_s"):
            arrays[key] = np.asarray(self._rows[key], dtype=np.float64)
        for name in self._features:
            rows = self._rows.get(f"obs/{name}", [])
            if len(rows) == steps and steps:
                try:
                    arrays[f"obs/{name}"] = np.stack(rows)
                except ValueError:
                    pass  # a feature whose shape changed mid-episode cannot be one array; leave it out
            if name in self._last_obs:
                arrays[f"final/{name}"] = self._last_obs[name]
        meta = {
            "format": TRACE_FORMAT,
            "task": task,
            "episode": ep,
            "seed": getattr(episode, "seed", None),
            "steps": steps,
            "success": None if result is None else bool(getattr(result, "success", False)),
            "error": error or (getattr(result, "error", None) if result is not None else None),
            "features": [n for n in self._features if f"obs/{n}" in arrays],
        }
        arrays["meta"] = np.array(json.dumps(meta, default=str))
        path = self.directory / f"{stem}.npz"
        self.directory.mkdir(parents=True, exist_ok=True)
        part = path.with_name(path.name + ".part")
        with open(part, "wb") as fh:  # a file object, so numpy does not append another ".npz"
            np.savez(fh, **arrays)  # type: ignore[arg-type]  # numpy's stub types allow_pickle too
        os.replace(part, path)
        self.last_path = str(path)
        if result is not None and isinstance(getattr(result, "artefacts", None), dict):
            result.artefacts["trace"] = str(path)
        self._reset()


def load_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a trace into a dict of arrays, with ``meta`` decoded from JSON.

        >>> trace = load_trace("traces/test_cartpole.py__test_balance__7.npz")   # doctest: +SKIP
        >>> trace["action"].shape, trace["meta"]["steps"]                        # doctest: +SKIP
        ((500, 1), 500)
    """
    with np.load(path, allow_pickle=False) as data:
        out: dict[str, Any] = {key: data[key] for key in data.files}
    meta = out.get("meta")
    if meta is not None:
        out["meta"] = json.loads(str(meta))
        if out["meta"].get("format") != TRACE_FORMAT:
            raise ValueError(f"{os.fspath(path)} has trace format {out['meta'].get('format')!r}, "
                             f"expected {TRACE_FORMAT!r}")
    return out
