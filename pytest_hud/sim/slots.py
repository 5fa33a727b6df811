"""What one bridge slot is: its state, its claim, its episode's tallies and its grade.

A plain record; every rule about how slots change lives in :mod:`.engine`. Life of a slot::

    FREE --claim(token)--> CLAIMED --agent binds, slot reset--> LIVE --terminated--> DONE
      ^                       |                                   |                  |
      +---- release / result / owner connection closed -----------+------------------+

A CLAIMED slot is never stepped on its episode's behalf: it is reset (with the claim's seed) only
when its agent binds, so whatever hold-steps happened before cannot leak into the episode.
"""

from __future__ import annotations

import enum
import secrets
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .failures import SlotError, SlotFailure

__all__ = ["SlotError", "SlotState", "Slot", "SlotRegistry"]


class SlotState(enum.Enum):
    FREE = "free"
    CLAIMED = "claimed"  # token minted, agent not bound yet
    LIVE = "live"  # agent bound, episode running
    DONE = "done"  # episode over (terminated, truncated or failed); awaiting result/release


@dataclass(eq=False)
class Slot:
    index: int
    state: SlotState = SlotState.FREE
    token: str | None = None
    owner: int | None = None  # control connection id that minted the token
    task: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    options: dict[str, Any] | None = None
    prompt: str | None = None
    # episode tallies
    steps: int = 0
    total_reward: float = 0.0
    success: bool = False
    success_at_reset: bool = False
    score: float | None = None
    terminated: bool = False
    truncated: bool = False
    error: str | None = None
    failure: SlotFailure | None = None  # what ended the episode, for the agent (first one wins)
    # tick bookkeeping
    connected: bool = False
    pending_action: Any = None
    last_action: Any = None  # kept across episodes: the "repeat" hold for a free slot
    needs_park_reset: bool = False  # finished sub-env must be reset before the next step
    first_obs: dict[str, np.ndarray] | None = None
    deadline: float | None = None  # when a LIVE slot waiting for its agent's action is late
    awaiting: str = "first action"

    def clear_episode(self) -> None:
        self.task, self.seed, self.options, self.prompt = {}, None, None, None
        self.steps, self.total_reward, self.score = 0, 0.0, None
        self.success = self.success_at_reset = self.terminated = self.truncated = False
        self.error, self.failure, self.pending_action, self.connected = None, None, None, False
        self.deadline, self.awaiting = None, "first action"

    def result(self) -> dict[str, Any]:
        """The episode's grade as builtin types (what ``result(token)`` returns)."""
        score = self.score if self.score is not None else (1.0 if self.success else 0.0)
        return {
            "slot": self.index,
            "seed": self.seed,
            "success": bool(self.success),
            "success_at_reset": bool(self.success_at_reset),
            "score": float(min(1.0, max(0.0, score))),
            "total_reward": float(self.total_reward),
            "steps": int(self.steps),
            "terminated": bool(self.terminated),
            "truncated": bool(self.truncated),
            "error": self.error,
        }


# The server still uses the registry; it moves to engine.BridgeEngine in the next commit.
class SlotRegistry:
    """Tokens, owners and states of ``width`` slots."""

    def __init__(self, width: int) -> None:
        if width < 1:
            raise ValueError(f"width must be at least 1, got {width}")
        self.slots = [Slot(i) for i in range(width)]
        self._by_token: dict[str, Slot] = {}

    @property
    def width(self) -> int:
        return len(self.slots)

    # ---------------------------------------------------------------- claims
    def free_slots(self) -> list[Slot]:
        return [s for s in self.slots if s.state is SlotState.FREE]

    def claim(self, owner: int, task: dict[str, Any], index: int | None = None) -> Slot:
        """Mint a token for a free slot (the lowest free index unless ``index`` is given)."""
        free = self.free_slots()
        if index is not None:
            free = [s for s in free if s.index == index]
        if not free:
            raise SlotError("no free slot")
        slot = free[0]
        slot.clear_episode()
        slot.state = SlotState.CLAIMED
        slot.token = secrets.token_hex(16)  # 128 bits: unguessable, and short on the wire
        slot.owner = owner
        slot.task = dict(task)
        seed = task.get("seed")
        slot.seed = None if seed is None else int(seed)
        slot.options = task.get("options")
        slot.prompt = task.get("prompt")
        self._by_token[slot.token] = slot
        return slot

    def by_token(self, token: Any) -> Slot:
        if not isinstance(token, str):
            raise SlotError(f"a claim token is a string, got {type(token).__name__}")
        slot = self._by_token.get(token)
        if slot is None:
            raise SlotError(
                "unknown or released token; claim a slot with reset() on the control channel first"
            )
        return slot

    def resolve_claim(self, token: Any) -> Slot:
        """The slot a WebSocket claim frame binds to (``None`` binds the only claimed slot)."""
        if token is None:
            waiting = [s for s in self.slots if s.state is SlotState.CLAIMED and not s.connected]
            if len(waiting) != 1:
                raise SlotError(
                    f"a None claim needs exactly one claimed, undialed slot; there are "
                    f"{len(waiting)}: send the token that reset() returned"
                )
            return waiting[0]
        slot = self.by_token(token)
        if slot.connected or slot.state is not SlotState.CLAIMED:
            raise SlotError(f"token for slot {slot.index} is already in use by another connection")
        return slot

    def release(self, slot: Slot) -> None:
        """Free a slot whatever its state (a finished sub-env is parked by the tick loop)."""
        if slot.token is not None:
            self._by_token.pop(slot.token, None)
        slot.token, slot.owner = None, None
        slot.state = SlotState.FREE
        slot.connected = False
        slot.pending_action = None

    def release_owner(self, owner: int) -> list[Slot]:
        """Free every slot whose token was minted on connection ``owner`` (it closed)."""
        released = [s for s in self.slots if s.owner == owner and s.state is not SlotState.FREE]
        for slot in released:
            self.release(slot)
        return released

    # ----------------------------------------------------------------- ticks
    def live(self) -> list[Slot]:
        return [s for s in self.slots if s.state is SlotState.LIVE]

    def ready_to_step(self) -> bool:
        """Every live slot has sent its action, and at least one slot is live."""
        live = self.live()
        return bool(live) and all(s.pending_action is not None for s in live)

    def snapshot(self) -> list[dict[str, Any]]:
        return [
            {"slot": s.index, "state": s.state.value, "steps": s.steps, "connected": s.connected}
            for s in self.slots
        ]
