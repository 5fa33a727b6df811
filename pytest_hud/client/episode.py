"""One episode on a claimed slot: claim on enter, grade and release on exit, whatever happens.

    >>> with Episode(control, seed=3) as ep:      # claim(seed=3) on the control channel
    ...     result = agent.run(ep)                # drives the slot over its WebSocket
    >>> result.success

Usable from plain Python; the pytest fixtures hand out these objects via ``shared_sim.episode()``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pytest_hud.client.address import BridgeAddress, BridgeError
from pytest_hud.core.contract import Contract
from pytest_hud.core.results import EpisodeResult

if TYPE_CHECKING:  # the clients (the WebSocket stack) are imported when a slot is opened on a bridge
    from pytest_hud.client.bridge import AsyncSlotClient, ControlClient, SlotClient

__all__ = ["Episode", "EpisodeError", "EpisodeResult"]


class EpisodeError(RuntimeError):
    """The episode could not be run to a grade (bridge failure, timeout, disconnect).

    The pytest plugin reports these as *errors*, not as failed episodes.
    """


class Episode:
    """A claimed slot for one episode of ``task`` (``seed``, ``options``, ``prompt``, ``build``)."""

    def __init__(self, control: ControlClient, contract: Contract | None = None,
                 on_finish: Callable[[Episode], None] | None = None, **task: Any) -> None:
        self.control = control
        self.address: BridgeAddress = control.address
        self.contract = contract or control.contract()
        self.task = task
        self.seed: int | None = task.get("seed")
        self.token: str | None = None
        self.slot: int | None = None
        self.prompt: str | None = task.get("prompt")
        self.sim_task: str | None = task.get("task")  # the sim's task (multi-task sims), as the bridge chose it
        self.result: EpisodeResult | None = None
        self.grade_data: dict[str, Any] | None = None
        self.started: float | None = None
        self._on_finish = on_finish

    # ------------------------------------------------------------------ claim
    def claim(self) -> Episode:
        claim = self.control.claim(**self.task)
        self.token, self.slot, self.prompt = claim.token, claim.slot, claim.prompt
        if claim.seed is not None:
            self.seed = claim.seed  # drawn by the bridge when the claim gave none
        self.sim_task = claim.task
        self.started = time.monotonic()
        return self

    def __enter__(self) -> Episode:
        return self.claim()

    async def __aenter__(self) -> Episode:
        return await asyncio.to_thread(self.claim)  # the control call must not block the event loop

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.__exit__, *exc)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        # Grade whatever happened (a partial episode still has a step count), always free the slot.
        try:
            if self.grade_data is None and self.token is not None:
                self.grade()
        except BridgeError:
            try:
                if self.token is not None:
                    self.control.release(self.token)
            except BridgeError:
                pass  # the bridge is gone: its slots went with it
        finally:
            if self._on_finish is not None:
                self._on_finish(self)

    # ------------------------------------------------------------------ grade
    def grade(self) -> dict[str, Any]:
        """Ask the bridge for the episode's grade; frees the slot. Idempotent."""
        if self.grade_data is None:
            if self.token is None:
                raise EpisodeError("episode was never claimed; use it as a context manager")
            token, self.token = self.token, None
            self.grade_data = self.control.result(token)
        return self.grade_data

    def open_slot(self, recv_timeout: float) -> SlotClient:
        """The claimed slot's steps: its WebSocket on the bridge (the agent loop calls this)."""
        from pytest_hud.client.bridge import SlotClient  # (the WebSocket stack: for a bridge's slot)

        return SlotClient(self.address, self.token, recv_timeout=recv_timeout)

    async def aopen_slot(self, recv_timeout: float) -> AsyncSlotClient:
        """asyncio version of :meth:`open_slot`."""
        from pytest_hud.client.bridge import AsyncSlotClient

        return await AsyncSlotClient.connect(self.address, self.token, recv_timeout=recv_timeout)

    def definition(self) -> dict[str, Any]:
        """What defines this episode, as its results line records it: the seed (the one the bridge
        drew when none was given), the sim's task, reset options, build arguments and prompt. A
        claim with these on a bridge of the same sim runs the same episode."""
        out = {"seed": self.seed, "task": self.sim_task, "options": self.task.get("options"),
               "build": self.task.get("build") or {}, "prompt": self.prompt}
        return {k: v for k, v in out.items() if v is not None}

    def rerun(self) -> Episode:
        """A new, unclaimed episode of this one's :meth:`definition` on the same bridge: the same
        actions replay this episode step for step (how a video is rendered after an episode whose
        unread renders were skipped, :mod:`pytest_hud.agent.replay`)."""
        return Episode(self.control, self.contract, **self.rerun_task())

    def rerun_task(self) -> dict[str, Any]:
        """The claim arguments of :meth:`rerun` (no ``build`` where the episode's claim gave none)."""
        task = self.definition()
        if not task.get("build"):
            task.pop("build", None)
        return task

    def finish(self, steps: int, inference_s: float = 0.0, error: str | None = None,
               artefacts: dict[str, str] | None = None) -> EpisodeResult:
        """Grade and build the :class:`EpisodeResult` (called by the agent loop)."""
        grade = EpisodeResult.from_dict({"steps": steps, **self.grade()})
        duration = time.monotonic() - (self.started or time.monotonic())
        self.result = grade.completed(duration_s=duration, inference_s=inference_s, error=error,
                                      artefacts=artefacts, slot=self.slot, seed=self.seed, prompt=self.prompt)
        return self.result
