"""The sim calls a bridge runs on the sim's thread: a reset, a tick's step, a lane's end, each observed.

Each is one function so that one trip to the sim's thread (:mod:`.mainthread`) does the whole
sequence (rebuild, reset or park, step, observe), and the loop thread never touches the sim. A
fault of one slot's env rides along in a :class:`~pytest_hud.sim.base.FaultLog` instead of
aborting the call, so the others' results still come back. :func:`explain` names the fix in a
sim's traceback when the fix is the bridge's layout.
"""

from __future__ import annotations

import json
import traceback

import numpy as np

from pytest_hud.sim.base import FaultLog, VectorSim

__all__ = ["explain", "park_step_observe", "reset_and_observe"]


def reset_and_observe(sim: VectorSim, idx, seeds, options, tasks=None, rebuild=()):
    """Reset slots ``idx`` (after rebuilding the envs of ``rebuild``); returns their success flags
    at reset, their observation rows, and ``{slot: traceback}`` for slots whose envs raised."""
    faults = FaultLog()
    for i in rebuild:
        try:
            sim.rebuild_slot(i)
        except Exception:  # noqa: BLE001 - that slot's claim fails, the others reset
            faults[i] = traceback.format_exc()
    live = [n for n, i in enumerate(idx) if i not in faults]
    flags = np.zeros(len(idx), bool)
    if live:
        idx_, seeds_, options_ = [idx[n] for n in live], [seeds[n] for n in live], [options[n] for n in live]
        if tasks is not None:  # a multi-task sim takes each slot's task (and options) itself
            got = faults.call(sim.reset_slots, idx_, seeds_, options_, tasks=[tasks[n] for n in live])
        elif len({json.dumps(o, sort_keys=True, default=str) for o in options_}) > 1:
            # options differ: one reset call per slot keeps each slot's options its own
            got = np.concatenate([faults.call(sim.reset_slots, [i], [s], [o])
                                  for i, s, o in zip(idx_, seeds_, options_)])
        else:
            got = faults.call(sim.reset_slots, idx_, seeds_, options_)
        flags[live] = np.asarray(got, bool)
    return flags, {k: v[idx] for k, v in sim.observe().items()}, faults  # fancy indexing copies the rows


def park_step_observe(sim: VectorSim, park: list[int], actions: np.ndarray, mask: np.ndarray | None = None,
                      unread: np.ndarray | None = None):
    """Park finished slots, step (``mask``: only those slots; ``unread``: slots whose images no one
    reads, :meth:`VectorSim.skip_renders`), observe; slot faults ride along."""
    faults = FaultLog()
    if park:
        if getattr(sim, "tasks", ()):  # a None task: the episode is over, idle until the next claim
            faults.call(sim.reset_slots, park, [None] * len(park), [None] * len(park), tasks=[None] * len(park))
        else:
            faults.call(sim.reset_slots, park, [None] * len(park), [None] * len(park))
        if faults:  # a parked env that raised is not stepped: it is rebuilt
            mask = np.ones(sim.width, bool) if mask is None else mask.copy()
            mask[list(faults)] = False
    if unread is not None:
        sim.skip_renders(unread)
    batch = faults.call(sim.step, actions) if mask is None else faults.call(sim.step_slots, actions, mask)
    return batch, sim.observe(), faults


_OWN_LOOP = ("cannot be called from a running event loop", "This event loop is already running")


def explain(trace: str) -> str:
    """A sim's traceback, with the fix named on its last line when the fix is the bridge's layout:
    a sim that runs an asyncio loop of its own inside a call cannot share a thread with the
    serving loop."""
    lines = trace.rstrip().splitlines()
    if lines and any(marker in lines[-1] for marker in _OWN_LOOP):
        lines[-1] += ("; this sim runs an asyncio event loop of its own, so serve it with its sockets "
                      "on another thread: --hud-io-thread (bridge: --io-thread)")
    return "\n".join(lines)
