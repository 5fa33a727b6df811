"""How the bridge ends a slot WebSocket on a failure: the readable error as a text frame, then the close.

Both halves of the bridge end sockets this way: the control channel's handlers (:mod:`.control`:
a slot released or broken under its agent) and the slot WebSocket path (:mod:`.server`: a bad
frame, a timeout, a failed step), so it is a module of its own that both import. The close code
comes from the failure's class (:mod:`.exceptions`), never from its wording.
"""

from __future__ import annotations

from pytest_hud.bridge.exceptions import SimFailed, SlotFailure
from pytest_hud.bridge.wsserver import WsConnection

__all__ = ["close_code", "close_reason", "fail"]


def close_code(failure: SlotFailure) -> int:
    """The WebSocket close code after ``failure``'s error frame: 1011 for a sim fault, else 1008."""
    return 1011 if isinstance(failure, SimFailed) else 1008


def fail(conn: WsConnection, failure: SlotFailure) -> None:
    """Send a readable error as a text frame, then close (DESIGN §4)."""
    message = str(failure)
    conn.send(message)
    conn.close(close_code(failure), close_reason(message))


def close_reason(message: str) -> str:
    """The start of ``message`` that fits a close frame: 123 bytes of UTF-8, not 123 characters."""
    return message.encode(errors="replace")[:123].decode(errors="ignore")
