"""Talking to a bridge: the control and slot clients, and one episode on a claimed slot.

Used by workers, by the agent loop, by the controller's pool (stats) and by plain scripts::

    from pytest_hud.client import BridgeAddress, ControlClient, Episode, SlotClient
"""

from .bridge import (AsyncControlClient, AsyncSlotClient, BridgeAddress, BridgeError, ControlClient,
                     SlotClient)
from .episode import Episode, EpisodeError, EpisodeResult

__all__ = ["AsyncControlClient", "AsyncSlotClient", "BridgeAddress", "BridgeError", "ControlClient", "Episode",
           "EpisodeError", "EpisodeResult", "SlotClient"]
