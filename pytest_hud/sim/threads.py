"""Sub-envs stepped on threads: ``--hud-vectorization=threads``.

For sims whose step spends its time in C code that releases the GIL (physics engines such as
MuJoCo or Chipmunk/pymunk, image resizing), stepping a bridge's independent envs on several threads
uses several cores from one bridge process, with no process per env and no copies between
processes. Each env has one owner thread for its whole life (built, reset, stepped and closed
there), since some libraries tie state to the thread that made it (a GL context current on one
thread cannot be made current on another until released). Env ``i`` lives on thread
``i % threads``; a call runs each thread's envs in slot order, and returns when all are done.

The result of every env call is what the same call returns on the bridge's thread, provided the
env is safe to run on several threads at once: only which core runs it changes, so episodes are
identical whatever the vectorization (tests prove it for gymnasium's state envs). Not every env is:
gymnasium's classic-control rendering (pygame) was seen to differ in a few pixels now and then
when several instances render at once. :func:`check_threads` (``python -m pytest_hud.sim TARGET
--check-threads``) compares a seeded run on threads with one on a single thread.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["EnvThreads", "check_threads", "default_threads"]

T = TypeVar("T")


def default_threads(width: int) -> int:
    """One thread per core the process may use, never more than the bridge's slots."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(width, cores))


class EnvThreads:
    """``threads`` owner threads for envs ``0 .. width-1`` (env ``i`` on thread ``i % threads``)."""

    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        self.threads = threads
        self._owners = [ThreadPoolExecutor(1, thread_name_prefix=f"hud-env-{k}") for k in range(threads)]
        self._closed = False

    def map(self, fn: Callable[[int], T], indices: Sequence[int]) -> list[T]:
        """``[fn(i) for i in indices]``, each call on env ``i``'s owner thread; in ``indices`` order.

        Every owner finishes its share before this returns; if any call raised, the first error
        (in slot order) is raised then, so no env is still running when the caller handles it.
        """
        if self._closed:
            raise RuntimeError("the env threads are closed")
        groups: dict[int, list[int]] = {}
        for i in indices:
            groups.setdefault(i % self.threads, []).append(i)

        def run(share: list[int]) -> list[tuple[int, Any, BaseException | None]]:
            out = []
            for i in share:
                try:
                    out.append((i, fn(i), None))
                except BaseException as exc:  # noqa: BLE001 - raised below, after every owner is done
                    out.append((i, None, exc))
            return out

        futures: list[Future] = [self._owners[k].submit(run, share) for k, share in groups.items()]
        results: dict[int, Any] = {}
        errors: dict[int, BaseException] = {}
        for future in futures:
            for i, value, error in future.result():
                if error is not None:
                    errors[i] = error
                else:
                    results[i] = value
        if errors:
            raise errors[min(errors)]
        return [results[i] for i in indices]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for owner in self._owners:
            owner.shutdown(wait=True)


# ------------------------------------------------------------------ the check
def _random_actions(feature: Any, width: int, rng: Any) -> Any:
    """A batch of actions drawn within the contract's bounds (zeros where it gives none)."""
    import numpy as np

    shape = (width, *feature.shape)
    if feature.type == "discrete":
        return rng.integers(int(feature.low[0]), int(feature.high[0]) + 1, (width,)).astype(feature.dtype)
    if feature.type in ("multi_discrete", "multi_binary") or feature.low is None or feature.high is None:
        return np.zeros(shape, feature.dtype)
    low = np.nan_to_num(np.asarray(feature.low, np.float64).reshape(feature.shape), nan=-1.0, neginf=-1.0,
                        posinf=1.0)
    high = np.nan_to_num(np.asarray(feature.high, np.float64).reshape(feature.shape), nan=1.0, neginf=-1.0,
                         posinf=1.0)
    return rng.uniform(np.maximum(low, -1e6), np.minimum(high, 1e6), shape).astype(feature.dtype)


def _trajectory(target: str, width: int, ticks: int, vectorization: str,
                build_args: dict[str, Any] | None) -> list[tuple[str, int, Any]]:
    """Seeded episodes with random actions, batched and per-slot steps and per-slot resets as a
    bridge makes them; every value the sim hands out, in order, as ``(what, tick, value)``."""
    import numpy as np

    from .target import load_sim

    sim = load_sim(target, width, vectorization, build_args)
    try:
        rng = np.random.default_rng(0)
        feature = sim.contract().action
        seen: list[tuple[str, int, Any]] = []
        seed = 0

        def reset(slots: list[int], tick: int) -> None:
            nonlocal seed
            seeds = list(range(seed, seed + len(slots)))
            seed += len(slots)
            flags = sim.reset_slots(slots, seeds, [None] * len(slots))
            seen.append(("reset success flags", tick, np.asarray(flags).copy()))
            for key, value in sim.observe().items():
                seen.append((f"observation {key!r}", tick, np.array(value)))

        reset(list(range(width)), 0)
        for tick in range(1, ticks + 1):
            actions = _random_actions(feature, width, rng)
            if sim.supports_slot_step and tick % 2:
                mask = rng.uniform(size=width) < 0.7
                batch = sim.step_slots(actions, mask)
            else:
                batch = sim.step(actions)
            for what in ("rewards", "terminated", "truncated", "success", "score"):
                value = getattr(batch, what)
                seen.append((what, tick, None if value is None else np.array(value)))
            for key, value in sim.observe().items():
                seen.append((f"observation {key!r}", tick, np.array(value)))
            ended = np.flatnonzero(batch.terminated | batch.truncated).tolist()
            if ended:
                reset(ended, tick)
        return seen
    finally:
        sim.close()


def check_threads(target: str, width: int, ticks: int = 100,
                  build_args: dict[str, Any] | None = None) -> str | None:
    """Run the same seeded episodes with ``sync`` and with ``threads`` vectorization and compare
    everything the sim hands out. None when identical, else the first difference in words.

    An env that keeps state shared between its instances outside the GIL's protection (a C
    library's global buffers, say) can give different results when its instances step on several
    threads at once; this shows it before a run relies on ``--hud-vectorization=threads``. A pass
    is evidence, not proof: races need not show in every run (raise ``ticks``).
    """
    import numpy as np

    reference = _trajectory(target, width, ticks, "sync", build_args)
    threaded = _trajectory(target, width, ticks, "threads", build_args)
    for (what, tick, want), (_, _, got) in zip(reference, threaded):
        if want is None and got is None:
            continue
        if want is None or got is None or want.shape != got.shape or not np.array_equal(want, got, equal_nan=True):
            rows = []
            if want is not None and got is not None and want.shape == got.shape and want.ndim:
                differs = np.asarray(want != got).reshape(len(want), -1).any(axis=1)
                rows = np.flatnonzero(differs).tolist()
            where = f", slot(s) {rows}" if rows else ""
            return (f"{what} differs at tick {tick}{where} between --vectorization sync and threads: this env "
                    "is not safe to step on several threads at once; use sync or processes")
    if len(reference) != len(threaded):
        return "the two runs handed out different numbers of values (episodes ended at different ticks)"
    return None
