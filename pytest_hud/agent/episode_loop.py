"""The agent loop's decisions for one episode, without I/O: which action goes next, and when to stop.

:class:`EpisodeLoop` is fed observation frames and answers with the next action, or None when the
episode is over for the agent (the env terminated, ``max_steps`` was reached, or ``should_stop``
said so). The blocking and asyncio shells in :mod:`.loop` only carry its actions to the bridge and
its frames back::

    loop = EpisodeLoop(model, contract, prompt=None, max_steps=200)
    action = loop.begin(first_frame)
    while action is not None:
        action = loop.observe(slot.step(action))
    loop.steps, loop.inference_s

Open-loop action chunks: the model returns ``[T, A]``; the loop executes up to ``n_action_steps``
of them before asking again (``[A]`` is a chunk of one).
"""

from __future__ import annotations

import _signal
import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..contract import RESERVED_KEYS, Contract
from ..episode import EpisodeError

if TYPE_CHECKING:
    from ..episode import Episode, EpisodeResult

__all__ = ["EpisodeLoop", "StepObserver", "features", "as_chunk"]


class StepObserver(Protocol):
    """Sees every tick of an episode (video and trace recorders implement this)."""

    def on_start(self, episode: Episode, observation: Mapping[str, Any]) -> None: ...
    def on_step(self, action: np.ndarray, observation: Mapping[str, Any], inference_s: float) -> None: ...
    def on_end(self, episode: Episode, result: EpisodeResult | None, error: str | None) -> None: ...


def features(frame: Mapping[str, Any]) -> dict[str, Any]:
    """The model's view of an observation frame: contract features only."""
    return {k: v for k, v in frame.items() if k not in RESERVED_KEYS}


def as_chunk(output: Any, contract: Contract) -> np.ndarray:
    """Normalise a model's output to ``[T, *action_shape]``."""
    arr = np.asarray(output)
    rank = len(contract.action.shape)
    if arr.ndim <= rank:
        if contract.action.type == "discrete" and arr.size == 1:
            return arr.reshape(1, 1)
        return arr.reshape((1,) + tuple(contract.action.shape)) if arr.size == contract.action_dim else arr[None]
    return arr


class EpisodeLoop:
    """One episode's state: the open-loop chunk queue, the step count and the time spent planning.

    - ``max_steps``: no action after this many steps (None: no limit).
    - ``n_action_steps``: execute at most this many actions of each chunk before re-planning.
    - ``should_stop(features, step) -> bool``: stop early (e.g. a task-specific success check).
    - ``first_action_timeout`` / ``step_timeout``: the bridge's limits; a ``predict`` that outlives
      one by a margin is interrupted (see :func:`watchdog`).

    ``observers`` see the first frame and every step; their ``on_end`` belongs to the shell, which
    alone knows how the episode ended.
    """

    def __init__(
        self,
        model: Any,
        contract: Contract,
        *,
        prompt: str | None = None,
        max_steps: int | None = None,
        n_action_steps: int | None = None,
        should_stop: Callable[[Mapping[str, Any], int], bool] | None = None,
        first_action_timeout: float | None = None,
        step_timeout: float | None = None,
        observers: list[StepObserver] | None = None,
        episode: Episode | None = None,
    ) -> None:
        self.model = model
        self.contract = contract
        self.prompt = prompt
        self.limit = max_steps if max_steps is not None else 10**9
        self.n_action_steps = n_action_steps
        self.should_stop = should_stop
        self.first_action_timeout = first_action_timeout
        self.step_timeout = step_timeout
        self.observers = list(observers or [])
        self.episode = episode  # only handed to observers
        self.queue: deque[np.ndarray] = deque()
        self.steps = 0
        self.inference_s = 0.0
        self._action: np.ndarray | None = None
        self._spent = 0.0  # planning time charged to the action in flight

    def begin(self, frame: Mapping[str, Any]) -> np.ndarray | None:
        """The episode's first observation; returns the first action (None: nothing to do)."""
        for obs in self.observers:
            obs.on_start(self.episode, frame)
        return self._next(frame)

    def observe(self, frame: Mapping[str, Any]) -> np.ndarray | None:
        """The observation that answered the last action; returns the next action, or None."""
        if self._action is None:
            raise RuntimeError("observe() before begin() returned an action")
        self.steps += 1
        for obs in self.observers:
            obs.on_step(self._action, frame, self._spent)
        return self._next(frame)

    def _next(self, frame: Mapping[str, Any]) -> np.ndarray | None:
        self._action = None
        if frame["terminated"] or self.steps >= self.limit:
            return None
        if self.should_stop is not None and self.should_stop(features(frame), self.steps):
            return None
        self._spent = self._plan(frame) if not self.queue else 0.0
        self.inference_s += self._spent
        self._action = self.queue.popleft()
        return self._action

    def _plan(self, frame: Mapping[str, Any]) -> float:
        """Ask the model for a chunk and queue it; returns the seconds the model took."""
        first = self.steps == 0
        t0 = time.perf_counter()
        limit = self.first_action_timeout if first else self.step_timeout
        # The bridge fails a silent slot at its timeout; the watchdog then frees this process from
        # a predict() that never returns (a little later, so the bridge's verdict comes first).
        with watchdog(None if limit is None else limit + 5.0,
                      "--hud-first-action-timeout" if first else "--hud-step-timeout"):
            output = self.model.predict(features(frame), self.prompt)
        chunk = as_chunk(output, self.contract)
        spent = time.perf_counter() - t0
        if self.n_action_steps is not None:
            chunk = chunk[: self.n_action_steps]
        if len(chunk) == 0:
            raise EpisodeError("the model returned an empty action chunk")
        self.queue.extend(chunk)
        return spent


@contextlib.contextmanager
def watchdog(seconds: float | None, option: str) -> Iterator[None]:
    """Interrupt a model call that outlives ``seconds`` (main thread, SIGALRM not in use).

    ``_signal`` rather than ``signal``: the latter wraps every call in enum conversions that cost
    more than the system calls themselves, and this runs once per planned step.
    """
    usable = (
        seconds is not None
        and threading.current_thread() is threading.main_thread()
        and _signal.getsignal(_signal.SIGALRM) in (_signal.SIG_DFL, None)  # pytest-timeout owns it otherwise
    )
    if not usable:
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        raise EpisodeError(f"the policy did not answer within {seconds:g} s ({option} plus a margin)")

    _signal.signal(_signal.SIGALRM, expired)
    _signal.setitimer(_signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        _signal.setitimer(_signal.ITIMER_REAL, 0)
        _signal.signal(_signal.SIGALRM, _signal.SIG_DFL)
