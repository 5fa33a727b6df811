"""The bridge's fault rules without I/O: what a sim's exception does to the episodes, envs and slots it hit.

:class:`FaultRules` is the bridge's health: whether it is broken (and by what), which slots' envs
are to be rebuilt, which slots are retired, and the notes that say so. The engine
(:class:`~pytest_hud.bridge.engine.BridgeEngine`) holds one and shares its slots with it; everything
else a rule needs is an argument.

A sim whose slots are independent envs (``isolates``) pins an exception on the slots whose envs
raised (:meth:`FaultRules.faulted`): their episodes fail, their envs are rebuilt before the next
claim lands there (a slot is retired after ``max_faults`` faults, or when its rebuild fails), and
every other slot goes on exactly as without the fault. Any other sim exception breaks the bridge
and fails every LIVE episode at once (``bridge broken by slot N's reset: ...``): none waits for its
own timeout (:meth:`FaultRules.reset_failed`, :meth:`FaultRules.step_failed`).
"""

from __future__ import annotations

from typing import Any, Protocol

from pytest_hud.sim.base import last_line
from pytest_hud.bridge.exceptions import BridgeBroken, SimFailed, SlotFailure
from pytest_hud.bridge.slots import Slot, SlotState

__all__ = ["FaultRules"]


class _Reset(Protocol):
    """What a failed reset reads of its :class:`~pytest_hud.bridge.engine.ResetPlan`."""

    slots: list[Slot]
    indices: list[int]


class _Step(Protocol):
    """What a failed step reads of its :class:`~pytest_hud.bridge.ticks.TickPlan`."""

    acting: list[tuple[Slot, str | None, Any]]


class FaultRules:
    """What a sim's exception ends, which envs are rebuilt and which slots retired (see the module
    docstring), over ``slots`` (the engine's own list, shared)."""

    def __init__(self, slots: list[Slot], max_faults: int = 3) -> None:
        if max_faults < 1:
            raise ValueError(f"max_faults must be at least 1, got {max_faults}")
        self.slots = slots
        self.max_faults = max_faults
        self.broken: str | None = None  # the sim's traceback, once it broke the bridge
        self.notes: list[str] = []  # slots retired, for the bridge's stats (the run's summary)

    @property
    def broken_reason(self) -> str:
        """The last line of the sim's traceback (the exception itself), or '' when not broken."""
        return self.broken.splitlines()[-1] if self.broken else ""

    @property
    def in_service(self) -> int:
        """Slots not retired (the bridge's width as it now runs)."""
        return sum(1 for s in self.slots if not (s.service or "").startswith("retired"))

    def mark_broken(self, traceback: str) -> None:
        """The bridge is broken by ``traceback`` (the first one is kept)."""
        if not self.broken:
            self.broken = traceback.strip()

    def reset_failed(self, plan: _Reset, traceback: str) -> tuple[SimFailed, list[tuple[int, SlotFailure]]]:
        """The sim raised during ``plan`` and cannot pin it on a slot: the bridge is broken, the slots
        being bound fail, and so does every LIVE episode at once (none could ever step again).
        Returns the reset's failure and ``(slot index, failure)`` for each LIVE slot ended."""
        self.mark_broken(traceback)
        which = ", ".join(map(str, plan.indices))
        cause = f"slot {which}'s reset" if len(plan.indices) == 1 else f"the reset of slots {which}"
        failure = SimFailed(f"sim raised during reset: {self.broken_reason}")
        for s in plan.slots:
            if s.connected:  # per-slot reset at bind; a wave's claimers hear it from reset()
                s.end(str(failure), failure)
        return failure, self.break_live(cause)

    def step_failed(self, plan: _Step, traceback: str) -> list[tuple[int, SlotFailure]]:
        """The sim raised during ``plan`` and cannot pin it on a slot: the bridge is broken, every slot
        that acted fails, and so does every other LIVE one at once (it could never step again)."""
        self.mark_broken(traceback)
        # the exception's own line first: it is what a summary line or a report shows
        why = f"sim raised during step: {self.broken_reason}\n{self.broken}"
        failed: list[tuple[int, SlotFailure]] = []
        for s, token, _ in plan.acting:
            if s.token == token:
                failure = SimFailed(f"slot {s.index}: {why}")
                s.end(why, failure)
                failed.append((s.index, failure))
        stepped = ", ".join(str(s.index) for s, _, _ in plan.acting) or "none"
        return failed + self.break_live(f"a step of slots {stepped}")

    def break_live(self, cause: str) -> list[tuple[int, SlotFailure]]:
        """End every LIVE episode of a bridge that ``cause`` broke; returns them, to be told now."""
        ended: list[tuple[int, SlotFailure]] = []
        for s in self.slots:
            if s.state is SlotState.LIVE:
                failure = BridgeBroken(f"slot {s.index}: bridge broken by {cause}: {self.broken_reason}; "
                                       "the pool replaces it")
                s.end(str(failure), failure)
                ended.append((s.index, failure))
        return ended

    # ---------------------------------------------------------------- faults
    def faulted(self, acting: list[tuple[Slot, str | None]], faults: dict[int, str],
                stage: str, intact: Any = ()) -> list[tuple[int, SimFailed]]:
        """The envs of ``faults``' slots raised during a ``stage`` (reset, step) of a sim that isolates
        its slots: each one's episode fails (if it was one of ``acting``, as ``(slot, token)``), its
        env is to be rebuilt (:meth:`to_rebuild`) or, after ``max_faults`` faults, the slot is retired.
        Every other slot is untouched, and so is each slot of ``intact`` (its env is unharmed: the
        claim itself could not be served). Returns the failures to tell the slots' agents now."""
        tokens = {s.index: token for s, token in acting}
        failed: list[tuple[int, SimFailed]] = []
        for i, trace in sorted(faults.items()):
            slot = self.slots[i]
            why = last_line(trace)
            if i not in intact and not (slot.service or "").startswith("retired"):  # (retired stays retired)
                slot.faults += 1
                if slot.faults >= self.max_faults:
                    self._retire(slot, f"its env raised {slot.faults} times (last: {why})")
                else:
                    slot.service = "rebuild"
            if i in tokens and slot.token is not None and slot.token == tokens[i]:
                what = f"slot {i} could not serve this claim" if i in intact else f"slot {i}'s env raised"
                failure = SimFailed(f"{what} during {stage}: {why}; this episode fails, the "
                                    f"bridge's other slots go on\n{trace.rstrip()}")
                slot.end(str(failure), failure)
                failed.append((i, failure))
        return failed

    def to_rebuild(self) -> list[int]:
        """Slots whose env raised and is not rebuilt yet, and that no claim holds (a claimed one is
        rebuilt by its own reset: :attr:`~pytest_hud.bridge.engine.ResetPlan.rebuild`)."""
        return [s.index for s in self.slots
                if s.service == "rebuild" and s.state in (SlotState.FREE, SlotState.DONE)]

    def rebuilt(self, index: int, error: str | None) -> None:
        """Slot ``index``'s env was rebuilt (``error`` None) or its rebuild raised: it is retired."""
        slot = self.slots[index]
        if slot.service != "rebuild":
            return
        if error is None:
            slot.service = None
        else:
            self._retire(slot, f"its env could not be rebuilt ({last_line(error)})")

    def _retire(self, slot: Slot, why: str) -> None:
        slot.service = f"retired: {why}"
        left = self.in_service
        self.notes.append(f"slot {slot.index} retired: {why}; the bridge runs on {left} of {len(self.slots)} slots")
        if not left:
            self.mark_broken(f"every slot of this bridge was retired: {why}")

