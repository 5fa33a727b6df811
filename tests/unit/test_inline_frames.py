"""A worker's own env (``--hud-inline``) hands the agent the frame a bridge would: each feature a
read-only copy of the contract's dtype and shape, whether the env's observation already has them
(copied as it is) or not (cast through the sim's row, as the bridge's row casts it), never an
array the env can still reach (one it made for this step and holds no reference to is not copied
again)."""

from __future__ import annotations

import numpy as np
import pytest

from pytest_hud.worker.inline import InlineBridge

SIMS = '''
import gymnasium as gym
import numpy as np


class Counter(gym.Env):
    """Its observation is its own state array, changed in place each step (as some envs do)."""

    def __init__(self, dtype="float32", returned="float32"):
        self.observation_space = gym.spaces.Box(-1e6, 1e6, (3,), np.dtype(dtype))
        self.action_space = gym.spaces.Discrete(2)
        self.state = np.zeros(3, np.dtype(returned))

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.state[:] = [seed or 0, 0.5, 1.0 / 3.0]
        return self.state, {}

    def step(self, action):
        self.state += [1.0, action, 1.0 / 3.0]
        return self.state, 1.0, False, bool(self.state[0] >= 3), {}


def same():
    return Counter()


def cast():  # declares float32, returns float64: the row casts it
    return Counter(returned="float64")


class Handed(Counter):
    """Hands out a new array each step (``"fresh"``), a new one it also keeps and later changes in
    place (``"kept"``), or a view of its state (``"view"``)."""

    def __init__(self, how):
        super().__init__()
        self.how, self.kept = how, None

    def step(self, action):
        if self.kept is not None:
            self.kept += 100.0  # the env's own hold on what it handed out: no frame may see this
        state, *rest = super().step(action)
        out = state[:] if self.how == "view" else state.copy()
        if self.how == "kept":
            self.kept = out
        return (out, *rest)


def fresh():
    return Handed("fresh")


def kept():
    return Handed("kept")


def view():
    return Handed("view")


def keyed():  # a dict observation: one feature per key
    class Keyed(gym.ObservationWrapper):
        def __init__(self, env):
            super().__init__(env)
            self.observation_space = gym.spaces.Dict({"pos": env.observation_space})

        def observation(self, obs):
            return {"pos": obs}
    return Keyed(Counter())
'''


@pytest.fixture
def sims(tmp_path):
    path = tmp_path / "frame_sims.py"
    path.write_text(SIMS)
    return path


@pytest.mark.parametrize("factory", ["same", "cast", "keyed", "fresh", "kept", "view"])
def test_each_step_frame_is_a_read_only_copy_of_the_contract_dtype(sims, factory):
    bridge = InlineBridge(f"{sims}:{factory}", {})
    try:
        key = next(iter(bridge.contract().observation_features))
        claim = bridge.claim(seed=0)
        slot = bridge.open_slot(claim.token)
        frames = [slot.first_observation] + [slot.step(np.array([1])) for _ in range(2)]
        for n, frame in enumerate(frames):
            row = frame[key]
            assert row.dtype == np.float32 and row.shape == (3,)
            assert not row.flags.writeable
            expected = np.array([n, 0.5 + n, 1.0 / 3.0 * (1 + n)]).astype(np.float32)
            np.testing.assert_allclose(row, expected, rtol=1e-6)
        assert frames[1][key] is not frames[2][key]
        assert frames[1]["reward"] == np.float32(1.0) and type(frames[1]["reward"]) is np.float32
        assert frames[2]["truncated"] is False and frames[2]["terminated"] is False
        slot.step(np.array([0]))  # the state reaches 3: the episode ends
        grade = bridge.result(claim.token)
        assert grade["steps"] == 3 and grade["total_reward"] == 3.0
    finally:
        bridge.close()


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("reward", [0.0, -0.0, 1.0, -1.0, 0.1, 1e-50, 1e300, float("nan"), float("inf"), 2.5])
def test_a_frame_reward_is_the_float32_the_wire_gives_whether_cached_or_not(reward):
    from pytest_hud.worker.inline import _float32

    for _ in range(3):  # the first call fills the cache, the later ones read it
        got = _float32(reward)
        want = np.float32(reward)
        assert type(got) is np.float32
        assert got.tobytes() == want.tobytes()  # bit for bit: the sign of zero, NaN, overflow to inf


def test_several_actions_give_the_frames_of_single_steps_up_to_the_end(sims):
    """``step_many`` in the worker, as a bridge's slot answers a frame of several actions: the
    frames of the same actions sent one by one, and none after the episode's end."""
    bridge = InlineBridge(f"{sims}:same", {})
    try:
        single = bridge.claim(seed=0)
        slot = bridge.open_slot(single.token)
        one_by_one = [slot.step(np.array([1])) for _ in range(3)]
        bridge.result(single.token)
        several = bridge.claim(seed=0)
        frames = bridge.open_slot(several.token).step_many(np.ones((5, 1), np.int64))
        assert len(frames) == 3 and frames[-1]["terminated"]
        for a, b in zip(one_by_one, frames):
            assert {k: np.asarray(v).tobytes() for k, v in a.items()} == {k: np.asarray(v).tobytes() for k, v in b.items()}
        assert bridge.result(several.token)["steps"] == 3
    finally:
        bridge.close()
