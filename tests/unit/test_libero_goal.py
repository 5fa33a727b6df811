"""The LIBERO privileged-state helpers and the scripted expert's input checks (pure: no LIBERO, no MuJoCo)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

EVALS = Path(__file__).resolve().parents[2] / "evals"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


goal = _load(EVALS / "sims" / "libero_goal.py", "_libero_goal_under_test")
experts = _load(EVALS / "policies" / "libero_expert.py", "_libero_expert_under_test")


def test_the_goal_pair_is_the_first_placement_predicate():
    problem = {"goal_state": [["open", "drawer_1"], ["on", "akita_black_bowl_1", "plate_1"]]}
    assert goal.goal_pair(problem) == ("akita_black_bowl_1", "plate_1")
    assert goal.goal_pair({"goal_state": [["In", "cream_cheese_1", "basket_1_contain_region"]]}) == \
        ("cream_cheese_1", "basket_1_contain_region")


def test_a_goal_without_a_placement_is_refused_by_name():
    with pytest.raises(ValueError, match=r"has no On/In predicate.*pick-and-place goals only"):
        goal.goal_pair({"goal_state": [["open", "wooden_cabinet_1_top_region"]]})
    with pytest.raises(ValueError, match="no goal_state"):
        goal.goal_pair({"objects": {}})


def _scene(positions: dict[str, tuple[float, float, float]]):
    names = list(positions)
    data = SimpleNamespace(body_xpos=np.array([positions[n] for n in names], dtype=np.float64))
    return SimpleNamespace(obj_body_id={n: i for i, n in enumerate(names)}, objects_dict=dict.fromkeys(names),
                           object_sites_dict={}, sim=SimpleNamespace(data=data))


def test_environment_state_is_object_target_and_the_nearest_other_object():
    env = _scene({"bowl": (0.0, 0.0, 0.9), "plate": (0.1, 0.2, 0.9), "far": (0.5, 0.5, 0.9),
                  "near": (0.05, -0.06, 0.92)})
    state = goal.environment_state(env, ("bowl", "plate"))
    assert state.dtype == np.float32 and state.shape == (goal.ENVIRONMENT_STATE_SIZE,) == (9,)
    np.testing.assert_allclose(state, [0, 0, 0.9, 0.1, 0.2, 0.9, 0.05, -0.06, 0.92], atol=1e-6)
    pair_only = _scene({"bowl": (0.0, 0.1, 0.9), "plate": (0.1, 0.2, 0.9)})
    alone = goal.environment_state(pair_only, ("bowl", "plate"))
    np.testing.assert_allclose(alone[6:], alone[:3])  # no other object: the object itself
    with pytest.raises(ValueError, match="no body or site named 'cup'"):
        goal.environment_state(env, ("cup", "plate"))


def test_the_expert_says_which_observation_it_needs():
    expert = experts.expert()
    with pytest.raises(ValueError, match="build the LIBERO sim with privileged=True"):
        expert.predict({"state": np.zeros(8, np.float32)})
    with pytest.raises(ValueError, match=r"expects state\[8\] and environment_state\[9\]"):
        expert.predict({"state": np.zeros(8), "environment_state": np.zeros(6)})


def test_the_expert_first_moves_above_the_object_with_the_gripper_open():
    expert = experts.expert()
    state = np.array([-0.2, 0.0, 1.17, np.pi, 0.0, 0.0, 0.04, -0.04])  # pointing down (180 deg about x)
    privileged = np.array([0.0, 0.2, 0.9, 0.05, -0.2, 0.9, 0.0, 0.35, 0.9])
    action = expert.predict({"state": state, "environment_state": privileged})
    assert action.shape == (7,) and np.all(np.abs(action) <= 1.0)
    assert action[0] > 0.5 and action[1] > 0.5 and action[6] == -1.0 and expert.phase == "approach"
