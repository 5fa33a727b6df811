"""Episode videos: H.264 MP4s from the camera frames the agent already receives.

    recorder = VideoRecorder("videos/", mode="failed")
    agent = Agent(model, observers=[recorder])
    recorder.label_next("evals/test_pusht.py::test_push", "7")  # the plugin does this per test
    result = agent.run(shared_sim.episode(seed=7))
    result.artefacts["video"]        # "/abs/videos/test_pusht.py__test_push__7.mp4" (if it failed)
    recorder.flush(timeout=60)       # the file is complete once flush returns True

How it works, and why:

- **Renders only for the videos written.** The recorder is a
  :class:`~pytest_hud.agent.loop.StepObserver` on the worker: it keeps the contract's camera
  features (``episode.contract.cameras``) from observation frames. In ``"all"`` mode those are the
  frames the agent receives anyway, every one rendered. In ``"failed"`` mode it takes them from a
  replay of each failed episode (``replays``, :mod:`pytest_hud.agent.replay`), so a chunking
  policy's episodes render only the frames it reads, and only the failed ones are rendered again,
  step for step, bit-identical to rendering every step. One video frame per observation, so an
  episode of ``T`` steps gives ``T + 1`` frames (the reset observation plus one per action).
- **Off the hot path.** During the episode it only keeps references to the frames (decoded wire
  arrays are read-only and fresh each tick; writeable arrays, which a local sim may reuse, are
  copied). Conversion and encoding happen after ``on_end`` on one background thread, so the next
  episode starts at once; one thread keeps encoding from competing with the sim for every core.
- **Which episodes.** ``mode="failed"`` (the default of ``--hud-video``) writes a video when the
  episode did not succeed or errored; ``"all"`` writes every episode; ``"none"`` records nothing.
  ``max_frames`` bounds the memory by keeping the last frames, the ones that show how it ended.
- **Paths ride on the result.** ``on_end`` sets ``result.artefacts["video"]`` (one camera) or
  ``result.artefacts["video/<camera>"]`` (several) to the absolute path *before* returning, while
  the file is still being encoded, so the path reaches the test report. Encoding writes
  ``<name>.mp4.part`` and renames it when done: **a video file that exists is complete.** Whoever
  reads the file must either call :meth:`VideoRecorder.flush` first (the plugin does, on the
  worker, before the episode's report is sent) or wait for the file to appear (the pytest-html hooks
  do, on the controller). Episodes that errored before a result existed get their paths in
  :attr:`VideoRecorder.last_artefacts`.
- **Browser-playable.** H.264 (libx264) in MP4, pixel format ``yuv420p``, ``+faststart`` (the index
  first, so a page can start playing before the whole file has loaded). yuv420p needs even width and
  height: odd-sized images are padded with their edge pixels by one row/column.
- **Episodes without cameras** record nothing and set no artefact, silently.

PyAV (``pip install 'pytest-hud[video]'``) is imported only on the encoding thread, so workers that
never record do not pay for it; :func:`video_available` says whether it can be imported.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

import numpy as np

from pytest_hud.recording import video_available
from pytest_hud.recording.quota import VideoQuota
from pytest_hud.recording.recorder import ArtefactNames, safe_name

__all__ = ["VideoMode", "VideoRecorder", "encode_mp4", "video_available"]

VideoMode = Literal["failed", "all", "none"]
VIDEO_MODES: tuple[str, ...] = ("failed", "all", "none")
DEFAULT_FPS = 30.0


def _import_av() -> None:
    with contextlib.suppress(Exception):  # an encode that needs it reports the failure
        import av  # noqa: F401


def _as_rgb(frame: Any) -> np.ndarray | None:
    """An ``[H, W, 3]`` uint8 image from what a camera feature holds, or None if it is not an image.

    Accepts HWC or CHW, gray, RGB or RGBA, uint8 or float in [0, 1]: sims disagree on all of these.
    """
    arr = np.asarray(frame)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    if arr.ndim != 3:
        return None
    if arr.shape[-1] not in (1, 3, 4) and arr.shape[0] in (1, 3, 4):
        arr = np.moveaxis(arr, 0, -1)
    if arr.shape[-1] not in (1, 3, 4) or arr.shape[0] == 0 or arr.shape[1] == 0:
        return None
    if arr.dtype != np.uint8:
        if np.issubdtype(arr.dtype, np.floating):
            top = float(np.nanmax(arr)) if arr.size else 0.0
            arr = np.nan_to_num(arr * (255.0 if top <= 1.0 else 1.0))
        elif not np.issubdtype(arr.dtype, np.integer) and arr.dtype != np.bool_:
            return None
        arr = np.clip(arr, 0, 255).astype(np.uint8)
    if arr.shape[-1] == 1:
        arr = np.repeat(arr, 3, axis=-1)
    elif arr.shape[-1] == 4:
        arr = arr[:, :, :3]  # browsers' H.264 has no alpha
    return np.ascontiguousarray(arr)


def _fit(arr: np.ndarray, height: int, width: int) -> np.ndarray:
    """Pad (edge pixels) or crop ``arr`` to ``height x width``: every frame of a stream has one size."""
    h, w = arr.shape[:2]
    if h < height or w < width:
        arr = np.pad(arr, ((0, max(0, height - h)), (0, max(0, width - w)), (0, 0)), mode="edge")
    return np.ascontiguousarray(arr[:height, :width])


def encode_mp4(frames: list[Any], path: str | os.PathLike[str], fps: float = DEFAULT_FPS,
               crf: int = 23, preset: str = "veryfast", threads: int = 2) -> int:
    """Encode ``frames`` (images as :func:`_as_rgb` accepts them) to an H.264/yuv420p MP4 at ``path``.

    The size is the first frame's, rounded up to even; the file appears atomically (written as
    ``path + ".part"``, then renamed). Returns the number of frames written.
    """
    import av  # here, not at import time: only the encoding thread needs PyAV

    images = [img for img in (_as_rgb(f) for f in frames) if img is not None]
    if not images:
        raise ValueError(f"no frame of {len(frames)} is an image (HWC or CHW, 1/3/4 channels)")
    h, w = images[0].shape[:2]
    height, width = h + h % 2, w + w % 2
    rate = Fraction(fps if fps and fps > 0 else DEFAULT_FPS).limit_denominator(1001)
    path = Path(path)
    part = path.with_name(path.name + ".part")
    try:
        with av.open(str(part), mode="w", format="mp4", options={"movflags": "+faststart"}) as container:
            stream = container.add_stream("libx264", rate=rate)
            stream.width, stream.height = width, height
            stream.pix_fmt = "yuv420p"
            stream.options = {"crf": str(int(crf)), "preset": preset}
            stream.codec_context.thread_count = max(1, int(threads))
            time_base = 1 / rate  # a Fraction: made once, not per frame
            stream.codec_context.time_base = time_base
            for i, img in enumerate(images):
                frame = av.VideoFrame.from_ndarray(_fit(img, height, width), format="rgb24")
                frame.pts = i
                frame.time_base = time_base
                container.mux(stream.encode(frame))
            container.mux(stream.encode(None))  # drain the encoder's delayed frames
        os.replace(part, path)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return len(images)


def _failed(result: Any, error: str | None) -> bool:
    return result is None or error is not None or not bool(getattr(result, "success", False))


class VideoRecorder:
    """A :class:`~pytest_hud.agent.loop.StepObserver` that writes an MP4 per camera per episode.

    ``mode``: ``"failed"`` (episodes that did not succeed or errored), ``"all"`` or ``"none"``.
    ``fps``: playback rate; default the contract's ``control_rate``, else 30. ``max_frames``: keep
    only the last this many frames of an episode (bounds memory for long episodes; None = all).
    ``crf``/``preset``/``threads``: libx264 quality, speed and threads per encode.
    ``max_per_task``: at most this many videos per task (None: no limit). An episode takes one of
    its task's videos when it starts (:meth:`wants_episode`) and gives it back at its end if it
    needs none (it succeeded, in ``"failed"`` mode); an episode that starts with none left keeps
    no frames, so the agent skips the renders its policy does not read. ``slots(task, what)``
    takes (``"take"``: True if one was left), keeps (``"keep"``: its video is being made) or gives
    back (``"give_back"``) one of the task's videos where several recorders share the limit (the
    plugin's workers, through the controller: :class:`~pytest_hud.recording.quota.VideoQuota`);
    without it this recorder counts its own.

    One episode at a time per recorder (as for every step observer). Call :meth:`label_next`
    before an episode to name its files after the task and episode id, :meth:`flush` before reading
    them, :meth:`close` at the end of the session. Encoding failures never fail an episode: they are
    collected in :attr:`errors` as ``(path, message)``.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        mode: VideoMode | str = "failed",
        fps: float | None = None,
        *,
        max_frames: int | None = None,
        crf: int = 23,
        preset: str = "veryfast",
        threads: int = 2,
        max_per_task: int | None = None,
        slots: Callable[[str, str], bool] | None = None,
    ) -> None:
        if mode not in VIDEO_MODES:
            raise ValueError(f"video mode {mode!r} is not one of {', '.join(VIDEO_MODES)}")
        if mode != "none" and not video_available():
            raise RuntimeError(
                f"video mode {mode!r} needs PyAV to encode MP4s: pip install 'pytest-hud[video]' "
                "(or turn videos off with --hud-video none)"
            )
        if max_frames is not None and max_frames < 1:
            raise ValueError(f"max_frames={max_frames} must be at least 1 (or None for all frames)")
        if max_per_task is not None and max_per_task < 1:
            raise ValueError(f"max_per_task={max_per_task} must be at least 1 (or None for no limit; "
                             "mode 'none' for no videos)")
        self.directory = Path(directory).resolve()
        self.mode = mode
        self.fps = fps
        self.max_frames = max_frames
        self.crf, self.preset, self.threads = crf, preset, threads
        self.last_artefacts: dict[str, str] = {}
        self.errors: list[tuple[str, str]] = []
        self._labels = ArtefactNames()
        self._cameras: list[str] = []
        self._frames: dict[str, deque] = {}
        self._episode_fps = DEFAULT_FPS
        self._pending: set[Future] = set()
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._warm = False  # PyAV imported (or its import queued) on the encoding thread
        self.max_per_task = max_per_task
        # shared with other recorders, else this recorder's own count (pytest_hud.recording.quota)
        self._slots = slots if slots is not None or max_per_task is None else VideoQuota(max_per_task)
        self._granted: tuple[str, bool] | None = None  # the running episode's task, and whether it has a video

    #: it keeps camera frames and nothing else: an episode whose contract has no camera does not
    #: call it at every step (:meth:`pytest_hud.agent.loop.Agent._start`)
    cameras_only = True

    # --------------------------------------------------------------- naming
    def label_next(self, task: str, episode: str) -> None:
        """Name the next episode's files ``<safe task>__<episode>[__<camera>].mp4``."""
        self._labels.set_next(task, episode)

    # ------------------------------------------------------------- observer
    def _keep(self, observation: Mapping[str, Any]) -> None:
        for name in self._cameras:
            frame = observation.get(name)
            if frame is None:
                continue
            if getattr(frame, "flags", None) is not None and frame.flags.writeable:
                frame = frame.copy()  # a local sim may reuse its buffer; wire arrays are read-only
            self._frames[name].append(frame)

    def on_start(self, episode: Any, observation: Mapping[str, Any]) -> None:
        """Start keeping the camera frames of ``episode`` (none if the contract has no camera)."""
        self._frames = {}
        self.last_artefacts = {}
        if self.mode == "none":
            return
        contract = getattr(episode, "contract", None)
        self._cameras = list(getattr(contract, "cameras", None) or [])
        rate = getattr(contract, "control_rate", None)
        self._episode_fps = float(self.fps or rate or DEFAULT_FPS)
        self._frames = {name: deque(maxlen=self.max_frames) for name in self._cameras}
        self._keep(observation)
        if self._cameras and not self._warm:
            # PyAV's import (~0.1 CPU-s) runs now, while the episode waits on its sim and policy,
            # instead of before the first encode, which the episode's report waits for.
            self._warm = True
            with self._lock:
                self._run(_import_av)

    def on_step(self, action: np.ndarray, observation: Mapping[str, Any], inference_s: float) -> None:
        """Keep this tick's camera frames (references only; no conversion on the hot path)."""
        if self._frames:
            self._keep(observation)

    def wants_episode(self, episode: Any) -> bool:
        """Whether the coming episode may get a video (asked by the agent as the episode starts):
        not in ``"none"`` mode, nor once its task has had all of its ``max_per_task`` videos. With
        a limit, the episode takes one of them here."""
        if self.mode == "none":
            return False
        if self.max_per_task is None:
            return True
        task = self._labels.next_task(episode)
        self._granted = (task, bool(self._slots(task, "take")))
        return self._granted[1]

    @property
    def _refused(self) -> bool:
        """The running episode's task had all its videos when it started."""
        return self._granted is not None and not self._granted[1]

    def _settle(self, what: str) -> None:
        """The running episode's video, if it took one: ``"keep"`` (it is being made) or
        ``"give_back"`` (it needs none: its task's video goes to a later episode)."""
        granted, self._granted = self._granted, None
        if granted is not None and granted[1]:
            self._slots(granted[0], what)

    @property
    def replays(self) -> bool:
        """In ``"failed"`` mode the frames come from a replay of the episodes that need a video, so
        the others render only what their policy reads (:mod:`pytest_hud.agent.replay`)."""
        return self.mode == "failed"

    def wants_replay(self, result: Any, error: str | None) -> bool:
        """Whether this episode gets a video: in ``"failed"`` mode, when it failed or errored (and
        it took one of its task's videos, under ``max_per_task``)."""
        if self._refused:
            return False
        return self.mode == "all" or (self.mode == "failed" and _failed(result, error))

    def on_end(self, episode: Any, result: Any, error: str | None) -> None:
        """Queue the encode if this episode should have a video, and put the paths on ``result``."""
        frames, self._frames = self._frames, {}
        self.last_artefacts = {}
        if (self.mode == "none" or self._refused or not any(frames.values())
                or (self.mode == "failed" and not _failed(result, error))):
            self._settle("give_back")  # (nothing to show: a video taken for it goes to a later episode)
            return
        self._settle("keep")  # (one that took none kept no frames: this one has its video)
        _, _, stem = self._labels.take(episode)
        cams = [name for name in self._cameras if frames.get(name)]
        artefacts: dict[str, str] = {}
        for name in cams:
            if len(cams) == 1:
                key, path = "video", self.directory / f"{stem}.mp4"
            else:
                key, path = f"video/{name}", self.directory / f"{stem}__{safe_name(name, 'camera')}.mp4"
            artefacts[key] = str(path)
            self._submit(list(frames[name]), path)
        self.last_artefacts = artefacts
        if result is not None and isinstance(getattr(result, "artefacts", None), dict):
            result.artefacts.update(artefacts)

    # -------------------------------------------------------------- encoding
    def _run(self, fn: Any, *args: Any) -> Future:
        """``fn(*args)`` on the encoding thread (started on first use). Call with the lock held."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hud-video")
        return self._executor.submit(fn, *args)

    def _submit(self, frames: list[Any], path: Path) -> None:
        with self._lock:
            future = self._run(self._encode, frames, path, self._episode_fps)
            self._pending.add(future)
        future.add_done_callback(self._done)

    def _encode(self, frames: list[Any], path: Path, fps: float) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            encode_mp4(frames, path, fps, self.crf, self.preset, self.threads)
        except Exception as exc:  # a broken video must never fail or hang the run
            with self._lock:
                self.errors.append((str(path), f"{type(exc).__name__}: {exc}"))

    def _done(self, future: Future) -> None:
        with self._lock:
            self._pending.discard(future)

    @property
    def pending(self) -> int:
        """Videos queued or being encoded."""
        with self._lock:
            return len(self._pending)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued video is written (or failed); False if ``timeout`` ran out first."""
        with self._lock:
            pending = set(self._pending)
        if not pending:
            return True
        _, not_done = wait(pending, timeout=timeout)
        return not not_done

    def close(self, timeout: float | None = None) -> bool:
        """Flush, then stop the encoding thread. Returns :meth:`flush`'s answer."""
        done = self.flush(timeout)
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=done, cancel_futures=not done)
        return done
