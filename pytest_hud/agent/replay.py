"""Every frame of the episodes that need one, without rendering every step of every episode.

A chunking policy reads one observation per chunk, so the agent tells the sim to skip the renders
no one reads (:mod:`pytest_hud.sim.renders`). An observer that needs every image of only *some*
episodes, known at their end (the videos of failed episodes), does not make every step render: it
declares ``replays = True`` and answers ``wants_replay(result, error)`` after each episode::

    class FailedVideos:
        replays = True                               # frames of the episodes I want, by replay
        def wants_replay(self, result, error):        # before on_end, once the outcome is known
            return error is not None or not result.success

For an episode it wants, the agent claims the same episode again (:meth:`Episode.rerun
<pytest_hud.client.episode.Episode.rerun>`: the same seed, task, options, build and prompt), sends
the same actions with every frame rendered (all in one frame, :meth:`SlotClient.step_many
<pytest_hud.client.bridge.SlotClient.step_many>`: the bridge steps them back to back), and hands
the observer the replayed frames (``on_start``, then ``on_step`` per action, with ``inference_s``
0) before its ``on_end``. The same
claim and the same actions give the same episode (the determinism guarantee), and every replay is
checked against the episode: the frames rendered during it (every one the policy read) and the
grade must come back bit-identical. A replay that differs is thrown away with a
:class:`ReplayWarning`, the episode gets no artefact from it, and the agent renders every step from
then on. An episode whose every frame was rendered anyway (a policy that plans every step, a
``should_stop``) is handed over from the :class:`Tape` without a replay; episodes no observer wants
cost no replay at all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["ReplayMismatch", "ReplayWarning", "Tape", "replayed_frames"]

# what a grade says about the episode itself (the step count and times are the worker's)
_OUTCOME = ("success", "score", "total_reward", "terminated", "truncated", "success_at_reset")


class ReplayWarning(UserWarning):
    """A replay could not give an episode's frames (the sim did not replay it exactly, or failed)."""


class ReplayMismatch(Exception):
    """The replayed episode differs from the one that ran: the sim is not deterministic."""


def _kept(frame: Mapping[str, Any]) -> Mapping[str, Any]:
    """``frame``, its writeable arrays copied (a local sim may reuse them; wire arrays are read-only)."""
    if not any(getattr(getattr(v, "flags", None), "writeable", False) for v in frame.values()):
        return frame
    return {k: v.copy() if getattr(getattr(v, "flags", None), "writeable", False) else v for k, v in frame.items()}


class Tape:
    """One episode as the agent ran it: the actions it sent, and the frames that were rendered
    (the first one and every one whose images someone read), for the ``observers`` that replay."""

    def __init__(self, observers: Sequence[Any]) -> None:
        self.observers = list(observers)
        self.actions: list[np.ndarray] = []
        self.rendered: dict[int, Mapping[str, Any]] = {}  # step -> the frame after that many actions
        self.skipped = 0  # frames that came back with their renders skipped

    def started(self, frame: Mapping[str, Any]) -> None:
        self.rendered[0] = _kept(frame)

    def observed(self, action: np.ndarray, frame: Mapping[str, Any], rendered: bool) -> None:
        self.actions.append(np.array(action, copy=True))
        if rendered:
            self.rendered[len(self.actions)] = _kept(frame)
        else:
            self.skipped += 1


def _same(a: Any, b: Any) -> bool:
    """Bit for bit: the same dtype, shape and bytes (so NaN equals NaN, and -0.0 differs from 0.0)."""
    x, y = np.asarray(a), np.asarray(b)
    if x.dtype == object or y.dtype == object:
        return bool(a == b)
    return x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()


def check_replay(tape: Tape, frames: Sequence[Mapping[str, Any]], grade: Mapping[str, Any] | None = None,
                 replayed_grade: Mapping[str, Any] | None = None) -> None:
    """Raise :class:`ReplayMismatch` unless every frame rendered during the episode is in ``frames``
    bit for bit (and, when both are given, the grades agree on the outcome)."""
    for step, live in tape.rendered.items():
        if step >= len(frames):
            break  # steps beyond the replayed ones (an episode cut short by an error)
        again = frames[step]
        for key, value in live.items():
            if key not in again or not _same(value, again[key]):
                raise ReplayMismatch(f"the replay's {key!r} differs at step {step}")
    if grade is not None and replayed_grade is not None:
        for key in _OUTCOME:
            if key in grade and not _same(grade[key], replayed_grade.get(key)):
                raise ReplayMismatch(f"the replay's {key} is {replayed_grade.get(key)!r}, the episode's "
                                     f"{grade[key]!r}")


def replayed_frames(episode: Any, tape: Tape, steps: int, recv_timeout: float,
                    graded: bool = True) -> list[Mapping[str, Any]]:
    """The ``steps + 1`` frames of ``episode`` (graded: its slot is free), every one rendered: from
    the tape when nothing was skipped, else from a replay of its first ``steps`` actions, checked
    (:func:`check_replay`; ``graded``: the grades too, for an episode that ended without an error)."""
    actions = tape.actions[:steps]
    if all(i in tape.rendered for i in range(len(actions) + 1)):
        return [tape.rendered[i] for i in range(len(actions) + 1)]
    twin = episode.rerun()
    with twin:
        with twin.open_slot(recv_timeout) as slot:
            frames = [slot.first_observation]
            if actions:  # in one frame: the bridge steps them without waiting for this process
                frames.extend(slot.step_many(np.stack(actions)))
        replayed_grade = twin.grade()
    if len(frames) != len(actions) + 1:
        raise ReplayMismatch(f"the replay ended after {len(frames) - 1} of the episode's {len(actions)} steps")
    check_replay(tape, frames, episode.grade_data if graded else None, replayed_grade)
    return frames
