"""What a worker says to a bridge, and how it reads the answers, without I/O.

The blocking and asyncio clients in :mod:`pytest_hud.client.bridge` share everything here, so the wording
of every error a worker can see from a bridge lives in one place:

- control channel: ``claim`` replies become :class:`Claim`; RPC failures become :class:`BridgeError`;
- slot WebSocket (openpi/0): the claim frame, action frames, and reading metadata and observation
  frames (a text frame is the bridge's own error message; anything but a map is refused);
- a slot connection that closes: the bridge's last error frame if one is buffered, else a
  "closed without an error frame" error (a client fails fast, never hangs).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_hud.client.address import BridgeError
from pytest_hud.core.contract import Contract
from pytest_hud.wire.jsonrpc import RpcError
from pytest_hud.wire.codec import (
    FrameLayout, NotAMapError, TextFrameError, WireError, pack_action, packb, unpack_map,
)

if TYPE_CHECKING:  # (only named in annotations: the clients that catch it import websockets)
    from websockets.exceptions import ConnectionClosed

__all__ = [
    "BridgeError",
    "Claim",
    "ObservationReader",
    "action_frame",
    "actions_frame",
    "claim_frame",
    "unrendered_action_frame",
    "closed_error",
    "frames_to_end",
    "control_error",
    "read_claim",
    "read_contract",
    "read_frame",
    "send_error",
]


@dataclass(frozen=True)
class Claim:
    """A claimed slot: its token (for the WebSocket claim frame), index and prompt, and the seed and
    task its episode runs (the bridge draws a seed for a claim that gave none)."""

    token: str
    slot: int
    prompt: str | None = None
    seed: int | None = None
    task: str | None = None


# ------------------------------------------------------------ control channel
def control_error(exc: RpcError) -> BridgeError:
    """The bridge's RPC error as the worker sees it (the bridge's own message, unprefixed)."""
    return BridgeError(exc.message)


def read_claim(reply: Any) -> Claim:
    """``claim``'s reply (``{"token", "slot", "prompt", "seed", "task"}``) as a :class:`Claim`."""
    try:
        seed = reply.get("seed")
        return Claim(reply["token"], int(reply["slot"]), reply.get("prompt"),
                     None if seed is None else int(seed), reply.get("task"))
    except (KeyError, TypeError, ValueError, AttributeError):
        raise BridgeError(
            f"bridge answered reset() with {reply!r}; expected a map with token, slot and prompt"
        ) from None


def read_contract(reply: Any) -> Contract:
    """``contract``'s reply as a :class:`~pytest_hud.core.contract.Contract`."""
    return Contract.from_dict(reply)


# ------------------------------------------------------------ slot WebSocket
def claim_frame(token: str | None) -> bytes:
    """The frame that binds a slot connection to a claim (None: the only claimed slot)."""
    return packb({"claim": token})


#: One action ``[A]`` as the frame the bridge steps with (no wrapper: a slot sends one every step).
action_frame = pack_action

# "render": False after the action: a two-entry map, the action's bytes as pack_action writes them
_NO_RENDER = packb("render") + packb(False)


def unrendered_action_frame(action: Any) -> bytes:
    """:func:`action_frame` plus ``"render": False``: the agent will not read the images of the
    observation this action brings, so the sim may skip rendering them (:mod:`pytest_hud.sim.renders`).

    >>> from pytest_hud.wire.codec import unpackb
    >>> sorted(unpackb(unrendered_action_frame([0.5, 1.0])))
    ['actions', 'render']
    """
    frame = pack_action(action)
    return b"\x82" + frame[1:] + _NO_RENDER


def actions_frame(actions: Any, render: Sequence[bool] | None = None) -> bytes:
    """Several actions (``[T, *action]``) in one frame, which the bridge steps in turn, one
    observation frame back for each (fewer when the episode ends first): what a replay sends, whose
    actions are all known before its first step, and what an agent sends of an action chunk it
    executes open loop. ``render``: per action, whether the images of the observation it brings are
    read (None: all are; ``"render": [...]`` on the wire).

    >>> from pytest_hud.wire.codec import unpackb
    >>> frame = unpackb(actions_frame([[0.5, 1.0], [0.0, 0.5]]))
    >>> frame["steps"], frame["actions"].shape
    (2, (2, 2))
    >>> unpackb(actions_frame([[0.5, 1.0], [0.0, 0.5]], render=[False, True]))["render"]
    [False, True]
    """
    arr = np.asarray(actions)
    frame: dict[str, Any] = {"actions": arr, "steps": len(arr)}
    if render is not None:
        frame["render"] = [bool(r) for r in render]
    return packb(frame)


def frames_to_end(next_frame: Callable[[], dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """The observation frames of a frame of ``count`` actions, each from ``next_frame()``: ``count``
    of them, or fewer when one says the episode is over (no frame follows it)."""
    frames = []
    for _ in range(count):
        frames.append(next_frame())
        if frames[-1]["terminated"]:
            break
    return frames


def read_frame(raw: bytes | str, what: str) -> dict[str, Any]:
    """A metadata or observation frame; ``what`` names it in the error."""
    try:
        return unpack_map(raw)
    except TextFrameError as exc:
        raise BridgeError(exc.text) from None  # the bridge's readable error, as it wrote it
    except NotAMapError as exc:
        raise BridgeError(f"bridge sent a {exc.got} as {what}, expected a map") from None
    except WireError as exc:
        raise BridgeError(f"bridge sent an undecodable {what}: {exc}") from None


class ObservationReader:
    """:func:`read_frame` for one slot's observation frames, step after step: the frames' layout is
    learned from one decoded the usual way, and later frames with that layout are read in place
    (:class:`~pytest_hud.wire.codec.FrameLayout`); any other frame is read the usual way."""

    __slots__ = ("layout", "misses")

    def __init__(self) -> None:
        self.layout: FrameLayout | None = None
        self.misses = 0  # frames that had no layout to learn: after a few, stop trying

    def __call__(self, raw: bytes | str) -> dict[str, Any]:
        layout = self.layout
        if layout is not None:
            frame = layout.read(raw)
            if frame is not None:
                return frame
        frame = read_frame(raw, "observation")
        if self.misses < 8:
            self.layout = FrameLayout.learn(raw, frame)
            self.misses += self.layout is None
        return frame


def closed_error(exc: ConnectionClosed) -> BridgeError:
    """The slot connection closed with no error frame before it."""
    rcvd = exc.rcvd
    detail = f" (code {rcvd.code}: {rcvd.reason})" if rcvd is not None and rcvd.reason else ""
    return BridgeError(f"bridge closed the slot connection without an error frame{detail}")


def send_error(exc: ConnectionClosed, late: bytes | str | None) -> BridgeError:
    """An action could not be sent because the connection closed.

    The bridge fails a slot by sending a text frame and closing, and that may happen just before
    our send: ``late`` is whatever message was still buffered (None if nothing was), and its text
    is the real reason.
    """
    if isinstance(late, str):
        return BridgeError(late)
    return closed_error(exc)
