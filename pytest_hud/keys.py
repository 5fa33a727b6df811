"""The plugin's stash keys, and the lookup of this process's worker session.

Kept apart from :mod:`pytest_hud.session` so that the plugin module, which pytest imports in every
process where pytest-hud is installed, reaches them without importing numpy, websockets or the
client: a run that never uses pytest-hud pays only for its options.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from .controller import HudController  # noqa: F401 - named in a string annotation
    from .session import HudSession

__all__ = ["CONTROLLER_KEY", "EPISODES_KEY", "SESSION_KEY", "worker_session"]

EPISODES_KEY = pytest.StashKey[list]()
SESSION_KEY = pytest.StashKey["HudSession"]()
CONTROLLER_KEY = pytest.StashKey["HudController"]()


def worker_session(config: pytest.Config) -> HudSession | None:
    """The :class:`~pytest_hud.session.HudSession` of this process (None on an xdist controller or
    when inactive)."""
    return config.stash.get(SESSION_KEY, None)
