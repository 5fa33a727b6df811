"""A LeRobot recording's shared ground: its parts' layout on disk, its warning, LeRobot's presence.

What both halves of a recording rely on, in one place so that neither imports the other: each
worker's :class:`~pytest_hud.recording.dataset.DatasetRecorder` writes its own dataset under
``root/parts/<worker-id>/<group>/`` (with :data:`PART_EPISODES_FILE` beside LeRobot's files, one
line per committed episode), and the controller's
:func:`~pytest_hud.recording.dataset_merge.merge_parts` reads exactly that layout back. Both need
LeRobot only when they run, and both quiet its progress bars, which would otherwise clutter every
episode and the controller's terminal.
"""

from __future__ import annotations

import contextlib
import importlib.util
import warnings
from collections.abc import Iterator

__all__ = [
    "DEFAULT_REPO_ID",
    "INSTALL_HINT",
    "PARTS_DIR",
    "PART_EPISODES_FILE",
    "RecordingWarning",
    "quiet_lerobot",
    "recording_available",
    "require_lerobot",
]

DEFAULT_REPO_ID = "pytest-hud/rollouts"  # a local name: nothing is pushed to or pulled from the hub
PARTS_DIR = "parts"
PART_EPISODES_FILE = "hud-episodes.jsonl"  # one line per committed episode, inside each part
INSTALL_HINT = "pip install 'pytest-hud[lerobot]'"


class RecordingWarning(UserWarning):
    """An episode could not be recorded, or a part could not be merged (the run goes on)."""


def recording_available() -> bool:
    """True when LeRobot's dataset module can be imported (without importing torch)."""
    try:
        return importlib.util.find_spec("lerobot.datasets.lerobot_dataset") is not None
    except (ImportError, ValueError):  # no "lerobot", or a namespace folder of that name
        return False


def require_lerobot() -> None:
    """Raise ``ImportError`` with the install hint unless LeRobot can record (checked up front,
    not at the first episode or the merge)."""
    if not recording_available():
        raise ImportError(f"recording rollouts as a LeRobot dataset needs LeRobot: {INSTALL_HINT}")


@contextlib.contextmanager
def quiet_lerobot() -> Iterator[None]:
    """Hide the per-episode ``datasets`` progress bars and warnings about LeRobot's own conventions."""
    from datasets.utils import logging as datasets_logging

    enabled = datasets_logging.is_progress_bar_enabled()
    if enabled:
        datasets_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Converting input from bool to",
                                    category=RuntimeWarning)
            # datasets encodes LeRobot's [1]-shaped scalars (next.reward, ...) with float(array)
            warnings.filterwarnings("ignore", message="Conversion of an array with ndim > 0",
                                    category=DeprecationWarning)
            yield
    finally:
        if enabled:
            datasets_logging.enable_progress_bar()
