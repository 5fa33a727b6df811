"""Which observations anyone reads, as plain calls: the agent's hint, its wire frame, the bridge's flags.

A chunking policy reads one observation per chunk; the agent loop says which others go unread
(``reads_next``), the slot client sends that as ``"render": False`` next to the action, the engine
hands the acting slots' flags to the sim with the tick (``TickPlan.unread``), and a sim made of
gymnasium envs passes each slot's flag to its env. The ends (Meta-World and LIBERO skipping renders,
bit-identical read frames) are in ``tests/e2e/meta_world`` and ``tests/e2e/libero``.
"""

from __future__ import annotations

import numpy as np

from pytest_hud.agent.episode_loop import EpisodeLoop
from pytest_hud.client.protocol import action_frame, unrendered_action_frame
from pytest_hud.core.contract import Contract, Feature
from pytest_hud.recording.trace import TraceRecorder
from pytest_hud.sim.renders import skip_env_renders
from pytest_hud.wire.codec import unpack_action

CONTRACT = Contract(
    features={
        "state": Feature("state", "observation", "state", "float32", (2,), ["a", "b"]),
        "action": Feature("action", "action", "box", "float32", (1,), ["a"], [-1.0], [1.0]),
    },
    control_rate=10.0,
)


class Chunks:
    def __init__(self, size: int) -> None:
        self.size = size

    def predict(self, obs, prompt=None):
        return np.zeros((self.size, 1), np.float32)


class Watcher:
    def __init__(self, reads_images: bool | None) -> None:
        if reads_images is not None:
            self.reads_images = reads_images

    def on_start(self, episode, observation):
        pass

    def on_step(self, action, observation, inference_s):
        pass


def hints(loop: EpisodeLoop, steps: int) -> list[bool]:
    """``reads_next`` after each action the loop gives, for ``steps`` actions."""
    frame = {"state": np.zeros(2, np.float32), "terminated": False}
    out = []
    action = loop.begin(frame)
    while action is not None and len(out) < steps:
        out.append(loop.reads_next)
        action = loop.observe(frame)
    return out


def test_a_chunking_policy_reads_only_the_observation_that_ends_each_chunk():
    assert hints(EpisodeLoop(Chunks(4), CONTRACT), 8) == [False, False, False, True] * 2
    assert hints(EpisodeLoop(Chunks(4), CONTRACT, n_action_steps=2), 6) == [False, True] * 3


def test_a_policy_that_plans_every_step_reads_every_observation():
    assert hints(EpisodeLoop(Chunks(1), CONTRACT), 5) == [True] * 5


def test_observers_and_should_stop_read_every_frame_unless_they_read_no_image():
    assert hints(EpisodeLoop(Chunks(4), CONTRACT, observers=[Watcher(None)]), 4) == [True] * 4  # videos
    assert hints(EpisodeLoop(Chunks(4), CONTRACT, observers=[Watcher(True)]), 4) == [True] * 4
    assert hints(EpisodeLoop(Chunks(4), CONTRACT, observers=[Watcher(False)]), 4) == [False] * 3 + [True]
    assert hints(EpisodeLoop(Chunks(4), CONTRACT, should_stop=lambda obs, step: False), 4) == [True] * 4
    assert TraceRecorder.reads_images is False  # traces keep no image: a traced run still skips


def test_the_unrendered_action_frame_is_the_action_frame_plus_the_hint():
    action = np.array([0.25, -1.0], np.float32)
    plain, hinted = unpack_action(action_frame(action)), unpack_action(unrendered_action_frame(action))
    assert list(plain) == ["actions"]  # what every openpi/0 peer sends: observations rendered
    assert hinted["render"] is False
    np.testing.assert_array_equal(hinted["actions"], action)


def test_the_engine_hands_the_acting_slots_hints_to_the_sim_with_the_tick():
    from pytest_hud.bridge.engine import BridgeEngine, Timeouts

    engine = BridgeEngine(3, CONTRACT, np.zeros(1, np.float32),
                          timeouts=Timeouts(claim=30.0, first_action=300.0, step=5.0))
    slots = []
    for seed in range(3):
        slot = engine.claim(1, {"seed": seed})
        engine.bind(engine.open(0.0), {"claim": slot.token})
        plan = engine.plan_reset([slot])
        engine.apply_reset(plan, np.zeros(1, bool), {"state": np.zeros((1, 2), np.float32)})
        engine.start(slot, 0.0)
        slots.append(slot)
    for slot, render in zip(slots, (True, False, None)):
        frame = {"actions": np.zeros(1, np.float32)}
        if render is not None:
            frame["render"] = render
        engine.submit_action(slot, frame)
    assert engine.tick_rules.plan_tick().unread.tolist() == [False, True, False]
    for slot in slots:
        slot.pending_action = None
        engine.submit_action(slot, {"actions": np.zeros(1, np.float32)})  # no hint: every frame rendered
    assert engine.tick_rules.plan_tick().unread is None


def test_each_slots_env_gets_its_flag_when_it_can_skip_renders():
    class Skipper:
        def __init__(self) -> None:
            self.flags: list[bool] = []

        def hud_skip_render(self, skip: bool) -> None:
            self.flags.append(skip)

    a, b = Skipper(), Skipper()
    skip_env_renders([a, object(), None, b], np.array([True, True, False, False]))
    assert a.flags == [True] and b.flags == [False]
