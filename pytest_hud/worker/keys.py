"""The plugin's stash keys, and the lookup of this process's worker session.

Kept apart from :mod:`pytest_hud.worker.session` so that the plugin module, which pytest imports in every
process where pytest-hud is installed, reaches them without importing numpy, websockets or the
client: a run that never uses pytest-hud pays only for its options.
"""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["EPISODES_KEY", "SESSION_KEY", "worker_session"]

EPISODES_KEY = pytest.StashKey[list]()
#: This process's :class:`~pytest_hud.worker.session.HudSession` (typed loosely: naming the class here
#: would import the session module, which imports this one).
SESSION_KEY = pytest.StashKey[Any]()


def worker_session(config: pytest.Config) -> Any:
    """The :class:`~pytest_hud.worker.session.HudSession` of this process (None on an xdist controller or
    when inactive)."""
    return config.stash.get(SESSION_KEY, None)
