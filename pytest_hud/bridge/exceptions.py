"""How a bridge refuses a claim or ends an episode: one exception class per kind of failure.

Raised and returned by :mod:`.engine`. ``str(failure)`` is the readable message the agent gets as
a text frame; :mod:`.closing` picks the WebSocket close code from the class (a sim fault is 1011,
anything the agent did or failed to do is 1008), never from the message's wording.
"""

from __future__ import annotations

__all__ = [
    "ActionTimeout",
    "BadAction",
    "BadClaim",
    "BridgeBroken",
    "ClaimTimeout",
    "EpisodeOver",
    "NoFirstObservation",
    "SimFailed",
    "SlotError",
    "SlotFailure",
    "SlotReleased",
    "TaskError",
]



class SlotError(LookupError):
    """A claim, token or slot operation the bridge refuses (the message says why)."""


class TaskError(ValueError):
    """``claim(**task)`` arguments this bridge cannot serve (the message names the fix)."""


class SlotFailure(Exception):
    """The bridge ends a handshake or an episode; ``str(self)`` is sent to the agent."""


class BadClaim(SlotFailure):
    """The claim frame is malformed, or names a token that cannot be bound."""


class BadAction(SlotFailure):
    """An action frame that is not an ``{'actions': array}`` fitting the contract."""


class ClaimTimeout(SlotFailure):
    """No claim frame within ``Timeouts.claim``."""


class ActionTimeout(SlotFailure):
    """No first action within ``Timeouts.first_action``, or no next action within ``Timeouts.step``."""


class BridgeBroken(SlotFailure):
    """The bridge is broken (its sim raised before); no new episode can start here."""


class SimFailed(SlotFailure):
    """The sim raised during a reset or a step (the traceback is in the message)."""


class SlotReleased(SlotFailure):
    """The slot was graded, released or its owner's control connection closed mid-step."""


class EpisodeOver(SlotFailure):
    """A frame arrived after the episode ended."""


class NoFirstObservation(SlotFailure):
    """The slot was bound but its reset produced no observation (a wave it missed)."""
