"""The agent loop's core, driven by hand: no bridge, no sockets, just frames in and actions out."""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest

from pytest_hud.agent import episode_loop
from pytest_hud.agent.episode_loop import EpisodeLoop, as_chunk, features, watchdog
from pytest_hud.core.contract import Contract, Feature
from pytest_hud.client.episode import EpisodeError

CONTRACT = Contract(features={
    "state": Feature("state", "observation", "state", "float32", (3,)),
    "action": Feature("action", "action", "box", "float32", (2,)),
})


def frame(value: float = 0.0, terminated: bool = False, **extra) -> dict:
    return {"state": np.full(3, value, np.float32), "terminated": terminated, **extra}


class Chunker:
    """A model that returns chunks of ``size`` actions numbered by call, and logs what it saw."""

    def __init__(self, size: int = 1) -> None:
        self.size = size
        self.seen: list[tuple[dict, str | None]] = []

    def predict(self, observation, prompt=None):
        self.seen.append((observation, prompt))
        call = len(self.seen)
        # action k of call c is [c, k]: tests can tell which chunk an action came from
        return np.array([[call, k] for k in range(self.size)], np.float32)


def drive(loop: EpisodeLoop, frames: list[dict]) -> list[np.ndarray]:
    """Run the loop as a shell would; the bridge answers each action with the next frame."""
    sent = []
    try:
        action = loop.begin(frames[0])
        for next_frame in frames[1:]:
            if action is None:
                break
            sent.append(action)
            action = loop.observe(next_frame)
    finally:
        loop.close()
    assert action is None, "the test ran out of frames before the loop stopped"
    return sent


def test_a_chunk_is_executed_open_loop_before_the_model_is_asked_again():
    model = Chunker(size=3)
    loop = EpisodeLoop(model, CONTRACT)
    sent = drive(loop, [frame(i) for i in range(7)] + [frame(7, terminated=True)])
    assert [a.tolist() for a in sent] == [
        [1, 0], [1, 1], [1, 2], [2, 0], [2, 1], [2, 2], [3, 0],
    ]
    assert len(model.seen) == 3
    # each plan sees the frame of the step it starts at
    assert [float(obs["state"][0]) for obs, _ in model.seen] == [0.0, 3.0, 6.0]
    assert loop.steps == 7


def test_n_action_steps_cuts_each_chunk_and_replans_sooner():
    model = Chunker(size=5)
    loop = EpisodeLoop(model, CONTRACT, n_action_steps=2)
    sent = drive(loop, [frame() for _ in range(5)] + [frame(terminated=True)])
    assert [a.tolist() for a in sent] == [[1, 0], [1, 1], [2, 0], [2, 1], [3, 0]]
    assert len(model.seen) == 3


def test_max_steps_stops_the_agent_before_the_env_ends():
    loop = EpisodeLoop(Chunker(size=4), CONTRACT, max_steps=3)
    sent = drive(loop, [frame() for _ in range(10)])
    assert len(sent) == 3 and loop.steps == 3


def test_max_steps_zero_sends_nothing_and_never_asks_the_model():
    model = Chunker()
    loop = EpisodeLoop(model, CONTRACT, max_steps=0)
    assert loop.begin(frame()) is None
    assert model.seen == [] and loop.steps == 0


def test_a_terminated_first_frame_ends_the_episode_without_an_action():
    model = Chunker()
    loop = EpisodeLoop(model, CONTRACT)
    assert loop.begin(frame(terminated=True)) is None
    assert model.seen == []


def drive_chunks(loop: EpisodeLoop, frames: list[dict]) -> tuple[list[np.ndarray], list[tuple[int, list[bool]]]]:
    """Run the loop as the shells do with a bridge: each open-loop chunk in one frame
    (:meth:`EpisodeLoop.ahead`), its observations fed back one by one."""
    sent, chunks, frames = [], [], iter(frames)
    try:
        action = loop.begin(next(frames))
        while action is not None:
            chunk = loop.ahead(action)
            actions, reads = chunk if chunk is not None else ([action], [loop.reads_next])
            chunks.append((len(actions), reads))
            for sent_action in actions:
                sent.append(sent_action)
                action = loop.observe(next(frames))
                if action is None:
                    break
    finally:
        loop.close()
    return sent, chunks


@pytest.mark.parametrize("size, n_action_steps, max_steps, reads_all", [
    (4, None, None, False), (4, 3, None, False), (4, None, 6, False), (1, None, None, False),
    (4, None, None, True),
])
def test_a_chunk_sent_in_one_frame_is_the_same_actions_and_observations_as_one_at_a_time(
        size, n_action_steps, max_steps, reads_all):
    """What ahead() hands a shell: the rest of the chunk (cut at max_steps), only its last step's
    images read unless an observer reads them all; the actions and what the model sees are those
    of one action per frame."""
    class Reader:  # an observer of every frame's images (a video of every episode)
        def on_start(self, episode, observation): pass
        def on_step(self, action, observation, inference_s): pass

    frames = [frame(i) for i in range(9)] + [frame(9, terminated=True)]
    runs = []
    for driver in (drive, drive_chunks):
        model = Chunker(size=size)
        loop = EpisodeLoop(model, CONTRACT, n_action_steps=n_action_steps, max_steps=max_steps,
                           observers=[Reader()] if reads_all else [])
        out = driver(loop, list(frames))
        runs.append((out if driver is drive else out[0], [float(o["state"][0]) for o, _ in model.seen], out))
    (one, seen_one, _), (chunked, seen_chunked, (_, chunks)) = runs
    assert [a.tolist() for a in chunked] == [a.tolist() for a in one] and seen_chunked == seen_one
    per_chunk = min(size, n_action_steps or size)
    if per_chunk == 1:
        assert all(n == 1 for n, _ in chunks)  # nothing queued: one action per frame
        return
    if max_steps is None:  # whole chunks (the env's end cuts the last one's frames, not the chunk)
        assert [n for n, _ in chunks] == [per_chunk] * -(-9 // per_chunk)
    else:  # the last chunk is cut at the limit
        assert [n for n, _ in chunks] == [min(per_chunk, max_steps - i) for i in range(0, max_steps, per_chunk)]
    for n, reads in chunks:
        if reads_all:
            assert reads == [True] * n
        elif n == per_chunk:  # the model plans on the last observation only
            assert reads == [False] * (n - 1) + [True]
        else:  # cut at max_steps: no one plans on its last observation
            assert reads == [False] * n


def test_should_stop_sees_each_observation_before_the_next_action_so_chunks_go_one_step_at_a_time():
    loop = EpisodeLoop(Chunker(size=5), CONTRACT, should_stop=lambda obs, step: False)
    action = loop.begin(frame())
    assert len(loop.queue) == 4 and loop.ahead(action) is None
    loop.close()


def test_termination_wins_over_a_queued_chunk():
    model = Chunker(size=10)
    loop = EpisodeLoop(model, CONTRACT)
    sent = drive(loop, [frame(), frame(), frame(terminated=True)])
    assert len(sent) == 2 and len(loop.queue) == 8  # the rest of the chunk is never sent


def test_should_stop_sees_features_and_the_step_count_and_stops_early():
    calls = []

    def should_stop(obs, step):
        calls.append((sorted(obs), step))
        return step == 2

    loop = EpisodeLoop(Chunker(), CONTRACT, should_stop=should_stop)
    sent = drive(loop, [frame(reward=1.0) for _ in range(10)])
    assert len(sent) == 2
    # reserved keys (terminated, reward) are not the model's features
    assert calls == [(["state"], 0), (["state"], 1), (["state"], 2)]


def test_the_model_gets_the_prompt_and_contract_features_only():
    model = Chunker()
    loop = EpisodeLoop(model, CONTRACT, prompt="reach the goal")
    drive(loop, [frame(reward=0.5, success=False), frame(terminated=True)])
    observation, prompt = model.seen[0]
    assert sorted(observation) == ["state"] and prompt == "reach the goal"


def test_observers_see_the_first_frame_and_every_step_with_its_planning_time():
    events = []

    class Recorder:
        def on_start(self, episode, observation):
            events.append(("start", episode, float(observation["state"][0])))

        def on_step(self, action, observation, inference_s):
            events.append(("step", action.tolist(), float(observation["state"][0]), inference_s))

    class SlowChunker(Chunker):
        def predict(self, observation, prompt=None):
            time.sleep(0.01)
            return super().predict(observation, prompt)

    loop = EpisodeLoop(SlowChunker(size=2), CONTRACT, observers=[Recorder()], episode="ep")
    drive(loop, [frame(0), frame(1), frame(2, terminated=True)])
    assert events[0] == ("start", "ep", 0.0)
    (_, a1, s1, t1), (_, a2, s2, t2) = events[1:]
    assert (a1, s1, a2, s2) == ([1, 0], 1.0, [1, 1], 2.0)
    assert t1 >= 0.01 and t2 == 0.0  # the second action came from the queue: no model time
    assert loop.inference_s == t1


def test_an_empty_chunk_is_an_episode_error():
    class Empty:
        def predict(self, observation, prompt=None):
            return np.zeros((0, 2), np.float32)

    loop = EpisodeLoop(Empty(), CONTRACT)
    with pytest.raises(EpisodeError, match="empty action chunk"):
        loop.begin(frame())


def test_a_model_error_propagates_unchanged():
    class Broken:
        def predict(self, observation, prompt=None):
            raise ValueError("weights missing")

    loop = EpisodeLoop(Broken(), CONTRACT)
    with pytest.raises(ValueError, match="weights missing"):
        loop.begin(frame())


def test_observe_before_an_action_was_sent_is_a_programming_error():
    loop = EpisodeLoop(Chunker(), CONTRACT)
    with pytest.raises(RuntimeError, match="before begin"):
        loop.observe(frame())
    assert loop.begin(frame(terminated=True)) is None
    with pytest.raises(RuntimeError):
        loop.observe(frame())  # the episode is over: there is no action in flight


def test_the_first_plan_is_bounded_by_the_first_action_timeout_later_ones_by_the_step_timeout(monkeypatch):
    calls = []

    class Recording:  # a watchdog that never keeps a limit: every call arms it
        limit = due = None

        def __init__(self):
            self.deadline = None

        def arm(self, limit, now):
            calls.append(("arm", limit))
            self.deadline = now + limit[0]
            return True

        def release(self):
            calls.append(("release",))

    class Watched(Chunker):
        def predict(self, observation, prompt=None):
            calls.append(("predict", dog.deadline is not None))
            return super().predict(observation, prompt)

    dog = Recording()
    monkeypatch.setattr(episode_loop, "_WATCHDOG", dog)
    loop = EpisodeLoop(Watched(), CONTRACT, first_action_timeout=120.0, step_timeout=2.0)
    drive(loop, [frame(), frame(), frame(terminated=True)])
    # a margin over the bridge's own limits, so that the bridge's verdict arrives first; each call
    # is disarmed when it returns (no deadline), and the episode's end releases the timer
    assert calls == [("arm", (125.0, "--hud-first-action-timeout")), ("predict", True),
                     ("arm", (7.0, "--hud-step-timeout")), ("predict", True), ("release",)]
    assert dog.deadline is None


FREE_SIGALRM = pytest.mark.skipif(
    threading.current_thread() is not threading.main_thread()
    or signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, None),
    reason="the watchdog needs the main thread and a free SIGALRM",
)


@pytest.fixture
def dog():
    """A watchdog of the test's own, released after it: no handler and no timer may be left."""
    watch = episode_loop._Watchdog()
    yield watch
    watch.release()
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@FREE_SIGALRM
def test_the_loop_keeps_one_timer_for_the_calls_of_its_episode_and_interrupts_the_one_past_its_limit(monkeypatch):
    """Once a step's limit is armed, later calls only note their deadline (no call to arm(), no
    timer set again) until a call outlives it: that one is interrupted, naming its option."""
    dog = episode_loop._WATCHDOG
    armed, seen = [], []
    arm = dog.arm
    monkeypatch.setattr(dog, "arm", lambda limit, now=None: armed.append(limit) or arm(limit, now))

    class Slow(Chunker):  # answers at once, then never on its fifth call
        def predict(self, observation, prompt=None):
            seen.append((dog.deadline - episode_loop._clock(), dog.limit))
            if len(seen) == 5:
                time.sleep(10)
            return super().predict(observation, prompt)

    monkeypatch.setattr(episode_loop, "_MARGIN_S", 0.0)  # (5 s over the bridge's limits otherwise)
    loop = EpisodeLoop(Slow(), CONTRACT, first_action_timeout=35.0, step_timeout=0.3)
    t0 = time.monotonic()
    with pytest.raises(EpisodeError, match=r"did not answer within 0.3 s \(--hud-step-timeout plus a margin\)"):
        drive(loop, [frame()] * 10)
    assert 0.25 <= time.monotonic() - t0 < 3
    # the first call armed 35 s, the second 0.3 s; the third and later only noted their deadline
    assert armed == [(35.0, "--hud-first-action-timeout"), (0.3, "--hud-step-timeout")]
    assert 34 < seen[0][0] <= 35 and all(0.0 < left <= 0.3 for left, _ in seen[1:])
    assert [option for _, (_, option) in seen] == ["--hud-first-action-timeout"] + ["--hud-step-timeout"] * 4
    assert dog.deadline is None and dog.limit is None  # released at the end
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@FREE_SIGALRM
def test_one_timer_watches_every_call_of_an_episode_and_each_call_gets_its_whole_limit(dog):
    assert dog.arm((0.4, "--hud-step-timeout"))
    dog.disarm()
    time.sleep(0.2)
    # the timer set for the first call is still due first: the second call's arm sets nothing,
    # and when the timer goes off mid-call it is set again for the rest of this call's limit
    assert dog.arm((0.4, "--hud-step-timeout"))
    assert signal.getitimer(signal.ITIMER_REAL)[0] < 0.25
    t0 = time.monotonic()
    with pytest.raises(episode_loop.PolicyTimeout, match=r"did not answer within 0.4 s \(--hud-step-timeout"):
        time.sleep(5)
    assert 0.35 <= time.monotonic() - t0 < 2
    dog.disarm()
    # between calls the timer goes off once and is not set again (the handler stays: a timer
    # running at SIG_DFL would end the process)
    assert dog.arm((0.1, "--hud-step-timeout"))
    dog.disarm()
    time.sleep(0.3)
    assert signal.getsignal(signal.SIGALRM) == dog._handler
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    # and the next call is watched again
    assert dog.arm((0.1, "--hud-first-action-timeout"))
    with pytest.raises(episode_loop.PolicyTimeout, match="--hud-first-action-timeout"):
        time.sleep(5)
    dog.disarm()
    assert dog.arm((30, "--hud-step-timeout"))
    dog.disarm()


@FREE_SIGALRM
def test_the_timer_goes_off_inside_arm_and_nothing_is_left_running_at_sig_dfl(dog, monkeypatch):
    """The handler runs at the next bytecode check, which can fall inside arm(): whatever it does
    there, release() must leave neither a handler nor a running timer behind (``dog`` checks)."""
    assert dog.arm((30, "--hud-step-timeout"))
    dog.disarm()
    clock = time.monotonic

    def firing_clock():  # the timer goes off just after arm() saw our handler installed
        monkeypatch.setattr(episode_loop, "_clock", clock)
        dog._expired(signal.SIGALRM, None)
        return clock()

    monkeypatch.setattr(episode_loop, "_clock", firing_clock)
    assert dog.arm((30, "--hud-step-timeout"))
    assert signal.getitimer(signal.ITIMER_REAL)[0] > 29  # set again: it had gone off
    dog.disarm()


@FREE_SIGALRM
def test_a_timer_taken_over_by_the_model_is_set_again_at_the_next_call(dog):
    assert dog.arm((0.2, "--hud-step-timeout"))
    signal.setitimer(signal.ITIMER_REAL, 0)  # e.g. a predict() that used signal.alarm itself
    dog.disarm()
    time.sleep(1.3)  # past the due time by more than a second: the timer is known lost
    assert dog.arm((0.2, "--hud-step-timeout"))
    with pytest.raises(episode_loop.PolicyTimeout):
        time.sleep(5)
    dog.disarm()


@FREE_SIGALRM
def test_a_policy_that_catches_exceptions_is_interrupted_all_the_same_and_again_while_it_goes_on(monkeypatch):
    class Stubborn:
        """Retries whatever goes wrong, and even swallows the first interrupt of all."""

        def __init__(self):
            self.caught = []

        def predict(self, observation, prompt=None):
            while True:
                try:
                    time.sleep(10)
                except Exception as exc:  # noqa: BLE001 - the policy's own catch-all
                    self.caught.append(exc)
                except BaseException as exc:
                    if self.caught:
                        raise
                    self.caught.append(exc)

    model = Stubborn()
    monkeypatch.setattr(episode_loop._WATCHDOG, "repeat_s", 0.3)
    t0 = time.monotonic()
    with pytest.raises(EpisodeError, match=r"did not answer within 0.2 s \(--hud-step-timeout"):
        with watchdog(0.2, "--hud-step-timeout"):
            model.predict(frame())
    # interrupted at the limit, swallowed once, interrupted again 0.3 s later: out
    assert 0.45 <= time.monotonic() - t0 < 3
    assert [type(e) for e in model.caught] == [episode_loop.PolicyTimeout]
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@FREE_SIGALRM
def test_episodes_on_other_threads_neither_arm_nor_release_the_main_threads_watchdog(dog):
    assert dog.arm((30, "--hud-step-timeout"))
    seen = []

    def other():
        seen.append(dog.arm((0.05, "--hud-step-timeout")))
        dog.release()

    thread = threading.Thread(target=other)
    thread.start()
    thread.join(5)
    assert seen == [False]
    assert signal.getsignal(signal.SIGALRM) == dog._handler and dog.limit == (30, "--hud-step-timeout")
    time.sleep(0.2)  # had the other thread's 0.05 s been set, it would have fired here
    dog.disarm()


@FREE_SIGALRM
def test_the_watchdog_stays_out_when_something_else_owns_sigalrm(dog):
    previous = signal.signal(signal.SIGALRM, lambda *a: None)  # e.g. pytest-timeout's
    try:
        assert not dog.arm((0.1, "--hud-step-timeout"))
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
        dog.release()
        assert signal.getsignal(signal.SIGALRM) not in (signal.SIG_DFL, None)  # not touched
    finally:
        signal.signal(signal.SIGALRM, previous)


@FREE_SIGALRM
def test_the_watchdog_interrupts_a_model_call_that_never_returns():
    t0 = time.monotonic()
    with pytest.raises(EpisodeError, match=r"did not answer within 0.05 s \(--hud-step-timeout plus a margin\)"):
        with watchdog(0.05, "--hud-step-timeout"):
            time.sleep(5)
    assert time.monotonic() - t0 < 2
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL  # the handler is put back


@pytest.mark.parametrize(
    ("output", "shape"),
    [
        (np.zeros(2), (1, 2)),          # [A] is a chunk of one
        (np.zeros((4, 2)), (4, 2)),     # [T, A] as is
        ([0.5, 0.5], (1, 2)),           # lists are fine
    ],
)
def test_as_chunk_normalises_model_output_to_time_first(output, shape):
    assert as_chunk(output, CONTRACT).shape == shape


def test_as_chunk_turns_a_discrete_scalar_into_a_chunk_of_one():
    discrete = Contract(features={
        "state": CONTRACT.features["state"],
        "action": Feature("action", "action", "discrete", "int64", ()),
    })
    assert as_chunk(np.int64(1), discrete).shape == (1, 1)


def test_features_drops_the_reserved_keys():
    assert sorted(features(frame(reward=1.0, truncated=False, error=None))) == ["state"]


@pytest.mark.parametrize("bridge_said, shown", [
    ("slot 1: action of shape (3,), contract says (1,)", "slot 1: action of shape (3,), contract says (1,)"),
    ("bridge sent nothing for 5 s", "slot 1: bridge sent nothing for 5 s"),
])
def test_a_bridge_error_names_its_slot_once(bridge_said, shown):
    from types import SimpleNamespace

    from pytest_hud.agent import Agent
    from pytest_hud.client.protocol import BridgeError

    agent = Agent(Chunker())
    with pytest.raises(EpisodeError) as caught:
        with agent._reporting(SimpleNamespace(slot=1), SimpleNamespace(tape=None)):
            raise BridgeError(bridge_said)
    assert str(caught.value) == shown


@pytest.mark.parametrize("action", [
    Feature("action", "action", "box", "float32", (2,)),
    Feature("action", "action", "box", "float32", ()),
    Feature("action", "action", "discrete", "int64", (1,), low=[0.0], high=[3.0]),
])
@pytest.mark.parametrize("output", [
    0, 2.0, np.int64(1), [0.5], [0.25, 0.75], np.zeros(2, np.float32), np.zeros((1, 2)), np.arange(6.0).reshape(3, 2),
    np.float32(0.5), np.zeros((2, 1)),
])
def test_a_one_action_answer_is_the_action_a_chunk_of_one_would_give(action, output):
    """``single`` skips the chunk array: its action is row 0 of the chunk a model's answer is
    (shape, dtype and values; ``chunk_of`` below: ``[A]`` or a scalar is a chunk of one, ``[T, A]``
    is as it is), and it says None exactly when the answer is a chunk the loop must queue. And
    ``as_chunk`` is that chunk."""
    contract = Contract(features={"state": CONTRACT.features["state"], "action": action})

    def chunk_of(output):  # the rule, written out independently of the loop's code
        arr = np.asarray(output)
        if arr.ndim > len(action.shape):
            return arr
        if action.type == "discrete" and arr.size == 1:
            return arr.reshape(1, 1)
        return arr.reshape((1, *action.shape)) if arr.size == max(1, int(np.prod(action.shape))) else arr[None]

    chunk = chunk_of(output)
    got = as_chunk(output, contract)
    assert got.shape == chunk.shape and got.dtype == chunk.dtype
    np.testing.assert_array_equal(got, chunk)
    one = episode_loop._Chunker(contract).single(output)
    if one is None:
        assert np.asarray(output).ndim > len(action.shape)
    else:
        assert one.shape == chunk[0].shape and one.dtype == chunk[0].dtype
        np.testing.assert_array_equal(one, chunk[0])


def test_a_model_that_answers_one_action_a_step_is_asked_every_step_and_its_time_counted():
    calls = []

    class OneAction:
        def predict(self, observation, prompt=None):
            calls.append(observation)
            time.sleep(0.002)
            return [float(len(calls)), 0.0]

    loop = EpisodeLoop(OneAction(), CONTRACT, max_steps=3)
    actions = [loop.begin(frame(0.0))]
    while actions[-1] is not None:
        actions.append(loop.observe(frame(float(len(actions)))))
    assert [a.tolist() for a in actions[:-1]] == [[1.0, 0.0], [2.0, 0.0], [3.0, 0.0]]
    assert len(calls) == 3 and not loop.queue and loop.steps == 3
    assert loop.inference_s >= 0.006


def test_an_observer_of_camera_frames_alone_is_not_called_for_a_sim_without_cameras():
    from types import SimpleNamespace

    from pytest_hud.agent import Agent

    class Watcher:
        def __init__(self, cameras_only):
            self.cameras_only, self.steps = cameras_only, 0

        def on_start(self, episode, observation):
            pass

        def on_step(self, action, observation, inference_s):
            self.steps += 1

        def on_end(self, episode, result, error):
            pass

    videos, trace = Watcher(True), Watcher(False)
    agent = Agent(Chunker(), observers=[videos, trace])
    with_camera = Contract(features={**CONTRACT.features,
                                     "image": Feature("image", "observation", "rgb", "uint8", (4, 4, 3))})
    for contract, watching in ((CONTRACT, [trace]), (with_camera, [videos, trace])):
        episode = SimpleNamespace(token="t", seed=None, contract=contract, prompt=None)
        assert agent._start(episode, 2).observers == watching


def test_a_discrete_policys_int_answers_are_read_only_actions_kept_per_value():
    discrete = Contract(features={
        "state": CONTRACT.features["state"],
        "action": Feature("action", "action", "discrete", "int64", (1,), low=[0.0], high=[2.0]),
    })
    chunker = episode_loop._Chunker(discrete)
    first = [chunker.single(v) for v in (0, 1, 2, 1)]
    assert [a.tolist() for a in first] == [[0], [1], [2], [1]]
    assert all(not a.flags.writeable and a.dtype == np.asarray(0).dtype for a in first)
    assert first[1] is first[3]  # one array per value, made once
    assert chunker.single(np.int64(1)) is not first[1]  # a numpy integer is made as before
    assert chunker.single(True).dtype == np.bool_  # a bool is not an int here: made as before
