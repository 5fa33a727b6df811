"""The Meta-World sim in one process: seeds mean fixed variations, and envs keep no memory of earlier episodes.

Skipped without Meta-World (``pip install "pytest-hud[metaworld]"``); the ``metaworld`` tox env and
``.ci/run`` install it.
"""

from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest

metaworld = pytest.importorskip("metaworld", reason='Meta-World is not installed: pip install "pytest-hud[metaworld]"')

os.environ.setdefault("MUJOCO_GL", "egl")
ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "evals" / "sims"))
sys.path.insert(0, str(ROOT / "evals" / "policies"))

import meta_world as mw  # noqa: E402
from meta_world_experts import ScriptedExpert  # noqa: E402

pytestmark = pytest.mark.timeout(300)


def rollout(env, seed, steps=60, policy=None):
    """States and rewards of the first ``steps`` steps of episode ``seed`` under the expert."""
    policy = policy or ScriptedExpert()
    policy.reset()
    obs, _ = env.reset(seed=seed)
    states, rewards = [obs["state"]], []
    for _ in range(steps):
        obs, reward, terminated, truncated, _ = env.step(policy.predict(obs, env.task))
        states.append(obs["state"])
        rewards.append(reward)
        if terminated or truncated:
            break
    return np.array(states), np.array(rewards)


@pytest.mark.parametrize("task", ["reach-v3", "door-open-v3", "peg-insert-side-v3"])
def test_the_shipped_variation_table_is_what_mt1_makes(task):
    mw._VARIATIONS.clear()
    tabled = mw._tabled(task)
    assert tabled is not None, "the table does not match the installed Meta-World; rerun python evals/sims/meta_world.py"
    made = metaworld.MT1(task, seed=0).train_tasks
    assert len(tabled) == len(made) == 50
    for a, b in zip(tabled, made):
        da, db = pickle.loads(a.data), pickle.loads(b.data)
        assert a.env_name == b.env_name and da.keys() == db.keys()
        np.testing.assert_array_equal(da["rand_vec"], db["rand_vec"])
        assert da["env_cls"] is db["env_cls"] and da["partially_observable"] == db["partially_observable"]


def test_a_seed_is_its_documented_variation():
    task = "push-v3"
    assert mw.variation(task, 3).data == mw._tabled(task)[3].data
    expected = pickle.loads(metaworld.MT1(task, seed=1).train_tasks[7].data)["rand_vec"]
    np.testing.assert_array_equal(pickle.loads(mw.variation(task, 57).data)["rand_vec"], expected)  # 57 = 50 + 7
    first = {mw.MetaWorldTask(task).reset(seed=s)[0]["state"].tobytes() for s in (0, 1, 50)}
    assert len(first) == 3  # different seeds, different scenes
    with pytest.raises(ValueError, match=f"an integer from 0 to {mw.MAX_SEED}"):
        mw.variation(task, -1)


def test_the_largest_seed_is_declared_and_is_the_last_one_mt1_can_make():
    assert mw.MAX_SEED == 50 * 2**32 - 1
    assert mw.MetaWorldTask.hud_claims.max_seed == mw.MAX_SEED and mw.MetaWorldTask.hud_claims.options == ()
    assert mw.meta_world(1, tasks=["reach-v3"]).claim_rules == mw.MetaWorldTask.hud_claims  # multi-task too
    last = metaworld.MT1("reach-v3", seed=2**32 - 1).train_tasks[49]
    assert mw.variation("reach-v3", mw.MAX_SEED).data == last.data
    with pytest.raises(ValueError, match=r"Seed must be between 0 and 2\*\*32 - 1"):  # MT1 one block further
        metaworld.MT1("reach-v3", seed=2**32)
    with pytest.raises(ValueError, match=f"an integer from 0 to {mw.MAX_SEED}, got {mw.MAX_SEED + 1}"):
        mw.variation("reach-v3", mw.MAX_SEED + 1)


def test_the_documented_render_recipe_reproduces_the_sims_frames_bit_for_bit():
    """Meta-World and MuJoCo alone, following the module's docstring step by step."""
    import mujoco
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS

    task, seed, action = "push-v3", 57, np.array([0.3, -0.2, 0.1, 0.5], np.float32)
    ours = mw.MetaWorldTask(task, pixels=True)
    try:
        want = [ours.reset(seed=seed)[0]["pixels"], ours.step(action)[0]["pixels"]]
    finally:
        ours.close()
    env = ALL_V3_ENVIRONMENTS[task](render_mode="rgb_array", camera_name="corner2", width=128, height=128)
    try:
        env.model.vis.quality.offsamples = 0  # 2. before the offscreen context exists
        viewer = env.mujoco_renderer._get_viewer("rgb_array")
        viewer.scn.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0  # 3.
        viewer.scn.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        camera = mujoco.mj_name2id(env.model, mujoco.mjtObj.mjOBJ_CAMERA, "corner2")

        def frame():  # 4. and 5.
            viewer.make_context_current()
            return np.ascontiguousarray(viewer.render("rgb_array", camera_id=camera)[::-1, ::-1])

        env.set_task(metaworld.MT1(task, seed=seed // 50).train_tasks[seed % 50])
        env.reset()
        got = [frame()]
        env.step(action)
        got.append(frame())
    finally:
        env.close()
    for step, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == np.uint8 and a.shape == (128, 128, 3)
        assert np.array_equal(a, b), f"frame {step} differs from the sim's"


def test_same_seed_same_episode_in_a_fresh_env_and_after_other_episodes():
    fresh = rollout(mw.MetaWorldTask("pick-place-v3"), 4)
    used = mw.MetaWorldTask("pick-place-v3")
    for seed in (9, 60, 2):
        rollout(used, seed, steps=30)
    again = rollout(used, 4)
    np.testing.assert_array_equal(fresh[0], again[0])
    np.testing.assert_array_equal(fresh[1], again[1])


def test_unknown_tasks_and_cameras_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="'push-v2' is not a Meta-World v3 task; choose one of reach-v3"):
        mw.MetaWorldTask("push-v2")
    with pytest.raises(ValueError, match="no camera 'nose'"):
        mw.MetaWorldTask("reach-v3", pixels=True, camera="nose")
    with pytest.raises(ValueError, match="'MT11'"):
        mw.meta_world(1, tasks="MT11")


def test_the_delayed_expert_is_worse_and_the_noisy_one_is_reproducible():
    env = mw.MetaWorldTask("push-v3")
    from meta_world_experts import expert, expert_delayed, expert_noisy

    def solved(policy, seed):
        states, _ = rollout(env, seed, steps=500, policy=policy)
        return len(states) < 501  # stopped at its first success

    assert sum(solved(expert(), s) for s in range(4)) > sum(solved(expert_delayed(), s) for s in range(4))
    a, b = rollout(env, 5, policy=expert_noisy()), rollout(env, 5, policy=expert_noisy())
    np.testing.assert_array_equal(a[0], b[0])
    assert not np.array_equal(a[0], rollout(env, 5, policy=expert())[0])


def final_info(env, seed, policy):
    policy.reset()
    obs, info = env.reset(seed=seed)
    assert info["score"] == 0.0
    steps = 0
    while True:
        obs, _, terminated, truncated, info = env.step(policy.predict(obs, env.task))
        steps += 1
        assert 0.0 <= info["score"] <= 1.0
        if terminated or truncated:
            return info, steps


def test_the_score_grades_how_close_and_how_soon_the_object_reached_its_goal():
    env = mw.MetaWorldTask("reach-v3", max_episode_steps=200)
    solved, solved_steps = final_info(env, 0, ScriptedExpert())
    held, _ = final_info(env, 0, ScriptedExpert(delay=10))  # the same variation, 10 steps later
    idle, _ = final_info(env, 0, _Idle())  # never touches the object
    assert solved["success"] and held["success"]
    assert 1.0 > solved["score"] > held["score"] > 0.5  # a success scores high; a slower one lower
    assert solved["score"] > 1.0 - solved_steps / 200  # the steps after the success count as done
    assert not idle["success"] and idle["score"] < 0.01  # it only settles
    env.close()


class _Idle:
    def reset(self):
        pass

    def predict(self, observation, prompt=None):
        return np.zeros(4, np.float32)
