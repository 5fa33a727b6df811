"""The plugin's tick modes and vectorizations: the same episodes under any of them, and what the
summary says about them; real bridges, xdist workers."""

from __future__ import annotations

import json
import time

import pytest

from pluginkit import project, run  # noqa: F401 - project is a fixture
from pytest_hud.core.results import load_results
from pytest_hud.sim.threads import default_threads

pytestmark = pytest.mark.timeout(240)


DETERMINISM = '''
import pytest

@pytest.mark.hud(policy="policies:tilt")
@pytest.mark.parametrize("seed", range(8))
def test_tilt(shared_sim, robot_agent, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed))
    assert result.success
'''


def _per_episode(path) -> dict:
    return {(r.task, r.episode): (r.outcome, r.steps, r.total_reward, r.score)
            for r in load_results(path).episodes}


def test_per_episode_results_are_identical_under_any_workers_width_tick_mode_and_vectorization(project):
    project.makepyfile(test_det=DETERMINISM)
    runs = {  # one env per slot: auto ticks in ready mode
        "n0": ["-p", "no:xdist"],
        "n0-lockstep": ["-p", "no:xdist", "--hud-tick=lockstep"],
        "n2w2": ["-n", "2", "--hud-width=2"],
        "n4w2-lockstep": ["-n", "4", "--hud-width=2", "--hud-tick=lockstep"],
        "n4w4-ready": ["-n", "4", "--hud-width=4", "--hud-tick=ready", "--hud-tick-window=0"],
        "n2w4-threads": ["-n", "2", "--hud-width=4", "--hud-vectorization=threads"],
        "n4w3-processes": ["-n", "4", "--hud-width=3", "--hud-vectorization=processes"],
        **({"n4w4-processes-lanes": ["-n", "4", "--hud-width=4", "--hud-vectorization=processes", "--hud-tick=lanes"]}
           if default_threads(4) > 1 else {}),  # lanes: one env process per core, two or more
        # a batching policy server: processes tick in lanes (where there are two cores), starts held together
        "n4w4-server-processes": ["-n", "4", "--hud-width=4", "--hud-vectorization=processes",
                                  "--hud-policy-server"],
        "n0w3-threads-lockstep": ["-p", "no:xdist", "--hud-width=3", "--hud-vectorization=threads",
                                  "--hud-tick=lockstep"],
    }
    seen = {}
    for name, args in runs.items():
        result = run(project, *args, f"--hud-results={name}.jsonl")
        assert result.ret in (0, 1), result.stdout.str()
        seen[name] = _per_episode(project.path / f"{name}.jsonl")
    reference = seen["n0"]
    assert len(reference) == 8
    assert len({steps for _, steps, _, _ in reference.values()}) > 1  # the seeds really differ
    for name, episodes in seen.items():
        assert episodes == reference, name


BATCHED = '''
import gymnasium as gym

def cartpole(num_envs):
    """Natively batched: one call steps every slot, so it ticks in lockstep only."""
    return gym.make_vec("CartPole-v1", num_envs=num_envs, vectorization_mode="vector_entry_point")
'''

TICK = '''
def test_tick(shared_sim, request):
    from pytest_hud.sim.threads import default_threads

    asked = request.config.getoption("hud_tick") or "auto"
    width = request.config.getoption("hud_width") or 1
    parallel = (request.config.getoption("hud_vectorization") in ("processes", "threads")
                and default_threads(width) > 1)  # the slots step in parallel lanes
    if asked == "auto" and request.config.getoption("hud_policy_server") and parallel:
        # slots in step ask the batching policy server together; env processes each on their own
        asked = "lanes" if request.config.getoption("hud_vectorization") == "processes" else "lockstep"
    assert shared_sim.stats()["tick"] == {"auto": "ready", "lockstep": "lockstep", "lanes": "lanes"}[asked]
'''


def test_the_tick_mode_reaches_the_bridge_and_an_impossible_one_is_refused(project):
    project.makepyfile(batched=BATCHED, test_tick=TICK)
    for args in ([], ["--hud-tick=lockstep"]):  # one env per slot: auto is ready
        run(project, "-p", "no:xdist", "test_tick.py", *args).assert_outcomes(passed=1)
    for vectorization in ("sync", "processes"):  # the bridge's own tick: TICK checks it
        server = run(project, "-p", "no:xdist", "test_tick.py", "--hud-policy-server", "--hud-width=2",
                     f"--hud-vectorization={vectorization}")
        server.assert_outcomes(passed=1)
        server.stdout.fnmatch_lines(["hud: sim=* tick=auto *"])
    refused = run(project, "-p", "no:xdist", "test_tick.py", "--hud-sim=batched:cartpole", "--hud-tick=ready")
    refused.assert_outcomes(errors=1)
    refused.stdout.fnmatch_lines(["*tick mode 'ready' needs a sim whose slots are independent envs, but this "
                                  "sim steps all its slots in one batched call; use --hud-tick=auto*"])
    usage = run(project, "--hud-tick=fast")
    assert usage.ret == pytest.ExitCode.USAGE_ERROR
    usage.stderr.fnmatch_lines(["*--hud-tick must be auto, lockstep, ready or lanes, got 'fast'*"])
    lanes = run(project, "-p", "no:xdist", "test_tick.py", "--hud-width=2", "--hud-vectorization=sync",
                "--hud-tick=lanes")
    lanes.assert_outcomes(errors=1)
    lanes.stdout.fnmatch_lines(["*tick mode 'lanes' needs a sim whose slots step in several processes at once; "
                                "use --hud-vectorization=processes*"])


def test_a_vectorization_that_does_not_apply_to_a_bridge_is_a_note_in_the_summary(project):
    project.makepyfile(batched=BATCHED, test_one="""
def test_one(shared_sim, robot_agent):
    robot_agent.run(shared_sim.episode(seed=1))
""")
    args = ("-p", "no:xdist", "--hud-sim=batched:cartpole", "--hud-width=1")
    threads = run(project, *args, "--hud-vectorization=threads")
    threads.assert_outcomes(passed=1)
    threads.stdout.fnmatch_lines(["note: bridge for batched:cartpole: --hud-vectorization=threads does not "
                                  "apply: the factory takes num_envs and vectorizes its envs itself*"])
    plain = run(project, *args)
    plain.assert_outcomes(passed=1)
    assert "note:" not in plain.stdout.str()


SLOW = '''
import time

import gymnasium as gym
import numpy as np


class Slow(gym.Env):
    """Its step sleeps 3 ms, like a sim that renders."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def __init__(self, delay):
        self.delay = delay

    def step(self, action):
        time.sleep(self.delay)
        self.t += 1
        return np.zeros(2, np.float32), 0.0, self.t >= 40, False, {}


def slow(delay=0.003):
    return Slow(delay)
'''


@pytest.mark.skipif(default_threads(2) < 2, reason="the hint needs two cores to spread the envs over")
def test_a_bridge_that_spent_its_time_stepping_envs_one_by_one_suggests_processes(project):
    project.makepyfile(slow=SLOW, test_slow="""
import pytest

@pytest.mark.parametrize("seed", range(4))
def test_slow(shared_sim, robot_agent, seed):
    robot_agent.run(shared_sim.episode(seed=seed))
""")
    args = ("-n", "2", "--hud-sim=slow:slow", "--hud-width=2", "--hud-tick=lockstep", "--hud-policy=policies:pendulum_zero")
    auto = run(project, *args, "--hud-results=auto.jsonl")  # the default, auto: 3 ms per env-step, so processes
    auto.assert_outcomes(passed=4)
    auto.stdout.fnmatch_lines(["note: bridge for slow:slow: --hud-vectorization=auto chose processes: * ms per "
                               "env-step, so the 2 envs step on 2 cores (sync keeps them in the bridge's process)"])
    assert "one after another" not in auto.stdout.str()

    def ran(results: str) -> tuple[str, list[dict]]:
        """The options' vectorization, and how the results file's summary says each bridge ran."""
        run_record, *_, summary = [json.loads(line) for line in (project.path / results).read_text().splitlines()]
        (sim,) = summary["provenance"]["sims"]
        return run_record["provenance"]["options"]["vectorization"], sim["bridges"]

    # the results file keeps what auto chose, beside what was asked
    assert ran("auto.jsonl") == ("auto", [{"group": 0, "vectorization": "processes", "tick": "lockstep"}])
    args += ("--hud-vectorization=sync",)
    sync = run(project, *args, "--hud-results=sync.jsonl")
    sync.assert_outcomes(passed=4)
    assert ran("sync.jsonl") == ("sync", [{"group": 0, "vectorization": "sync", "tick": "lockstep"}])
    sync.stdout.fnmatch_lines(["note: bridge for slow:slow: its 2 envs stepped one after another in one process "
                               "(* ms per env-step, *% of the time it ran episodes); "
                               "--hud-vectorization=processes steps them on 2 cores, with the same episodes"])
    spread = run(project, *args[:-1], "--hud-vectorization=processes")
    spread.assert_outcomes(passed=4)
    assert "note:" not in spread.stdout.str()
    # a bridge with build arguments is named with them: one target may have several bridges
    project.makepyfile(test_slow="""
import pytest

pytestmark = pytest.mark.hud(build={"delay": 0.002})

@pytest.mark.parametrize("seed", range(4))
def test_slow(shared_sim, robot_agent, seed):
    robot_agent.run(shared_sim.episode(seed=seed))
""")
    built = run(project, *args)
    built.assert_outcomes(passed=4)
    built.stdout.fnmatch_lines(['note: bridge for slow:slow {"delay": 0.002}: its 2 envs stepped one after another*'])
    built = run(project, *args[:-1])
    built.assert_outcomes(passed=4)
    built.stdout.fnmatch_lines(['note: bridge for slow:slow {"delay": 0.002}: --hud-vectorization=auto chose processes*'])
