"""Meta-World through real bridges: no slot ever sees another slot's frame, and episodes are the same
under any worker count, width or slot.

Skipped without Meta-World (``pip install "pytest-hud[metaworld]"``).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("metaworld", reason='Meta-World is not installed: pip install "pytest-hud[metaworld]"')

from conftest import run_threads, start_bridge, stop  # noqa: E402

from pytest_hud.client.bridge import BridgeError, ControlClient, SlotClient  # noqa: E402
from pytest_hud.core.results import load_results  # noqa: E402

os.environ.setdefault("MUJOCO_GL", "egl")
ROOT = Path(__file__).resolve().parents[3]
SIM = ROOT / "evals" / "sims" / "meta_world.py"
EXPERTS = ROOT / "evals" / "policies" / "meta_world_experts.py"
sys.path.insert(0, str(SIM.parent))
sys.path.insert(0, str(EXPERTS.parent))

import meta_world as mw  # noqa: E402
from meta_world_experts import ScriptedExpert  # noqa: E402

pytestmark = pytest.mark.timeout(600)

EPISODES = [("reach-v3", 3), ("push-v3", 8), ("drawer-close-v3", 3)]
STEPS = 12


def drive(address, task, seed, out, barrier):
    """Run ``STEPS`` expert steps of (task, seed) on the bridge; record every frame and action."""
    expert = ScriptedExpert()
    with ControlClient(address) as control:
        claim = control.claim(seed=seed, task=task, build={"pixels": True, "tasks": [t for t, _ in EPISODES]})
        barrier.wait(120)  # all three slots claimed before any steps: they render side by side
        frames, actions = [], []
        with SlotClient(address, claim.token) as ws:
            frame = ws.first_observation
            frames.append(np.array(frame["pixels"]))
            for _ in range(STEPS):
                action = expert.predict(frame, claim.prompt)
                actions.append(action)
                frame = ws.step(action)
                frames.append(np.array(frame["pixels"]))
        control.release(claim.token)
    out[(task, seed)] = (claim.slot, frames, actions)


def reference(task, seed, actions):
    """The same frames from a single env, alone in its process's GL state, closed before the next."""
    env = mw.MetaWorldTask(task, pixels=True)
    try:
        frames = [env.reset(seed=seed)[0]["pixels"]]
        frames += [env.step(a)[0]["pixels"] for a in actions]
    finally:
        env.close()
    return frames


@pytest.mark.parametrize("vectorization", ["sync", "processes"])
def test_slots_rendering_different_tasks_in_one_bridge_never_see_each_others_frames(tmp_path, vectorization):
    build = json.dumps({"pixels": True, "tasks": [t for t, _ in EPISODES]})
    proc, address = start_bridge(tmp_path, f"{SIM}:meta_world", 3, "--build-args", build,
                                 "--vectorization", vectorization, timeout=180)
    try:
        seen: dict = {}
        barrier = threading.Barrier(len(EPISODES))
        assert run_threads([lambda t=t, s=s: drive(address, t, s, seen, barrier) for t, s in EPISODES],
                           timeout=300) == []
    finally:
        stop(proc)
    assert sorted(slot for slot, _, _ in seen.values()) == [0, 1, 2]  # all three rendered side by side
    firsts = []
    for (task, seed), (slot, frames, actions) in seen.items():
        expected = reference(task, seed, actions)
        assert frames[0].shape == (128, 128, 3) and frames[0].dtype == np.uint8
        for step, (got, want) in enumerate(zip(frames, expected)):
            assert np.array_equal(got, want), f"{task} (slot {slot}) step {step}: frame differs from a lone env's"
        assert not np.array_equal(frames[0], frames[-1])  # the arm moved: frames are live, not stale
        firsts.append(frames[0])
    assert not np.array_equal(firsts[0], firsts[1]) and not np.array_equal(firsts[1], firsts[2])


def test_meta_world_claims_are_checked_at_claim_time_and_a_seedless_one_is_a_new_recorded_variation(tmp_path):
    build = {"tasks": ["reach-v3"]}
    proc, address = start_bridge(tmp_path, f"{SIM}:meta_world", 1, "--build-args", json.dumps(build), timeout=180)
    try:
        with ControlClient(address) as control:
            with pytest.raises(BridgeError, match=f"its seeds are 0 to {mw.MAX_SEED}; choose a seed in that range"):
                control.claim(seed=mw.MAX_SEED + 1, task="reach-v3", build=build)
            with pytest.raises(BridgeError, match=r"option\(s\) difficulty are not read by this sim \(it reads: none\)"):
                control.claim(seed=1, task="reach-v3", options={"difficulty": 2}, build=build)
            firsts = {}
            for _ in range(3):  # without a seed: a drawn one each time, never the slot's last variation again
                claim = control.claim(task="reach-v3", build=build)
                with SlotClient(address, claim.token) as ws:
                    firsts[claim.seed] = np.array(ws.first_observation["state"])
                control.release(claim.token)
    finally:
        stop(proc)
    assert len(firsts) == 3 and all(0 <= seed <= mw.MAX_SEED for seed in firsts)
    assert len({state.tobytes() for state in firsts.values()}) == 3
    for seed, state in firsts.items():  # each one rebuilt from its recorded seed alone
        np.testing.assert_array_equal(mw.MetaWorldTask("reach-v3").reset(seed=seed)[0]["state"], state)


SUITE = f'''
import pytest

pytestmark = pytest.mark.hud(sim="{SIM}:meta_world", policy="{EXPERTS}:expert_noisy")

@pytest.mark.parametrize("seed", [1, 52])
@pytest.mark.parametrize("task", ["reach-v3", "push-v3", "drawer-close-v3"])
def test_mt(shared_sim, robot_agent, task, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed, task=task))
    assert result.success
'''


def test_per_episode_results_are_identical_under_any_workers_width_and_slot(pytester):
    pytester.makepyfile(test_mt=SUITE)
    runs = {"n0": ["-p", "no:xdist"], "n2w2": ["-n", "2", "--hud-width=2"], "n2w1": ["-n", "2", "--hud-width=1"],
            "n2w2-processes": ["-n", "2", "--hud-width=2", "--hud-vectorization=processes"]}
    seen = {}
    for name, args in runs.items():
        result = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, f"--hud-results={name}.jsonl",
                                               "--hud-boot-timeout=180", timeout=400)
        assert result.ret in (0, 1), result.stdout.str()[-3000:]
        records = load_results(pytester.path / f"{name}.jsonl").episodes
        seen[name] = {(r.task, r.episode): (r.outcome, r.steps, r.total_reward, r.score) for r in records}
        assert len(seen[name]) == 6, name
    reference = seen["n0"]
    assert len({steps for _, steps, _, _ in reference.values()}) > 3  # episodes really differ
    for name, episodes in seen.items():
        assert episodes == reference, name
