"""Replays for videos, as plain calls: what the tape keeps, what counts as the same episode, and the
agent's fallback when a sim does not replay exactly (every later step renders, a warning says why).
The end to end (a real bridge, bit-identical videos, renders counted) is ``tests/e2e/test_replayed_videos.py``."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from pytest_hud.agent.episode_loop import EpisodeLoop
from pytest_hud.agent.loop import Agent
from pytest_hud.agent.replay import ReplayMismatch, ReplayWarning, Tape, check_replay, replayed_frames
from pytest_hud.core.contract import Contract, Feature

CONTRACT = Contract(
    features={
        "state": Feature("state", "observation", "state", "float32", (2,), ["a", "b"]),
        "action": Feature("action", "action", "box", "float32", (1,), ["a"], [-1.0], [1.0]),
    },
    control_rate=10.0,
)
WITH_CAMERA = Contract(
    features={**CONTRACT.features, "image": Feature("image", "observation", "rgb", "uint8", (4, 4, 3), [])},
    control_rate=10.0,
)


def frame(t: float) -> dict:
    return {"state": np.array([t, -t], np.float32), "terminated": False}


def test_the_tape_keeps_every_action_and_only_the_rendered_frames():
    tape = Tape([])
    loop = EpisodeLoop(SimpleNamespace(predict=lambda obs, prompt=None: np.zeros((3, 1), np.float32)),
                       CONTRACT, tape=tape)
    action = loop.begin(frame(0))
    for t in range(1, 7):
        action = loop.observe(frame(t))
    assert action is not None and len(tape.actions) == 6
    assert sorted(tape.rendered) == [0, 3, 6]  # the reset's frame and each chunk's last
    assert tape.skipped == 4


def test_a_replay_must_give_back_every_rendered_frame_and_the_grade_bit_for_bit():
    tape = Tape([])
    tape.started(frame(0))
    tape.observed(np.zeros(1), frame(1), rendered=False)
    tape.observed(np.zeros(1), frame(2), rendered=True)
    check_replay(tape, [frame(0), frame(9), frame(2)], {"success": False}, {"success": False})
    with pytest.raises(ReplayMismatch, match="'state' differs at step 2"):
        check_replay(tape, [frame(0), frame(1), frame(2.5)])
    with pytest.raises(ReplayMismatch, match="success"):
        check_replay(tape, [frame(0), frame(1), frame(2)], {"success": False}, {"success": True})
    with pytest.raises(ReplayMismatch):  # the same values in another dtype are not the same bits
        check_replay(tape, [frame(0), frame(1), {**frame(2), "state": np.array([2, -2], np.float64)}])


def test_an_episode_whose_frames_were_all_rendered_needs_no_replay():
    tape = Tape([])
    tape.started(frame(0))
    tape.observed(np.zeros(1), frame(1), rendered=True)
    episode = SimpleNamespace(rerun=lambda: pytest.fail("replayed an episode it had every frame of"))
    assert [f["state"][0] for f in replayed_frames(episode, tape, 1, 1.0)] == [0, 1]


def chunking_agent(*observers) -> Agent:
    """An agent whose model plans 4-action chunks of zeros, with ``observers``."""
    return Agent(SimpleNamespace(predict=lambda obs, prompt=None: np.zeros((4, 1), np.float32)),
                 observers=list(observers))


def claimed(contract: Contract, seed: int | None = 3, token: str = "t") -> SimpleNamespace:
    """An episode as the agent sees it once claimed: its token, seed and contract."""
    return SimpleNamespace(token=token, seed=seed, contract=contract, prompt=None, grade_data={})


class Replaying:
    replays = True

    def __init__(self):
        self.starts = 0

    def wants_replay(self, result, error):
        return True

    def on_start(self, episode, observation):
        self.starts += 1

    def on_step(self, action, observation, inference_s):
        pass

    def on_end(self, episode, result, error):
        pass


def test_a_replay_that_differs_warns_and_every_later_step_renders(monkeypatch):
    recorder = Replaying()
    agent = chunking_agent(recorder)
    episode = claimed(WITH_CAMERA)
    loop = agent._start(episode, 2)
    assert loop.tape is not None and loop.observers == []  # the recorder waits for the replay
    loop.begin(frame(0))
    loop.observe(frame(1))
    monkeypatch.setattr("pytest_hud.agent.loop.replayed_frames",
                        lambda *a, **k: (_ for _ in ()).throw(ReplayMismatch("the replay's 'state' differs")))
    with pytest.warns(ReplayWarning, match="did not replay exactly"):
        agent._replay(episode, loop, SimpleNamespace(success=False), None)
    assert recorder.starts == 0 and agent.replays_exact is False
    later = agent._start(episode, 2)
    assert later.tape is None and later.observers == [recorder] and later.reads_next


def test_a_sim_without_cameras_keeps_no_tape_and_its_observers_see_every_step():
    recorder = Replaying()
    agent = chunking_agent(recorder)
    state_only = claimed(CONTRACT)
    loop = agent._start(state_only, 2)
    assert loop.tape is None and loop.observers == [recorder]  # nothing to skip, nothing to replay
    with_camera = claimed(WITH_CAMERA, token="u")
    assert agent._start(with_camera, 2).tape is not None
    unseeded = claimed(WITH_CAMERA, seed=None, token="v")
    assert agent._start(unseeded, 2).tape is None  # a replay needs the seed the episode was claimed with


class VideosOfFailures(Replaying):
    def wants_replay(self, result, error):
        return error is not None or not result.success


def test_episodes_render_live_while_most_of_them_would_be_replayed_and_tape_again_when_few_are():
    # A replay runs the whole episode again with every frame: for a policy that fails nearly every
    # episode (with videos of failures) skipping frames and replaying costs more than rendering them.
    agent = chunking_agent(VideosOfFailures())
    episode = claimed(WITH_CAMERA)
    failed, passed = SimpleNamespace(success=False), SimpleNamespace(success=True)
    assert agent._start(episode, 2).tape is not None  # nothing known yet: skip and replay
    agent._count(failed, None)
    assert agent._start(episode, 2).tape is None  # 1 of 1 wanted: render live
    agent._count(passed, None)
    assert agent._start(episode, 2).tape is not None  # 1 of 2
    agent._count(None, "the model raised")
    agent._count(failed, None)
    assert agent._start(episode, 2).tape is not None  # 3 of 4 is not above three in four...
    agent._count(failed, None)
    assert agent._start(episode, 2).tape is None  # ...4 of 5 is
    for _ in range(3):
        agent._count(passed, None)
    assert agent._start(episode, 2).tape is not None  # 4 of 8
    assert agent._start(episode, 2, failed_before=True).tape is None  # it failed last run: live


def test_an_episode_that_failed_last_run_renders_live_from_the_first_one_on():
    agent = chunking_agent(VideosOfFailures())
    episode = claimed(WITH_CAMERA)
    assert agent._start(episode, 2, failed_before=True).tape is None  # no share yet, but likely wanted
    assert agent._start(episode, 2).tape is not None  # the others still skip and replay


def test_a_replay_s_time_is_on_the_result_and_the_record_starts_before_it(monkeypatch):
    from pytest_hud.core.results import EpisodeRecord, EpisodeResult

    recorder = VideosOfFailures()
    agent = chunking_agent(recorder)
    episode = claimed(WITH_CAMERA)
    loop = agent._start(episode, 2)
    loop.begin(frame(0))
    loop.observe(frame(1))
    clock = iter([100.0, 102.5])
    monkeypatch.setattr("pytest_hud.agent.loop.time", SimpleNamespace(monotonic=lambda: next(clock)))
    monkeypatch.setattr("pytest_hud.agent.loop.replayed_frames", lambda *a, **k: [frame(0), frame(1)])
    result = EpisodeResult(success=False, score=0.0, total_reward=0.0, steps=1, duration_s=4.0)
    agent._replay(episode, loop, result, None)
    assert result.replay_s == 2.5 and recorder.starts == 1
    record = EpisodeRecord(nodeid="t.py::test", task="t.py::test", episode="seed=3", outcome="failed",
                           success=False)
    record.take_result(result)
    record.finished_at = 1000.0
    assert record.started_at == 1000.0 - 4.0 - 2.5  # the report came after the replay
