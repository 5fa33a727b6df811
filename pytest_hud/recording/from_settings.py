"""A worker's recorders, opened from the run's settings: videos, traces, a LeRobot dataset.

Kept apart from :mod:`.recorder`, the protocol the recorders themselves import, so that no import
runs in a circle: this module imports the recorders (lazily, when the settings ask for them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pytest_hud.recording.recorder import Recorder

__all__ = ["open_recorders"]


def open_recorders(settings: Any, worker: str,
                   video_slots: Callable[[str, bool], bool] | None = None) -> list[Recorder]:
    """A worker's recorders for the run's settings (a :class:`~pytest_hud.core.settings.HudSettings`);
    ``video_slots`` shares ``--hud-video-max`` with the other workers (see :class:`VideoRecorder`)."""
    recorders: list[Recorder] = []
    if settings.video != "none" and settings.video_dir:
        from pytest_hud.recording.video import VideoRecorder

        recorders.append(VideoRecorder(settings.video_dir, settings.video,
                                       max_per_task=getattr(settings, "video_max", None), slots=video_slots))
    if settings.trace_dir:
        from pytest_hud.recording.trace import TraceRecorder

        recorders.append(TraceRecorder(settings.trace_dir))
    if settings.record:
        from pytest_hud.recording.dataset import DatasetRecorder

        recorders.append(DatasetRecorder(settings.record, worker_id=worker))
    return recorders
