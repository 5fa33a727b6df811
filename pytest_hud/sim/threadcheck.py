"""``python -m pytest_hud.bridge TARGET --check-threads N``: is this env safe on threads?

Steps a seeded run of ``TARGET`` with ``--hud-vectorization=threads`` and the same run on one
thread, and compares every observation (see :mod:`.threads` for why some envs are not).
"""

from __future__ import annotations

from typing import Any

from pytest_hud.sim.target import load_sim

__all__ = ["check_threads"]


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
