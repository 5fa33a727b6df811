"""A bridge's slots split across a few processes: ``--hud-vectorization=processes``.

For targets whose slots are independent envs (single-env targets, and factories taking
``num_envs`` whose sim steps slots one at a time: ``supports_slot_step``, e.g. a
:class:`~pytest_hud.sim.multitask.MultiTaskSim` such as Meta-World MT10) and whose step costs
milliseconds of CPU (rendering, physics), one bridge process steps its envs one after another on
one core. ``async`` vectorization puts every env in a
process of its own (gymnasium's ``AsyncVectorEnv``): on a machine with fewer cores than slots that
is many processes to boot and to wake every tick. ``processes`` starts one process per core (never
more than the slots) and gives each a contiguous block of slots, served by the same ``sync``
adapter a one-process bridge uses (or, for a ``num_envs`` factory, the factory's own sim of the
block's width); a call goes to every process concerned at once and returns when
all have answered. Each env lives in one process for its whole life and nothing is shared between
processes, so every episode is what it is under ``sync`` (a test proves it).

The processes are spawned (no forked GL contexts or threads). Each exits when its bridge closes it,
when its pipe to the bridge closes, or when the bridge's process is gone (checked every second),
so a killed bridge leaves none behind.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from pytest_hud.core.contract import Contract
from pytest_hud.sim.base import FaultLog, SlotFaults, StepBatch, VectorSim, sim_stats
from pytest_hud.sim.claims import ClaimRules

__all__ = ["LaneStep", "ProcessSim"]

_BATCH_FIELDS = ("rewards", "terminated", "truncated", "success", "score")


def _batch_fields(batch: StepBatch) -> tuple[Any, ...]:
    return tuple(getattr(batch, name) for name in _BATCH_FIELDS)


def _exit_with_parent(parent: int) -> None:
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(1)


def _serve(conn: Any, parent: int, build: Callable[..., VectorSim], target: str, width: int,
           build_args: dict[str, Any], control_rate: float | None) -> None:
    """A block's process: build the sim, then answer the bridge's calls until closed."""
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True, name="hud-parent-watch").start()
    try:
        sim = build(target, width, build_args, control_rate)
        conn.send(("ok", (sim.contract().to_dict(), sim.supports_slot_step, sim.supports_slot_reset,
                          sim.observe(), tuple(getattr(sim, "tasks", ()) or ()), sim_stats(sim),
                          sim.isolates_slots, sim.claim_rules.to_dict(),
                          dict(getattr(sim, "instructions", {}) or {}), getattr(sim, "instruction", None))))
    except BaseException:  # noqa: BLE001 - the bridge reports it with the target
        conn.send(("error", traceback.format_exc()))
        return
    try:
        while True:
            try:
                call, args = conn.recv()
            except (EOFError, OSError):
                return  # the bridge is gone
            if call == "close":
                sim.close()
                conn.send(("ok", None))
                return
            faults = FaultLog()
            try:
                if call == "rebuild":
                    sim.rebuild_slot(*args)
                    conn.send(("ok", None))
                    continue
                rows: list[int] | None  # the slots whose observations changed (None: all)
                if call == "reset":
                    indices, seeds, options, tasks = args
                    # a multi-task sim takes each slot's task; other sims are never passed one
                    kwargs = {} if tasks is None else {"tasks": tasks}
                    flags = faults.call(sim.reset_slots, indices, seeds, options, **kwargs)
                    out: Any = (flags, sim_stats(sim))  # its counters change on resets (env builds)
                    rows = sorted(set(indices))
                elif call == "steps":  # a lane's run of steps: one answer per step, in one message
                    conn.send(("steps", _steps(sim, args[0])))
                    continue
                else:  # "step" (every slot) or "step_slots" (those of the mask)
                    actions, mask, unread = args
                    conn.send(("called", _step(sim, actions, mask if call == "step_slots" else None, unread)))
                    continue
                conn.send(("called", (out, _rows(sim.observe(), rows), dict(faults), sorted(faults.intact))))
            except BaseException:  # noqa: BLE001 - raised in the bridge, which marks itself broken
                conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()


def _step(sim: VectorSim, actions: Any, mask: Any, unread: Any) -> tuple[Any, ...]:
    """One step of a block (``mask`` None: every slot; ``unread``: flags for this step's renders
    only) and its answer: the batch's fields, the stepped slots' observation rows, the slots whose
    envs raised (block-local) and those left intact."""
    faults = FaultLog()
    if unread is not None:
        sim.skip_renders(unread)
    if mask is None:
        out, rows = _batch_fields(faults.call(sim.step, actions)), None
    else:
        out, rows = _batch_fields(faults.call(sim.step_slots, actions, mask)), np.flatnonzero(mask).tolist()
    return out, _rows(sim.observe(), rows), dict(faults), sorted(faults.intact)


def _steps(sim: VectorSim, steps: list[tuple[Any, Any, Any]]) -> list[tuple[Any, ...]]:
    """``steps`` (a block's ``(actions, mask, unread)`` of each step) back to back, each one's
    answer as :func:`_step`'s; the run stops after a step where a slot's env raised or an episode
    ended, so that the bridge decides what follows, as it does after a single step."""
    answers = []
    for actions, mask, unread in steps:
        answer = _step(sim, actions, mask, unread)
        answers.append(answer)
        out, faults = answer[0], answer[2]
        if faults or (np.asarray(out[1], bool) | np.asarray(out[2], bool))[mask].any():
            break
    return answers


def _rows(obs: dict[str, np.ndarray], rows: list[int] | None) -> tuple[list[int] | None, dict[str, np.ndarray]]:
    """What an answer carries of a block's observations: the rows of the slots a call reset or
    stepped (the others are as the bridge last saw them), or all of them (``rows`` None)."""
    if rows is None:
        return None, obs
    return rows, {key: value[rows] for key, value in obs.items()}


class _Block:
    """One process and the slots ``start .. stop-1`` it serves."""

    def __init__(self, ctx: Any, start: int, stop: int, build: Callable[..., VectorSim], target: str,
                 build_args: dict[str, Any], control_rate: float | None) -> None:
        self.start, self.stop = start, stop
        self.stats: Any = None  # its sim's counters (``stats()``), as of its last reset
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, os.getpid(), build, target, stop - start,
                                                       build_args, control_rate),
                                   daemon=True, name=f"hud-envs-{start}-{stop - 1}")
        self.process.start()
        child.close()

    @property
    def slots(self) -> str:
        return f"slot {self.start}" if self.stop - self.start == 1 else f"slots {self.start}-{self.stop - 1}"

    def send(self, call: str, *args: Any) -> None:
        try:
            self.conn.send((call, args))
        except (OSError, EOFError):
            raise self._died() from None

    def answer(self, faults: FaultLog | None = None) -> Any:
        """The block's answer; slot faults it reports (block-local indices) go into ``faults``, as
        the bridge's slot indices."""
        try:
            status, value = self.conn.recv()
        except (OSError, EOFError):
            raise self._died() from None
        if status == "error":
            raise RuntimeError(f"the env process of {self.slots} raised:\n{value.rstrip()}")
        if status == "called":  # a reset's or a step's answer, with the slots whose envs raised
            out, obs, local, intact = value
            if faults is not None:
                faults.add(local, intact, offset=self.start)
            return out, obs
        return value  # (a run of steps: each one's answer, its faults in it: :class:`LaneStep`)

    def _died(self) -> RuntimeError:
        self.process.join(1.0)
        return RuntimeError(f"the env process of {self.slots} died (exit code {self.process.exitcode})")


class ProcessSim(VectorSim):
    """``width`` slots in ``processes`` spawned processes, each a ``sync`` sim of a block of slots."""

    vectorization = "processes"

    def __init__(self, target: str, width: int, build_args: Mapping[str, Any] | None = None,
                 control_rate: float | None = None, processes: int = 2, *,
                 build: Callable[..., VectorSim]) -> None:
        super().__init__(width)
        n = max(1, min(int(processes), self.width))
        bounds = [round(k * self.width / n) for k in range(n + 1)]
        ctx = multiprocessing.get_context("spawn")
        # each process builds its block's sim with ``build(target, width, build_args, control_rate)``: a
        # module-level function (sent by reference), the loader's ``sync`` path
        self._blocks: list[_Block] = []
        self._closed = False
        try:
            for start, stop in zip(bounds, bounds[1:]):
                self._blocks.append(_Block(ctx, start, stop, build, target, dict(build_args or {}), control_rate))
            hellos = [block.answer() for block in self._blocks]
        except BaseException:
            self.close()
            raise
        # every block serves the same target, so the first block's contract (and tasks) is every block's
        self._contract = Contract.from_dict(hellos[0][0])
        self.supports_slot_step = all(h[1] for h in hellos)
        self.supports_slot_reset = all(h[2] for h in hellos)
        self._obs = {key: np.concatenate([h[3][key] for h in hellos]) for key in hellos[0][3]}
        self.tasks = hellos[0][4]
        self.isolates_slots = all(h[6] for h in hellos)  # each env lives in one block's process
        self.claim_rules = ClaimRules.from_dict(hellos[0][7])
        self.instructions, self.instruction = hellos[0][8], hellos[0][9]
        for block, hello in zip(self._blocks, hellos):
            block.stats = hello[5]
        self.lanes = tuple(k for k, block in enumerate(self._blocks) for _ in range(block.start, block.stop))
        self.supports_lane_ticks = self.supports_slot_step and len(self._blocks) > 1
        self._in_flight: set[int] = set()  # lanes whose step was begun and not yet ended
        self._unread: np.ndarray | None = None  # skip_renders' flags, for the next step

    def contract(self) -> Contract:
        return self._contract

    def _take(self, block: _Block, answer: tuple[list[int] | None, dict[str, np.ndarray]]) -> None:
        rows, obs = answer
        at: Any = slice(block.start, block.stop) if rows is None else [block.start + r for r in rows]
        for key, values in obs.items():
            self._obs[key][at] = values

    def _gather(self, blocks: list[_Block], faults: FaultLog | None = None) -> list[Any]:
        """Every block's answer (all of them, even after one raised: the pipes stay in step); the
        slots whose envs raised, in blocks that isolate them, go into ``faults``."""
        answers, error = [], None
        for block in blocks:
            try:
                answers.append(block.answer(faults))
            except RuntimeError as exc:
                answers.append(None)
                error = error or exc
        if error is not None:
            raise error
        return answers

    def reset_slots(self, indices: Sequence[int], seeds: Sequence[int | None],
                    options: Sequence[Mapping[str, Any] | None],
                    tasks: Sequence[str | None] | None = None) -> np.ndarray:
        self._idle("reset")
        shares = []  # (block, positions in ``indices`` of its slots)
        for block in self._blocks:
            ns = [n for n, slot in enumerate(indices) if block.start <= slot < block.stop]
            if ns:
                block.send("reset", [indices[n] - block.start for n in ns], [seeds[n] for n in ns],
                           [options[n] for n in ns], None if tasks is None else [tasks[n] for n in ns])
                shares.append((block, ns))
        flags = np.zeros(len(indices), bool)
        faults = FaultLog()
        for (block, ns), ((block_flags, stats), obs) in zip(shares, self._gather([b for b, _ in shares], faults)):
            flags[ns] = np.asarray(block_flags, bool)
            block.stats = stats
            self._take(block, obs)
        if faults:
            raise SlotFaults(faults, flags, faults.intact)
        return flags

    def skip_renders(self, unread: np.ndarray) -> None:
        """Kept for the next step, whose call takes each block its flags (one message, not two)."""
        self._unread = np.asarray(unread, bool).copy()

    def _step_args(self, block: _Block, actions: np.ndarray, mask: np.ndarray | None,
                   unread: np.ndarray | None) -> tuple[Any, ...]:
        """A block's share of a step: its actions, mask and render flags (None when it reads all)."""
        rows = slice(block.start, block.stop)
        flags = None if unread is None or not unread[rows].any() else unread[rows]
        return actions[rows], None if mask is None else mask[rows], flags

    def step(self, actions: np.ndarray) -> StepBatch:
        self._idle("step")
        unread, self._unread = self._unread, None
        for block in self._blocks:
            block.send("step", *self._step_args(block, actions, None, unread))
        return self._faulted(self._blocks)

    def step_slots(self, actions: np.ndarray, mask: np.ndarray) -> StepBatch:
        self._idle("step_slots")
        if not self.supports_slot_step:
            raise NotImplementedError("only a SyncVectorEnv with autoreset disabled steps a subset of slots")
        unread, self._unread = self._unread, None
        blocks = [b for b in self._blocks if mask[b.start:b.stop].any()]
        for block in blocks:
            block.send("step_slots", *self._step_args(block, actions, mask, unread))
        return self._faulted(blocks)

    def _faulted(self, blocks: list[_Block]) -> StepBatch:
        """The blocks' step answers as one batch; :class:`SlotFaults` with it when some envs raised."""
        faults = FaultLog()
        batch = self._batch(blocks, self._gather(blocks, faults))
        if faults:
            raise SlotFaults(faults, batch, faults.intact)
        return batch

    def rebuild_slot(self, index: int) -> None:
        """A new env for slot ``index``, built in the process that holds it."""
        block = next(b for b in self._blocks if b.start <= index < b.stop)
        self._idle("rebuild_slot")
        block.send("rebuild", index - block.start)
        block.answer()

    # Lane ticks (``--hud-tick=lanes``): a block's steps are sent, and their answer read once the
    # pipe is readable, while other blocks' steps are under way. A block has at most one call in
    # flight: a run of steps its slots have queued (a frame of several actions each) goes down the
    # pipe in one message and comes back in one, not in a round trip per step.
    def lane_begin(self, lane: int,
                   steps: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray | None]]) -> None:
        """Start stepping the slots of block ``lane``, ``steps`` times in a row: each step's
        ``(actions, mask, unread)`` (``[N]``: only the slots where ``mask`` is True step; ``unread``:
        see :meth:`skip_renders`); returns at once. The block stops early after a step where a
        slot's env raised or an episode ended."""
        block = self._blocks[lane]
        if lane in self._in_flight:
            raise RuntimeError(f"the env process of {block.slots} is already stepping")
        block.send("steps", [self._step_args(block, *step) for step in steps])
        self._in_flight.add(lane)

    def lane_fileno(self, lane: int) -> int:
        """The file descriptor that becomes readable when block ``lane``'s steps have answered."""
        return self._blocks[lane].conn.fileno()

    def lane_end(self, lane: int) -> list[LaneStep]:
        """Block ``lane``'s steps (begun by :meth:`lane_begin`), the ones taken: as many as were
        sent, or fewer when one ended an episode or faulted."""
        block = self._blocks[lane]
        self._in_flight.discard(lane)
        return [LaneStep(self, block, answer) for answer in block.answer()]

    def _idle(self, call: str) -> None:
        if self._in_flight:
            raise RuntimeError(f"{call} while a lane step is under way (block {sorted(self._in_flight)})")

    def _batch(self, blocks: list[_Block], answers: list[Any], take: bool = True) -> StepBatch:
        n = self.width
        fields = {"rewards": np.zeros(n), "terminated": np.zeros(n, bool), "truncated": np.zeros(n, bool),
                  "success": np.zeros(n, bool)}
        score = None
        for block, (values, obs) in zip(blocks, answers):
            rows = slice(block.start, block.stop)
            for name, value in zip(_BATCH_FIELDS, values):
                if name == "score":
                    if value is not None:
                        if score is None:
                            score = np.full(n, np.nan)
                        score[rows] = value
                else:
                    fields[name][rows] = value
            if take:
                self._take(block, obs)
        return StepBatch(fields["rewards"], fields["terminated"], fields["truncated"], fields["success"], score)

    def observe(self) -> dict[str, np.ndarray]:
        return self._obs

    def stats(self) -> dict[str, Any] | None:
        """The blocks' own counters (a multi-task sim's env builds, ...) as of their last reset, merged:
        numbers add up, per-slot lists join in slot order; None when the sim keeps none. No pipe
        traffic: the bridge asks from its I/O thread while the sim's thread may be stepping."""
        parts = [block.stats for block in self._blocks if block.stats is not None]
        if not parts:
            return None
        merged: dict[str, Any] = {}
        for key in parts[0]:
            values = [part.get(key) for part in parts]
            if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
                merged[key] = sum(values)
            elif all(isinstance(v, list) for v in values):
                merged[key] = [item for v in values for item in v]
            else:
                merged[key] = values
        merged["processes"] = len(self._blocks)
        return merged

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for block in self._blocks:
            try:
                block.send("close")
            except RuntimeError:
                pass
        for block in self._blocks:
            try:
                if block.conn.poll(10.0):
                    block.conn.recv()
            except (OSError, EOFError):
                pass
            block.process.join(5.0)
            if block.process.is_alive():
                block.process.kill()
                block.process.join(5.0)
            block.conn.close()


class LaneStep:
    """One step of a lane's run (:meth:`ProcessSim.lane_end`): its ``[N]`` ``batch`` (other rows
    zero) and ``faults`` (the bridge's slot indices). :meth:`observe` puts its observations in the
    sim's rows and returns :meth:`ProcessSim.observe`: take the steps in order, each one's frames
    packed before the next one's :meth:`observe`."""

    __slots__ = ("_block", "_obs", "_sim", "batch", "faults")

    def __init__(self, sim: ProcessSim, block: _Block, answer: tuple[Any, ...]) -> None:
        out, obs, local, intact = answer
        self._sim, self._block, self._obs = sim, block, obs
        self.faults = FaultLog()
        self.faults.add(local, intact, offset=block.start)
        self.batch = sim._batch([block], [(out, obs)], take=False)

    def observe(self) -> dict[str, np.ndarray]:
        self._sim._take(self._block, self._obs)
        return self._sim.observe()
