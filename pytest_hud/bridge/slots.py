"""What one bridge slot is: its state, its claim, its episode's tallies and its grade.

A record with the one change every rule shares (:meth:`Slot.end`); the rules about how slots
change live in :mod:`.engine`, :mod:`.ticks` and :mod:`.faults`. Life of a slot::

    FREE --claim(token)--> CLAIMED --agent binds, slot reset--> LIVE --terminated--> DONE
      ^                       |                                   |                  |
      +---- release / result / owner connection closed -----------+------------------+

A CLAIMED slot is never stepped on its episode's behalf: it is reset (with the claim's seed) only
when its agent binds, so whatever hold-steps happened before cannot leak into the episode.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from pytest_hud.bridge.exceptions import SlotFailure
from pytest_hud.core.results import EpisodeResult

__all__ = ["Slot", "SlotState"]


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
    #: the actions after ``pending_action`` of a frame of several (``{"actions": [T, ...], "steps": T}``),
    #: each taken as the slot's next action once the step before it is delivered, with its
    #: ``skip_render``: ``(action, skip_render)`` pairs
    queued: deque = field(default_factory=deque)
    acted_at: float = 0.0  # when pending_action arrived: opens ready mode's tick window
    skip_render: bool = False  # its agent will not read the images its pending action brings
    last_action: Any = None  # kept across episodes: the "repeat" hold for a free slot
    needs_park_reset: bool = False  # finished sub-env must be reset before the next step
    last_task: str | None = None  # the task of its latest claim (multi-task sims): kept across episodes
    first_obs: dict[str, np.ndarray] | None = None
    deadline: float | None = None  # when a LIVE slot waiting for its agent's action is late
    awaiting: str = "first action"
    # kept across episodes: faults of its env (sims that isolate slots) and why it is out of service
    faults: int = 0
    service: str | None = None  # None: in service; "rebuild": its env raised; "retired: ...": for good

    def clear_episode(self) -> None:
        self.task, self.seed, self.options, self.prompt = {}, None, None, None
        self.steps, self.total_reward, self.score = 0, 0.0, None
        self.success = self.success_at_reset = self.terminated = self.truncated = False
        self.error, self.failure, self.pending_action, self.connected = None, None, None, False
        self.queued.clear()
        self.deadline, self.awaiting = None, "first action"

    def acts_again(self, token: str | None) -> bool:
        """Whether it can take its next queued action now: still ``token``'s LIVE episode, with an
        action queued and none pending."""
        return (bool(self.queued) and self.token == token and self.state is SlotState.LIVE
                and self.pending_action is None)

    def act_from_queue(self, now: float) -> None:
        """Take the next of its queued actions as the pending one, which arrived ``now``."""
        self.pending_action, self.skip_render = self.queued.popleft()
        self.acted_at, self.deadline = now, None

    def took_step(self, reward: float, success: bool, score: float | None, ended: bool, terminated: bool,
                  truncated: bool) -> None:
        """Tally one env-step of its episode: the return, success latched (a later step cannot take it
        back), the sim's score (NaN: none given), and on ``ended`` the episode DONE."""
        self.steps += 1
        self.total_reward += reward
        if success:
            self.success = True
        if score is not None and not math.isnan(score):
            self.score = score
        if ended:
            self.terminated, self.truncated = terminated, truncated
            self.state, self.deadline = SlotState.DONE, None
            self.queued.clear()

    def end(self, error: str | None, failure: SlotFailure | None = None) -> None:
        """The episode is over (DONE, if it was CLAIMED or LIVE): ``error`` (None: an agent that
        stopped cleanly) and ``failure`` are kept if it has none yet; nothing more is awaited."""
        if self.state is SlotState.LIVE or self.state is SlotState.CLAIMED:
            self.state = SlotState.DONE
        if error and not self.error:
            self.error = error
            if self.failure is None:
                self.failure = failure
        self.pending_action = self.deadline = None
        self.queued.clear()

    def result(self) -> EpisodeResult:
        """The episode's grade (what ``result(token)`` returns, as :meth:`EpisodeResult.to_dict`)."""
        score = self.score if self.score is not None else (1.0 if self.success else 0.0)
        return EpisodeResult(
            success=bool(self.success),
            score=float(min(1.0, max(0.0, score))),
            total_reward=float(self.total_reward),
            steps=int(self.steps),
            slot=self.index,
            seed=self.seed,
            prompt=self.prompt,
            success_at_reset=bool(self.success_at_reset),
            terminated=bool(self.terminated),
            truncated=bool(self.truncated),
            error=self.error,
        )
