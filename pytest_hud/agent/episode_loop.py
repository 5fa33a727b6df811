"""The agent loop's decisions for one episode, without I/O: which action goes next, and when to stop.

:class:`EpisodeLoop` is fed observation frames and answers with the next action, or None when the
episode is over for the agent (the env terminated, ``max_steps`` was reached, or ``should_stop``
said so). The blocking and asyncio shells in :mod:`.loop` only carry its actions to the bridge and
its frames back::

    loop = EpisodeLoop(model, contract, prompt=None, max_steps=200)
    action = loop.begin(first_frame)
    while action is not None:
        action = loop.observe(slot.step(action))
    loop.close()  # in a finally: stops the watchdog's timer
    loop.steps, loop.inference_s

Open-loop action chunks: the model returns ``[T, A]``; the loop executes up to ``n_action_steps``
of them before asking again (``[A]`` is a chunk of one).
"""

from __future__ import annotations

import _signal
import contextlib
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from pytest_hud.core.contract import RESERVED_KEYS, Contract
from pytest_hud.client.episode import EpisodeError

if TYPE_CHECKING:
    from pytest_hud.agent.replay import Tape
    from pytest_hud.client.episode import Episode, EpisodeResult

__all__ = ["EpisodeLoop", "StepObserver", "features", "as_chunk"]


class StepObserver(Protocol):
    """Sees every tick of an episode (video and trace recorders implement this).

    Optional: ``wants_episode(episode) -> bool``, asked as an episode starts; an observer that
    answers False sees none of its steps (only its ``on_end``), so it makes no frame render."""

    def on_start(self, episode: Episode, observation: Mapping[str, Any]) -> None: ...
    def on_step(self, action: np.ndarray, observation: Mapping[str, Any], inference_s: float) -> None: ...
    def on_end(self, episode: Episode, result: EpisodeResult | None, error: str | None) -> None: ...


def features(frame: Mapping[str, Any]) -> dict[str, Any]:
    """The model's view of an observation frame: contract features only."""
    return {k: v for k, v in frame.items() if k not in RESERVED_KEYS}


def _viewer(first: Mapping[str, Any]) -> Callable[[Mapping[str, Any]], dict[str, Any]]:
    """:func:`features` for the frames of the episode that ``first`` begins, whose layout never
    changes (a skipped render leaves the last image in place): their feature keys are taken once,
    so a step's view picks them instead of testing every key. A frame without one of them gets
    :func:`features` itself."""
    keys = tuple(k for k in first if k not in RESERVED_KEYS)
    if len(keys) == 1:
        (key,) = keys

        def one(frame: Mapping[str, Any]) -> dict[str, Any]:
            try:
                return {key: frame[key]}
            except KeyError:
                return features(frame)

        return one

    def some(frame: Mapping[str, Any]) -> dict[str, Any]:
        try:
            return {k: frame[k] for k in keys}
        except KeyError:
            return features(frame)

    return some


def as_chunk(output: Any, contract: Contract) -> np.ndarray:
    """Normalise a model's output to ``[T, *action_shape]``."""
    return _Chunker(contract)(output)


class _Chunker:
    """:func:`as_chunk` for one contract, its action's shape worked out once (the loop asks every
    step): :meth:`single` reads an answer of one action (``[A]`` or a scalar), which the chunk
    puts under a new first axis; a ``[T, A]`` answer is a chunk as it is."""

    __slots__ = ("rank", "shape", "dim", "discrete", "_choices")

    def __init__(self, contract: Contract) -> None:
        action = contract.action
        self.rank = len(action.shape)
        self.shape = tuple(action.shape)
        self.dim = contract.action_dim
        self.discrete = action.type == "discrete"
        self._choices: dict[int, np.ndarray] = {}  # a discrete policy's int answers, as actions

    def __call__(self, output: Any) -> np.ndarray:
        action = self.single(output)
        return np.asarray(output) if action is None else action[None]

    def single(self, output: Any) -> np.ndarray | None:
        """The one action ``output`` is, as row 0 of its chunk of one would be; None when
        ``output`` is a chunk (the loop queues its rest). Most policies answer one action a step,
        which then costs no chunk array, no slice and no queue.

        A discrete policy's answer as a Python ``int`` becomes a read-only action array kept per
        value (making one cost a sixth of a CartPole step's bookkeeping in the worker); an array
        of the action's shape is the action itself, as row 0 of a chunk would be a view of it."""
        if type(output) is int and self.discrete:
            action = self._choices.get(output)
            if action is None:
                action = np.asarray(output).reshape(1)
                action.setflags(write=False)
                if len(self._choices) < 1024:
                    self._choices[output] = action
            return action
        arr = output if type(output) is np.ndarray else np.asarray(output)
        if arr.ndim > self.rank:
            return None
        if self.discrete and arr.size == 1:
            return arr.reshape(1)
        if arr.shape == self.shape:
            return arr
        return arr.reshape(self.shape) if arr.size == self.dim else arr


class EpisodeLoop:
    """One episode's state: the open-loop chunk queue, the step count and the time spent planning.

    - ``max_steps``: no action after this many steps (None: no limit).
    - ``n_action_steps``: execute at most this many actions of each chunk before re-planning.
    - ``should_stop(features, step) -> bool``: stop early (e.g. a task-specific success check).
    - ``first_action_timeout`` / ``step_timeout``: the bridge's limits; a ``predict`` that outlives
      one by a margin is interrupted (see :class:`_Watchdog`); :meth:`close` ends the episode's timer.

    ``observers`` see the first frame and every step; their ``on_end`` belongs to the shell, which
    alone knows how the episode ended. ``tape`` (a :class:`~pytest_hud.agent.replay.Tape`) keeps
    the actions and the frames rendered, for a replay that renders every step after the episode.
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
        tape: Tape | None = None,
    ) -> None:
        self.model = model
        self.contract = contract
        self.prompt = prompt
        self.limit = max_steps if max_steps is not None else 10**9
        self.n_action_steps = n_action_steps
        self.should_stop = should_stop
        self.first_action_timeout = first_action_timeout
        self.step_timeout = step_timeout
        # the watchdog's limit of the first model call and of the later ones, a margin over the
        # bridge's (so that the bridge's verdict comes first): (seconds, option), None: unwatched
        self._limits = tuple(
            None if seconds is None else (seconds + _MARGIN_S, option)
            for seconds, option in ((first_action_timeout, "--hud-first-action-timeout"),
                                    (step_timeout, "--hud-step-timeout")))
        self.observers = list(observers or [])
        self.episode = episode  # only handed to observers
        self.queue: deque[np.ndarray] = deque()
        self.steps = 0
        self.inference_s = 0.0
        self._action: np.ndarray | None = None
        self._spent = 0.0  # planning time charged to the action in flight
        self._chunk = _Chunker(contract)
        self._view: Callable[[Mapping[str, Any]], dict[str, Any]] = features  # begin() specialises it
        self._singles = n_action_steps is None or n_action_steps >= 1  # a one-action answer needs no queue
        # every frame's images are read by a should_stop or an observer that reads images (videos of
        # every episode, datasets; a trace reads no image: ``reads_images = False``; videos of failed
        # episodes take theirs from a replay and are not among these observers)
        self._reads_all = should_stop is not None or any(
            getattr(o, "reads_images", True) for o in self.observers)
        self.tape = tape  # what a replay needs: the actions given, the frames rendered
        #: whether anyone reads the images of the observation the action in flight brings: the
        #: model does when its chunk is used up (it plans on that frame), observers and
        #: ``should_stop`` read every frame. The shells send it with the action, so the sim skips
        #: renders no one reads (:mod:`pytest_hud.sim.renders`); set by each action given.
        self.reads_next = True

    def begin(self, frame: Mapping[str, Any]) -> np.ndarray | None:
        """The episode's first observation; returns the first action (None: nothing to do)."""
        self._view = _viewer(frame)
        if self.tape is not None:
            self.tape.started(frame)
        for obs in self.observers:
            obs.on_start(self.episode, frame)
        return self._next(frame)

    def observe(self, frame: Mapping[str, Any]) -> np.ndarray | None:
        """The observation that answered the last action; returns the next action, or None."""
        if self._action is None:
            raise RuntimeError("observe() before begin() returned an action")
        self.steps += 1
        if self.tape is not None:
            self.tape.observed(self._action, frame, self.reads_next)
        for obs in self.observers:
            obs.on_step(self._action, frame, self._spent)
        return self._next(frame)

    def ahead(self, action: np.ndarray) -> tuple[list[np.ndarray], list[bool]] | None:
        """``action`` (the one just given) and the queued actions this loop will give after it
        without asking the model, up to ``max_steps``, with whether anyone reads the images of the
        observation each one brings; None when nothing is queued, or when ``should_stop`` must see
        each observation before the next action is known. A shell may send them in one frame
        (``slot.step_many(actions, reads)``) and feed their observations to :meth:`observe` one by
        one: each answer is then the next of them, the last one's the next chunk's first action."""
        queued = len(self.queue)
        if not queued or self.should_stop is not None:
            return None
        n = min(queued + 1, self.limit - self.steps)
        if n < 2:
            return None
        actions = [action, *itertools.islice(self.queue, n - 1)]
        # read: by every observer that reads images, and by the model once the chunk is used up
        return actions, [self._reads_all or i == queued for i in range(n)]

    def _next(self, frame: Mapping[str, Any]) -> np.ndarray | None:
        self._action = None
        if frame["terminated"] or self.steps >= self.limit:
            return None
        if self.should_stop is not None and self.should_stop(self._view(frame), self.steps):
            return None
        if self.queue:
            self._spent = 0.0
            self._action = self.queue.popleft()
        else:
            self._action = self._plan(frame)
        self.reads_next = self._reads_all or not self.queue
        return self._action

    def _plan(self, frame: Mapping[str, Any]) -> np.ndarray:
        """Ask the model for a chunk, queue all but its first action and return that one (its
        planning time goes to ``_spent`` and ``inference_s``)."""
        t0 = _clock()
        # The bridge fails a silent slot at its timeout; the watchdog then frees this process from
        # a predict() that never returns (a little later, so the bridge's verdict comes first).
        limit = self._limits[self.steps != 0]
        dog = None
        if limit is not None:
            dog = _WATCHDOG
            if dog.limit is limit:  # armed by this episode: what arm() does while its timer goes off first
                dog.deadline = deadline = t0 + limit[0]  # (before due is read: the handler may run between)
                due = dog.due
                if (due is None or due > deadline or due < t0 - 1.0) and not dog.arm(limit, t0):
                    dog = None
            elif not dog.arm(limit, t0):
                dog = None
        try:
            output = self.model.predict(self._view(frame), self.prompt)
        except PolicyTimeout as exc:
            raise EpisodeError(str(exc)) from None
        finally:
            if dog is not None:
                dog.deadline = None  # disarm()
        action = self._chunk.single(output) if self._singles else None
        self._spent = spent = _clock() - t0
        self.inference_s += spent
        if action is not None:
            return action
        chunk = self._chunk(output)
        if self.n_action_steps is not None:
            chunk = chunk[: self.n_action_steps]
        if len(chunk) == 0:
            raise EpisodeError("the model returned an empty action chunk")
        if len(chunk) > 1:
            self.queue.extend(chunk[1:])
        return chunk[0]

    def close(self) -> None:
        """The episode is over (or abandoned): stop the watchdog's timer, put SIGALRM back."""
        _WATCHDOG.release()


class PolicyTimeout(BaseException):
    """Raised inside a model call that outlived its limit. A ``BaseException``, like
    ``KeyboardInterrupt``, so that a policy's own ``except Exception`` (a retry loop, say) does not
    swallow it; the episode loop turns it into :class:`EpisodeError`."""


class _Watchdog:
    """Interrupts a model call that outlives its limit (main thread, SIGALRM not in use).

    One interval timer serves every step of an episode: :meth:`arm` installs the handler (once),
    notes the call's deadline and sets the timer only when it is not already due sooner;
    :meth:`disarm` forgets the deadline (the episode loop does what those two do without calling
    them while the limit armed, ``limit``, is its calls' and the timer goes off first: on CartPole
    the calls were a fifth of the agent's work per step). When the timer goes off, a call still
    inside its limit gets a timer for the rest of it, a call past it gets :class:`PolicyTimeout`
    (and again every ``repeat_s`` while it is still under way), and with no call under way nothing
    is set again until the next call. So a step makes no system call here (a timer and a handler
    per step were four), and between calls the timer fires at most once per limit. :meth:`release` stops the
    timer, then puts SIG_DFL back, at an episode's end. The handler itself never touches the
    disposition: a timer still running at SIG_DFL would end the process.

    ``_signal`` rather than ``signal``: the latter wraps every call in enum conversions.
    """

    def __init__(self) -> None:
        self.deadline: float | None = None  # the model call under way must end by then
        self.due: float | None = None  # when the armed timer goes off (None: not armed)
        self.installed = False  # our handler was installed by arm() and not yet released
        self.repeat_s = 5.0  # how often a call past its limit is interrupted again
        #: the call's limit, ``(seconds, option)`` (the option named when the call is interrupted),
        #: as given to the last arm() that watched: set on the main thread only
        self.limit: tuple[float, str] | None = None
        self._handler = self._expired

    def arm(self, limit: tuple[float, str], now: float | None = None) -> bool:
        """A model call starts (``now``, on :func:`_clock`; read here when not given) with
        ``limit``, ``(seconds, option)``; returns whether it is watched (False off the main thread,
        or when something else owns SIGALRM, e.g. pytest-timeout)."""
        if _get_ident() != _MAIN_THREAD:
            return False  # signals reach the main thread only
        current = _getsignal(_SIGALRM)
        if current is not self._handler:
            if current not in (_signal.SIG_DFL, None):
                return False
            _signal.signal(_signal.SIGALRM, self._handler)
            self.installed, self.due = True, None
        self.limit = limit
        seconds = limit[0]
        if now is None:
            now = _clock()
        self.deadline = now + seconds
        # (a timer overdue and not seen: something else used ITIMER_REAL meanwhile; set ours again)
        if self.due is None or self.due > self.deadline or self.due < now - 1.0:
            _signal.setitimer(_signal.ITIMER_REAL, seconds)
            self.due = self.deadline
        return True

    def disarm(self) -> None:
        self.deadline = None

    def release(self) -> None:
        if threading.get_ident() != _MAIN_THREAD:
            return  # an episode on another thread never armed it
        if self.installed:
            ours = _signal.getsignal(_signal.SIGALRM) is self._handler
            if ours or self.due is not None:
                _signal.setitimer(_signal.ITIMER_REAL, 0)  # the timer first: SIG_DFL would end the process
            if ours:
                _signal.signal(_signal.SIGALRM, _signal.SIG_DFL)
        self.installed = False
        self.deadline = self.due = self.limit = None

    def _expired(self, signum: int, frame: Any) -> None:
        self.due = None
        if self.deadline is None:  # between calls: the next call sets the timer again
            return
        left = self.deadline - _clock()
        if left > 0:
            _signal.setitimer(_signal.ITIMER_REAL, left)
            self.due = self.deadline
            return
        _signal.setitimer(_signal.ITIMER_REAL, self.repeat_s)  # again, if the call goes on regardless
        self.due = _clock() + self.repeat_s
        seconds, option = self.limit  # (arm() sets it before any deadline)
        raise PolicyTimeout(f"the policy did not answer within {seconds:g} s ({option} plus a margin)")


_WATCHDOG = _Watchdog()
_MARGIN_S = 5.0  # the watchdog's limits over the bridge's
# asked before every model call: looked up once
_MAIN_THREAD = threading.main_thread().ident
_get_ident, _getsignal, _SIGALRM = threading.get_ident, _signal.getsignal, _signal.SIGALRM
# the watchdog's deadlines and the planning times, on one clock (monotonic, the finest there is)
_clock = time.perf_counter


@contextlib.contextmanager
def watchdog(seconds: float | None, option: str) -> Iterator[None]:
    """Interrupt a model call that outlives ``seconds``, for one call (see :class:`_Watchdog`)."""
    if seconds is None or not _WATCHDOG.arm((seconds, option)):
        yield
        return
    try:
        yield
    except PolicyTimeout as exc:
        raise EpisodeError(str(exc)) from None
    finally:
        _WATCHDOG.disarm()
        _WATCHDOG.release()
