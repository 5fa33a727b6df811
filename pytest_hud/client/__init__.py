"""Talking to a bridge: the control and slot clients, and one episode on a claimed slot.

Used by workers, by the agent loop, by the controller's pool (stats) and by plain scripts::

    from pytest_hud.client import BridgeAddress, ControlClient, Episode, SlotClient
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (for type checkers and the API docs; at run time each name comes on first use)
    from .address import BridgeAddress, BridgeError
    from .bridge import AsyncControlClient, AsyncSlotClient, ControlClient, SlotClient
    from .episode import Episode, EpisodeError, EpisodeResult

_WHERE = {"AsyncControlClient": "bridge", "AsyncSlotClient": "bridge", "BridgeAddress": "address",
          "BridgeError": "address", "ControlClient": "bridge", "Episode": "episode",
          "EpisodeError": "episode", "EpisodeResult": "episode", "SlotClient": "bridge"}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    """Each name from its module on first use: a worker that steps its sim itself, and the
    controller, import no WebSocket stack for the address of a bridge."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
