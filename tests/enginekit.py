"""The bridge engine's test bench: a contract, a fake in-memory batch for the vectorized sim, and
the moves the server makes (claim, bind, reset, act, tick), as plain function calls."""

from __future__ import annotations

import numpy as np

from pytest_hud.core.contract import Contract, Feature
from pytest_hud.sim.base import StepBatch
from pytest_hud.bridge.engine import BridgeEngine, ResetPlan, TickPlan, Timeouts
from pytest_hud.bridge.slots import Slot

CONTRACT = Contract(
    features={
        "state": Feature("state", "observation", "state", "float32", (2,), ["seed", "step"]),
        "action": Feature("action", "action", "box", "float32", (1,), ["a"], [-1.0], [1.0]),
    },
    control_rate=10.0,
)
TIMEOUTS = Timeouts(claim=30.0, first_action=300.0, step=5.0)


class FakeBatch:
    """An in-memory vectorized sim: slot i's state is ``[seed, steps since reset]``.

    An episode lasts ``length`` steps, earns ``seed / length`` per step and succeeds at its end when
    the seed is above 4; a seed of 100 or more is "already solved" at reset.
    """

    def __init__(self, width: int, length: int = 3) -> None:
        self.width, self.length = width, length
        self.seed, self.t = np.zeros(width), np.zeros(width)
        self.resets: list[list[int]] = []
        self.actions: list[np.ndarray] = []
        self.stepped: list[list[int]] = []

    def reset(self, plan: ResetPlan):
        self.resets.append(list(plan.indices))
        for i, seed in zip(plan.indices, plan.seeds):
            self.seed[i], self.t[i] = seed or 0, 0
        flags = np.array([self.seed[i] >= 100 for i in plan.indices])
        return flags, {k: v[plan.indices] for k, v in self.observe().items()}

    def step(self, plan: TickPlan):
        """Steps every slot, or (ready mode) only those in ``plan.mask``; ``stepped`` logs which."""
        for i in plan.park:
            self.seed[i] = self.t[i] = 0
            self.resets.append([i])
        self.actions.append(plan.actions.copy())
        stepped = np.ones(self.width, bool) if plan.mask is None else plan.mask
        self.stepped.append(np.flatnonzero(stepped).tolist())
        self.t += stepped
        done = (self.t >= self.length) & stepped
        batch = StepBatch(np.where(stepped, self.seed / self.length, 0.0), done, np.zeros(self.width, bool),
                          done & (self.seed > 4))
        return batch, self.observe()

    def observe(self):
        return {"state": np.stack([self.seed, self.t], axis=1).astype(np.float32)}


def make(width: int = 2, length: int = 3, **kwargs) -> tuple[BridgeEngine, FakeBatch]:
    kwargs.setdefault("timeouts", TIMEOUTS)
    return BridgeEngine(width, CONTRACT, np.zeros(1, np.float32), **kwargs), FakeBatch(width, length)


def live_slot(engine: BridgeEngine, sim: FakeBatch, seed: int, owner: int = 1, now: float = 0.0) -> Slot:
    """Claim, bind and reset a slot the way the server does; returns it LIVE."""
    slot = engine.claim(owner, {"seed": seed})
    bound = engine.bind(engine.open(now), {"claim": slot.token})
    assert bound is slot
    plan = engine.plan_reset([slot])
    engine.apply_reset(plan, *sim.reset(plan))
    frame = engine.start(slot, now)
    assert list(frame["state"]) == [seed, 0] and frame["terminated"] is False
    return slot


def act(engine: BridgeEngine, *slots: Slot, value: float = 0.0, now: float = 0.0) -> None:
    for slot in slots:
        engine.submit_action(slot, {"actions": np.array([value], np.float32)}, now)


def tick(engine: BridgeEngine, sim: FakeBatch, now: float = 0.0) -> dict[int, dict] | None:
    """One tick if the rules allow it at ``now``: ``{slot index: frame}``, or None when nothing was stepped."""
    plan = engine.tick_rules.plan_tick(now)
    if plan is None:
        return None
    return dict(engine.tick_rules.apply_batch(plan, *sim.step(plan), now=now))



def ready(width: int = 3, window: float = 0.002, **kwargs) -> tuple[BridgeEngine, FakeBatch]:
    return make(width, tick="ready", tick_window=window, **kwargs)

def lanes(width: int = 4, length: int = 3, lane_of=(0, 0, 1, 1)) -> tuple[BridgeEngine, FakeBatch]:
    return make(width, length, tick="lanes", lanes=tuple(lane_of))


def lane_tick(engine: BridgeEngine, sim: FakeBatch, lane: int, now: float = 0.0) -> dict[int, dict] | None:
    plan = engine.tick_rules.plan_lane(lane)
    if plan is None:
        return None
    assert plan.lane == lane
    return dict(engine.tick_rules.apply_batch(plan, *sim.step(plan), now=now))
