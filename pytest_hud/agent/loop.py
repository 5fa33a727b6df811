"""The agent loop: drive one claimed slot with a model until the episode ends.

Open-loop action chunks: the model returns ``[T, A]``; the agent executes up to
``n_action_steps`` of them before asking again (``[A]`` is a chunk of one).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import numpy as np

from ..client import AsyncSlotClient, BridgeError, SlotClient
from ..contract import RESERVED_KEYS, Contract
from ..episode import Episode, EpisodeError, EpisodeResult
from .model import as_model

__all__ = ["Agent", "StepObserver"]


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


class Agent:
    """Runs episodes with one model. ``run`` is blocking; ``arun`` is its asyncio twin.

    - ``max_steps``: stop (and grade) after this many steps even if the env has not ended.
    - ``n_action_steps``: execute at most this many actions of each chunk before re-planning.
    - ``should_stop(observation, step) -> bool``: stop early (e.g. a task-specific success check).
    """

    def __init__(
        self,
        model: Any,
        *,
        max_steps: int | None = None,
        n_action_steps: int | None = None,
        should_stop: Callable[[Mapping[str, Any], int], bool] | None = None,
        recv_timeout: float = 360.0,
        observers: list[StepObserver] | None = None,
        first_action_timeout: float | None = None,
        step_timeout: float | None = None,
    ) -> None:
        self.model = as_model(model)
        # The bridge fails a silent slot at these timeouts; the watchdog then frees this process
        # from a predict() that never returns (a little later, so the bridge's verdict comes first).
        self.first_action_timeout = first_action_timeout
        self.step_timeout = step_timeout
        self.max_steps = max_steps
        self.n_action_steps = n_action_steps
        self.should_stop = should_stop
        self.recv_timeout = recv_timeout
        self.observers: list[StepObserver] = list(observers or [])

    # --------------------------------------------------------------- helpers
    def _limits(self, max_steps: int | None) -> int:
        limit = max_steps if max_steps is not None else self.max_steps
        return limit if limit is not None else 10**9

    def _plan(self, frame: Mapping[str, Any], prompt: str | None, contract: Contract,
              queue: deque, first: bool = False) -> float:
        t0 = time.perf_counter()
        limit = self.first_action_timeout if first else self.step_timeout
        with _watchdog(None if limit is None else limit + 5.0,
                       "--hud-first-action-timeout" if first else "--hud-step-timeout"):
            output = self.model.predict(features(frame), prompt)
        chunk = as_chunk(output, contract)
        spent = time.perf_counter() - t0
        if self.n_action_steps is not None:
            chunk = chunk[: self.n_action_steps]
        if len(chunk) == 0:
            raise EpisodeError("the model returned an empty action chunk")
        queue.extend(chunk)
        return spent

    def _start(self, episode: Episode) -> None:
        if episode.token is None:
            raise EpisodeError(
                "episode is not claimed; use `with shared_sim.episode(seed=...) as ep:` or pass "
                "shared_sim.episode(...) straight to run()"
            )
        reset = getattr(self.model, "reset", None)
        if callable(reset):
            reset()

    def _finish(self, episode: Episode, steps: int, inference_s: float, error: str | None) -> EpisodeResult:
        try:
            result = episode.finish(steps, inference_s, error)
        except BridgeError as exc:
            for obs in self.observers:
                obs.on_end(episode, None, str(exc))
            raise EpisodeError(f"could not grade the episode on slot {episode.slot}: {exc}") from None
        for obs in self.observers:
            obs.on_end(episode, result, error)
        return result

    # ------------------------------------------------------------------ sync
    def run(self, episode: Episode, max_steps: int | None = None) -> EpisodeResult:
        """Run ``episode`` to its end; claims it first if it is not claimed yet."""
        if episode.token is None and episode.grade_data is None:
            with episode:
                return self.run(episode, max_steps)
        self._start(episode)
        limit = self._limits(max_steps)
        contract = episode.contract
        queue: deque = deque()
        steps, inference_s = 0, 0.0
        try:
            with SlotClient(episode.address, episode.token, recv_timeout=self.recv_timeout) as slot:
                frame = slot.first_observation
                for obs in self.observers:
                    obs.on_start(episode, frame)
                while not frame["terminated"] and steps < limit:
                    if self.should_stop is not None and self.should_stop(features(frame), steps):
                        break
                    spent = self._plan(frame, episode.prompt, contract, queue, steps == 0) if not queue else 0.0
                    inference_s += spent
                    action = queue.popleft()
                    frame = slot.step(action)
                    steps += 1
                    for obs in self.observers:
                        obs.on_step(action, frame, spent)
        except BridgeError as exc:
            self._notify_end(episode, str(exc))
            raise EpisodeError(f"slot {episode.slot}: {exc}") from None
        except BaseException as exc:  # the model raised, or the test was interrupted
            self._notify_end(episode, f"{type(exc).__name__}: {exc}")
            raise
        return self._finish(episode, steps, inference_s, None)

    def _notify_end(self, episode: Episode, error: str) -> None:
        for obs in self.observers:
            try:
                obs.on_end(episode, None, error)
            except Exception:  # noqa: BLE001 - a recorder must not hide the episode's own error
                pass

    # ---------------------------------------------------------------- asyncio
    async def arun(self, episode: Episode, max_steps: int | None = None) -> EpisodeResult:
        """asyncio version of :meth:`run` (the model's ``predict`` is called inline)."""
        if episode.token is None and episode.grade_data is None:
            async with episode:
                return await self.arun(episode, max_steps)
        self._start(episode)
        limit = self._limits(max_steps)
        contract = episode.contract
        queue: deque = deque()
        steps, inference_s = 0, 0.0
        try:
            slot = await AsyncSlotClient.connect(episode.address, episode.token, recv_timeout=self.recv_timeout)
            try:
                frame = slot.first_observation
                for obs in self.observers:
                    obs.on_start(episode, frame)
                while not frame["terminated"] and steps < limit:
                    if self.should_stop is not None and self.should_stop(features(frame), steps):
                        break
                    spent = self._plan(frame, episode.prompt, contract, queue, steps == 0) if not queue else 0.0
                    inference_s += spent
                    action = queue.popleft()
                    frame = await slot.step(action)
                    steps += 1
                    for obs in self.observers:
                        obs.on_step(action, frame, spent)
            finally:
                await slot.close()
        except BridgeError as exc:
            self._notify_end(episode, str(exc))
            raise EpisodeError(f"slot {episode.slot}: {exc}") from None
        except BaseException as exc:
            self._notify_end(episode, f"{type(exc).__name__}: {exc}")
            raise
        return self._finish(episode, steps, inference_s, None)


@contextlib.contextmanager
def _watchdog(seconds: float | None, option: str):
    """Interrupt a model call that outlives ``seconds`` (main thread, SIGALRM not in use)."""
    usable = (
        seconds is not None
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)  # pytest-timeout owns it otherwise
    )
    if not usable:
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        raise EpisodeError(f"the policy did not answer within {seconds:g} s ({option} plus a margin)")

    signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
