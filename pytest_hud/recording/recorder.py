"""The recorders' side of an episode: the :class:`Recorder` protocol, and safe, unique file names.

A recorder (videos, traces, LeRobot dataset parts) sees every tick of an episode as a
:class:`~pytest_hud.agent.loop.StepObserver`, is told the next episode's label by the plugin, and
hands back the artefact paths of the episode it finished. :func:`pytest_hud.recording.from_settings.open_recorders` builds a worker's
recorders from the run's settings. Every artefact file name goes through :func:`safe_name` or
:func:`episode_file_stem`: one rule for what is safe in a file name.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = ["ArtefactNames", "Recorder", "RecorderBase", "episode_file_stem", "safe_name"]

_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]+")


@runtime_checkable
class Recorder(Protocol):
    """What the worker's session calls on each recorder."""

    last_artefacts: dict[str, str]

    def label_next(self, task: str, episode: str) -> None: ...
    def on_start(self, episode: Any, observation: Mapping[str, Any]) -> None: ...
    def on_step(self, action: np.ndarray, observation: Mapping[str, Any], inference_s: float) -> None: ...
    def on_end(self, episode: Any, result: Any, error: str | None) -> None: ...
    def flush(self, timeout: float | None = None) -> bool: ...
    def close(self, timeout: float | None = None) -> bool: ...


class RecorderBase:
    """Defaults for recorders that write synchronously: nothing pending to flush or close."""

    last_artefacts: dict[str, str] = {}

    def flush(self, timeout: float | None = None) -> bool:
        return True

    def close(self, timeout: float | None = None) -> bool:
        return True


def safe_name(name: str, fallback: str = "file") -> str:
    """``name`` with every run of characters unsafe in file names (on any OS) replaced by ``_``."""
    return _UNSAFE.sub("_", str(name)).strip("._") or fallback


def episode_file_stem(task: str, episode: str, limit: int = 150) -> str:
    """A file-system-safe stem ``<task>__<episode>`` for an episode's artefacts.

    The test file's directories are dropped (the artefact directory already groups a run) and every
    run of characters that is unsafe in file names on any OS becomes ``_``; long ids keep their end.

        >>> episode_file_stem("evals/test_cartpole.py::test_balance[policy-a]", "7")
        'test_cartpole.py__test_balance_policy-a___7'
    """
    path, sep, rest = task.partition("::")
    short = path.rsplit("/", 1)[-1] + sep + rest if sep else task
    stem = safe_name(short.replace("::", "__") + "__" + safe_name(str(episode), ""), "episode")
    return stem[-limit:]


def _fallback_label(episode: Any) -> tuple[str, str]:
    """A label for episodes run outside the plugin (no ``label_next``): ``episode`` and the seed."""
    seed = getattr(episode, "seed", None)
    return "episode", f"seed{seed}" if seed is not None else "noseed"


class ArtefactNames:
    """Unique artefact stems per recorder: the plugin's label for the next episode, else a fallback.

    A rerun of the same episode in one process gets a ``-2`` suffix rather than overwriting the first
    file (whose path already rode on a report); a file left by an earlier run is overwritten.
    """

    def __init__(self) -> None:
        self._next: tuple[str, str] | None = None
        self._used: set[str] = set()
        self._lock = threading.Lock()

    def set_next(self, task: str, episode: str) -> None:
        self._next = (str(task), str(episode))

    def next_task(self, episode: Any) -> str:
        """The task the next episode's files will be named after (the label's, else the fallback's)."""
        return (self._next or _fallback_label(episode))[0]

    def take(self, episode: Any) -> tuple[str, str, str]:
        with self._lock:
            task, ep = self._next or _fallback_label(episode)
            self._next = None
            base = episode_file_stem(task, ep)
            stem, n = base, 1
            while stem in self._used:
                n += 1
                stem = f"{base}-{n}"
            self._used.add(stem)
            return task, ep, stem
