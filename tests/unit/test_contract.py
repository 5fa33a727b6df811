"""Contracts are derived from gym spaces, saved at explicit paths and validated on load."""

import gymnasium as gym
import numpy as np
import pytest

from pytest_hud.core.contract import Contract, ContractError, derive_contract

from simkit import image_state


def derived_from(env):
    obs, _ = env.reset(seed=0)
    return derive_contract(env.observation_space, env.action_space, obs, env.metadata)


def test_dict_observation_with_an_image_and_a_state_is_flattened_and_typed():
    c = derived_from(image_state())
    assert set(c.features) == {"pixels/top", "agent_pos", "action"}
    cam, state, action = c.features["pixels/top"], c.features["agent_pos"], c.action
    assert (cam.role, cam.type, cam.dtype, cam.shape) == ("observation", "rgb", "uint8", (8, 6, 3))
    assert cam.names == ["height", "width", "channel"]
    assert (state.type, state.dtype, state.shape, state.names) == ("state", "float32", (2,), ["agent_pos_0", "agent_pos_1"])
    assert state.low == [-1.0, -1.0] and state.high == [1.0, 1.0]
    assert (action.role, action.type, action.shape, action.low, action.high) == ("action", "box", (2,), [-2.0, -2.0], [2.0, 2.0])
    assert c.control_rate == 15.0 and c.cameras == ["pixels/top"]


def test_discrete_action_space_and_control_rate_override():
    c = derive_contract(*(lambda e: (e.observation_space, e.action_space, e.reset(seed=0)[0], e.metadata))(gym.make("CartPole-v1")), control_rate=7)
    assert c.action.type == "discrete" and c.action.low == [0.0] and c.action.high == [1.0]
    assert c.control_rate == 7.0 and list(c.observation_features) == ["state"]
    assert c.coerce_action(np.array([1.0], np.float32)) == 1
    # what Discrete.contains and an env's arithmetic take fastest: a Python int, whatever came in
    for given in (np.array([1]), np.array(1, np.int8), np.int64(1), np.array([True]), 1.0, [1]):
        assert type(c.coerce_action(given)) is int and c.coerce_action(given) == 1
    with pytest.raises(ContractError, match="outside"):
        c.coerce_action(np.array([2]))
    with pytest.raises(ContractError, match="integer"):
        c.coerce_action(np.array([0.5]))


def test_multi_discrete_and_multi_binary_actions():
    from gymnasium import spaces
    from pytest_hud.core.contract import action_feature

    md = action_feature(spaces.MultiDiscrete([3, 4]))
    assert md.type == "multi_discrete" and md.high == [2.0, 3.0]
    mb = action_feature(spaces.MultiBinary(3))
    assert mb.type == "multi_binary" and mb.shape == (3,)
    with pytest.raises(ContractError, match="not supported"):
        action_feature(spaces.Tuple([spaces.Discrete(2)]))


def test_wrong_action_shape_names_both_shapes():
    c = derived_from(image_state())
    with pytest.raises(ContractError, match=r"shape \(3,\), contract says \(2,\)"):
        c.coerce_action(np.zeros(3, np.float32))
    with pytest.raises(ContractError, match="NaN"):
        c.coerce_action(np.array([np.nan, 0], np.float32))


def test_save_and_load_round_trip_at_an_explicit_path(tmp_path):
    c = derived_from(image_state())
    path = c.save(tmp_path / "nested" / "contract.json")
    loaded = Contract.load(path)
    assert loaded.to_dict() == c.to_dict()
    loaded.check_matches(c)


def test_a_loaded_contract_that_does_not_match_the_env_names_the_feature(tmp_path):
    c = derived_from(image_state())
    data = c.to_dict()
    data["features"]["agent_pos"]["shape"] = [3]
    data["features"]["agent_pos"]["names"] = ["a", "b", "c"]
    with pytest.raises(ContractError, match=r"feature 'agent_pos': contract says shape \(3,\)"):
        Contract.from_dict(data).check_matches(c)
    del data["features"]["pixels/top"]
    with pytest.raises(ContractError, match="pixels/top"):
        Contract.from_dict(data).check_matches(c)


def test_missing_contract_file_is_a_clear_error(tmp_path):
    with pytest.raises(ContractError, match="does not exist"):
        Contract.load(tmp_path / "nope.json")


def test_unbounded_spaces_save_as_strict_json_and_load_back(tmp_path):
    import json

    env = gym.make("CartPole-v1")
    c = derived_from(env)
    text = json.dumps(c.to_dict(), allow_nan=False)  # raises if Infinity slipped through
    loaded = Contract.from_dict(json.loads(text))
    assert loaded.features["state"].low[1] == float("-inf") and loaded.features["state"].high[1] == float("inf")


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning", "ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("action", [
    {"type": "discrete", "dtype": "int64", "shape": [1], "low": [0], "high": [2]},
    {"type": "box", "dtype": "float32", "shape": [2], "low": [-1, -1], "high": [1, 1]},
    {"type": "box", "dtype": "float64", "shape": [], "low": [-1], "high": [1]},
    {"type": "box", "dtype": "float32", "shape": [80]},
    {"type": "multi_discrete", "dtype": "int64", "shape": [2]},
])
@pytest.mark.parametrize("given", [
    np.array([1]), np.array([5]), np.array([-1]), np.array([1.0]), np.array([1.5]), np.array([True]),
    1, 2.0, np.uint8(2), np.zeros(2, np.float32), np.array([0.5, np.nan], np.float32),
    np.array([np.inf, -np.inf]), np.full(2, 3e38, np.float32), np.zeros(2), np.zeros((1, 2), np.float32),
    np.float64(0.25), np.zeros(80, np.float32), np.array(["a"]), [1, 2],
])
def test_the_per_step_coercer_gives_what_coerce_action_gives_or_its_error(action, given):
    """``action_coercer`` is a shortcut for actions already of the right kind: for any action it
    returns what ``coerce_action`` returns (value, type, dtype), or raises the same error."""
    contract = Contract.from_dict({"features": {"action": {"role": "action", "names": [], **action}}})
    fast = contract.action_coercer()
    try:
        want = contract.coerce_action(given)
    except Exception as exc:  # noqa: BLE001 - the same error either way
        with pytest.raises(type(exc)) as caught:
            fast(given)
        assert str(caught.value) == str(exc)
        return
    got = fast(given)
    assert type(got) is type(want)
    if isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    else:
        assert got == want


def test_equal_contracts_have_one_canonical_form_and_signature_made_once():
    import json

    from pytest_hud.core.contract import Contract, Feature

    def make(order):
        feats = {"action": Feature("action", "action", "box", "float32", (2,)),
                 "state": Feature("state", "observation", "state", "float32", (4,))}
        return Contract({k: feats[k] for k in order}, control_rate=10.0)

    a, b = make(["action", "state"]), make(["state", "action"])
    assert a.canonical() == b.canonical() == json.dumps(a.to_dict(), sort_keys=True)
    assert a.signature() == b.signature() and a.signature() is a.signature()
    assert a == b  # the cached forms are no fields: equality is the features' and the rate's
    other = make(["action", "state"])
    other = Contract({**other.features, "state": Feature("state", "observation", "state", "float32", (5,))}, 10.0)
    assert other.canonical() != a.canonical() and other.signature() != a.signature()
