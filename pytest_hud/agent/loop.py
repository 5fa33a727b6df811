"""The agent: drive one claimed slot with a model until the episode ends, blocking or under asyncio.

Every decision (chunk queue, ``n_action_steps``, ``max_steps``, ``should_stop``, the watchdog,
observers' ``on_start``/``on_step``) is made by :class:`~.episode_loop.EpisodeLoop`; ``run`` and
``arun`` are its two thin shells, one over :class:`~pytest_hud.client.bridge.SlotClient` and one over
:class:`~pytest_hud.client.bridge.AsyncSlotClient`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from pytest_hud.client.address import BridgeError
from pytest_hud.client.episode import Episode, EpisodeError, EpisodeResult
from pytest_hud.agent.episode_loop import EpisodeLoop, StepObserver
from pytest_hud.agent.model import as_model
from pytest_hud.agent.replay import ReplayMismatch, ReplayWarning, Tape, replayed_frames

__all__ = ["Agent", "StepObserver"]


REPLAYED_SHARE = 0.75  # share of episodes wanted replayed above which episodes render live (Agent._taping)


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
        self.first_action_timeout = first_action_timeout
        self.step_timeout = step_timeout
        self.max_steps = max_steps
        self.n_action_steps = n_action_steps
        self.should_stop = should_stop
        self.recv_timeout = recv_timeout
        self.observers: list[StepObserver] = list(observers or [])
        #: False once a replay differed from its episode: from then on every step renders, and
        #: observers that replay get the live frames (:mod:`pytest_hud.agent.replay`)
        self.replays_exact = True
        #: episodes an observer that replays saw, and those it wanted replayed (a failed episode's
        #: video), taped or not: where most are wanted, episodes render live instead (:meth:`_taping`)
        self.watched = self.wanted = 0
        self.live_above = REPLAYED_SHARE  # 1.0: always skip and replay

    # ------------------------------------------------------------------ sync
    def run(self, episode: Episode, max_steps: int | None = None, *, failed_before: bool = False) -> EpisodeResult:
        """Run ``episode`` to its end; claims it first if it is not claimed yet.

        ``failed_before``: the episode failed when its suite last ran (pytest's cache), so an
        observer that replays failed episodes most likely wants it: it renders live instead of
        being replayed (:meth:`_taping`)."""
        if episode.token is None and episode.grade_data is None:
            with episode:
                return self.run(episode, max_steps, failed_before=failed_before)
        loop = self._start(episode, max_steps, failed_before)
        with self._reporting(episode, loop), \
                episode.open_slot(self.recv_timeout) as slot:
            try:
                action = loop.begin(slot.first_observation)
                while action is not None:
                    # an open-loop chunk in one frame: no round trip per step (the same steps); a
                    # policy that answers one action a step has no queue, and no call more a step
                    if loop.queue and (chunk := loop.ahead(action)) is not None:
                        for frame in slot.step_many(*chunk):
                            action = loop.observe(frame)
                            if action is None:
                                break
                    else:
                        action = loop.observe(slot.step(action, loop.reads_next))
            finally:
                loop.close()
        result = self._grade(episode, loop)
        self._count(result, None)
        self._replay(episode, loop, result, None)
        return self._end(episode, result)

    def _taping(self) -> bool:
        """Whether the next episode skips the frames its policy does not read and is replayed
        for its observers if they want it, or renders every step live.

        A replay runs the whole episode again with every frame rendered, while skipping saves at
        most the rendering share of a step (about 80-90 % on PushT and LIBERO with a 10-step chunk):
        skipping pays while fewer than about three episodes in four are replayed. Once more than
        that share of this agent's episodes would have been (a policy that fails most episodes, with
        videos of failures), its episodes render live, until the share falls again; a replay that
        differed turns taping off for good (``replays_exact``). An episode that failed when its
        suite last ran renders live whatever the share (``failed_before``): its first wave, which
        has no share yet, is where a run of a failing policy would otherwise replay most."""
        return self.replays_exact and self.wanted <= self.live_above * self.watched

    def _count(self, result: EpisodeResult | None, error: str | None) -> None:
        """Tally whether an observer that replays wants this episode (:meth:`_taping`)."""
        replaying = [o for o in self.observers if getattr(o, "replays", False)]
        if replaying:
            self.watched += 1
            self.wanted += any(o.wants_replay(result, error) for o in replaying)

    # ---------------------------------------------------------------- asyncio
    async def arun(self, episode: Episode, max_steps: int | None = None, *,
                   failed_before: bool = False) -> EpisodeResult:
        """asyncio version of :meth:`run` (the model's ``predict`` is called inline)."""
        if episode.token is None and episode.grade_data is None:
            async with episode:
                return await self.arun(episode, max_steps, failed_before=failed_before)
        loop = self._start(episode, max_steps, failed_before)
        with self._reporting(episode, loop):
            slot = await episode.aopen_slot(self.recv_timeout)
            many = getattr(slot, "step_many", None)
            try:
                action = loop.begin(slot.first_observation)
                while action is not None:
                    if many is not None and loop.queue and (chunk := loop.ahead(action)) is not None:
                        for frame in await many(*chunk):  # (see run)
                            action = loop.observe(frame)
                            if action is None:
                                break
                    else:
                        action = loop.observe(await slot.step(action, loop.reads_next))
            finally:
                loop.close()
                await slot.close()
        result = self._grade(episode, loop)
        self._count(result, None)
        await asyncio.to_thread(self._replay, episode, loop, result, None)  # a whole episode's steps
        return self._end(episode, result)

    # ------------------------------------------------------ shared by both
    def _start(self, episode: Episode, max_steps: int | None, failed_before: bool = False) -> EpisodeLoop:
        if episode.token is None:
            raise EpisodeError(
                "episode is not claimed; use `with shared_sim.episode(seed=...) as ep:` or pass "
                "shared_sim.episode(...) straight to run()"
            )
        reset = getattr(self.model, "reset", None)
        if callable(reset):
            reset()
        # observers that take their frames from a replay do not make the episode render every step
        # (a replay needs the seed the episode was claimed with, and a sim that replays exactly);
        # a sim without cameras has no image to skip or replay, so its episodes keep no tape
        # and an observer of camera frames alone (``cameras_only``) has nothing to see in it
        # and an observer that wants nothing of this episode (``wants_episode``: a video recorder
        # whose task has had all its videos) sees none of its steps
        cameras = getattr(episode.contract, "cameras", None)
        present = [o for o in self.observers if (cameras or not getattr(o, "cameras_only", False))
                   and (getattr(o, "wants_episode", None) is None or o.wants_episode(episode))]
        can_replay = not failed_before and self._taping() and episode.seed is not None and cameras
        replaying = [o for o in present if getattr(o, "replays", False)] if can_replay else []
        watching = [o for o in present if not any(o is r for r in replaying)]
        return EpisodeLoop(
            self.model,
            episode.contract,
            prompt=episode.prompt,
            max_steps=max_steps if max_steps is not None else self.max_steps,
            n_action_steps=self.n_action_steps,
            should_stop=self.should_stop,
            first_action_timeout=self.first_action_timeout,
            step_timeout=self.step_timeout,
            observers=watching,
            episode=episode,
            tape=Tape(replaying) if replaying else None,
        )

    @contextlib.contextmanager
    def _reporting(self, episode: Episode, loop: EpisodeLoop) -> Iterator[None]:
        """Tell observers how an interrupted episode ended; a bridge failure becomes EpisodeError."""
        try:
            yield
        except BridgeError as exc:
            self._replay_errored(episode, loop, str(exc))
            self._notify_end(episode, str(exc))
            prefix = f"slot {episode.slot}: "
            message = str(exc)  # the bridge's own errors name their slot already
            raise EpisodeError(message if message.startswith(prefix) else prefix + message) from None
        except Exception as exc:  # the model raised
            self._replay_errored(episode, loop, f"{type(exc).__name__}: {exc}")
            self._notify_end(episode, f"{type(exc).__name__}: {exc}")
            raise
        except BaseException as exc:  # the test was interrupted: no replay
            self._notify_end(episode, f"{type(exc).__name__}: {exc}")
            raise

    def _notify_end(self, episode: Episode, error: str) -> None:
        for obs in self.observers:
            try:
                obs.on_end(episode, None, error)
            except Exception:  # noqa: BLE001 - a recorder must not hide the episode's own error
                pass

    def _grade(self, episode: Episode, loop: EpisodeLoop) -> EpisodeResult:
        try:
            return episode.finish(loop.steps, loop.inference_s, None)
        except BridgeError as exc:
            for obs in self.observers:
                obs.on_end(episode, None, str(exc))
            raise EpisodeError(f"could not grade the episode on slot {episode.slot}: {exc}") from None

    def _end(self, episode: Episode, result: EpisodeResult) -> EpisodeResult:
        for obs in self.observers:
            obs.on_end(episode, result, None)
        return result

    def _replay_errored(self, episode: Episode, loop: EpisodeLoop, error: str) -> None:
        """The frames an errored episode had before its error, for the observers that want them
        (its slot is graded first, so that the replay can claim one)."""
        self._count(None, error)
        if loop.tape is None or not any(o.wants_replay(None, error) for o in loop.tape.observers):
            return
        try:
            episode.grade()
        except BridgeError:
            return  # the bridge is gone: nothing to replay on (and no frame to show)
        self._replay(episode, loop, None, error)

    def _replay(self, episode: Episode, loop: EpisodeLoop, result: EpisodeResult | None,
                error: str | None) -> None:
        """Hand the observers that replay, and want this episode, its frames, every one rendered
        (:func:`~pytest_hud.agent.replay.replayed_frames`); a replay that fails or differs warns."""
        tape = loop.tape
        wanted = [o for o in tape.observers if o.wants_replay(result, error)] if tape is not None else []
        if not wanted:
            return
        began = time.monotonic()
        try:
            frames = replayed_frames(episode, tape, loop.steps, self.recv_timeout, graded=error is None)
        except ReplayMismatch as exc:
            self.replays_exact = False
            warnings.warn(ReplayWarning(
                f"episode seed={episode.seed} did not replay exactly ({exc}): the sim is not deterministic, "
                "so this episode has no video, and every later step renders its images"), stacklevel=2)
            return
        except (BridgeError, EpisodeError) as exc:
            warnings.warn(ReplayWarning(f"could not replay episode seed={episode.seed} for its video: {exc}"),
                          stacklevel=2)
            return
        for obs in wanted:
            obs.on_start(episode, frames[0])
            for action, frame in zip(tape.actions, frames[1:]):
                obs.on_step(action, frame, 0.0)
        if result is not None:
            result.replay_s = time.monotonic() - began
