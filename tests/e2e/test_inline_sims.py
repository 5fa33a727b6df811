"""Cheap and camera-less sims run in the worker itself (``--hud-inline``): the same episodes as through a bridge.

Real runs (pytester subprocesses, xdist workers, real bridges where they are used): ``auto`` picks
the worker for an env whose step costs less than a round trip to the bridge (CartPole, Pendulum)
and for a sim that renders no camera (a multi-task sim with slow steps, as Meta-World from state),
keeps the shared bridge for a sim with cameras whose step costs more, and either way every seed's
episode is the same, whatever the workers and the width.
"""

from __future__ import annotations

import json

import pytest

from pytest_hud.core.results import load_results

pytestmark = pytest.mark.timeout(300)

SIMS = '''
import time
import gymnasium as gym
import numpy as np

class Success(gym.Wrapper):
    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        info["is_success"] = bool(truncated and not terminated)
        return obs, reward, terminated, truncated, info

def cartpole(max_steps=80):
    return Success(gym.make("CartPole-v1", max_episode_steps=max_steps))

def pendulum(max_steps=30):
    return Success(gym.make("Pendulum-v1", max_episode_steps=max_steps))

class Slow(gym.Wrapper):
    """A step that costs far more than any round trip to a bridge."""
    def __init__(self, env, delay=0.02):
        super().__init__(env)
        self.delay = delay

    def step(self, action):
        time.sleep(self.delay)
        return self.env.step(action)

class Camera(gym.ObservationWrapper):
    """The state and a small rgb image of it: a sim with a camera."""
    def __init__(self, env):
        super().__init__(env)
        self.observation_space = gym.spaces.Dict({
            "state": env.observation_space, "pixels": gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)})

    def observation(self, obs):
        return {"state": obs, "pixels": np.full((8, 8, 3), int(abs(obs[0]) * 100) % 256, np.uint8)}

def slow_camera(max_steps=4):
    return Success(Camera(Slow(gym.make("CartPole-v1", max_episode_steps=max_steps))))

class UpAtEnd(gym.Wrapper):
    """Pendulum: success is the pole above horizontal when time runs out; the score its height."""
    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        info["is_success"] = bool(truncated and obs[0] > 0)
        info["score"] = float(obs[0])
        return obs, reward, terminated, truncated, info

def tasks(num_envs, delay=0.002):
    """Two tasks (episode lengths) of a slow, camera-less Pendulum in a multi-task sim."""
    from pytest_hud.sim import MultiTaskSim

    def make(task):
        steps = {"short": 12, "long": 25}[task]
        return UpAtEnd(Slow(gym.make("Pendulum-v1", max_episode_steps=steps), delay))
    return MultiTaskSim(num_envs, ["short", "long"], make)
'''

POLICIES = '''
import numpy as np

def tilt():
    """Weak on purpose: episode lengths then depend on the seed."""
    return lambda obs: int(obs["state"][2] > 0)

def tilt_camera():
    """tilt, with an assertion that the camera's image arrived."""
    def act(obs):
        assert obs["pixels"].shape == (8, 8, 3)
        return int(obs["state"][2] > 0)
    return act

def swing():
    return lambda obs: np.array([np.tanh(3.0 * obs["state"][1])], np.float32) * 2.0
'''

TESTS = '''
import json, os
import pytest

@pytest.mark.hud(sim="sims:cartpole", policy="policies:tilt")
@pytest.mark.parametrize("seed", range(8))
def test_cartpole(shared_sim, robot_agent, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed))
    with open(f"where-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.txt", "a") as fh:
        fh.write(json.dumps(["cartpole", shared_sim.inline]) + "\\n")
    assert result.success

@pytest.mark.hud(sim="sims:pendulum", policy="policies:swing")
@pytest.mark.parametrize("seed", range(4))
def test_pendulum(shared_sim, robot_agent, seed):
    robot_agent.run(shared_sim.episode(seed=seed))
    with open(f"where-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.txt", "a") as fh:
        fh.write(json.dumps(["pendulum", shared_sim.inline]) + "\\n")
'''

SLOW = '''
import json, os
import pytest

@pytest.mark.hud(sim="sims:slow_camera", policy="policies:tilt_camera")
@pytest.mark.parametrize("seed", range(2))
def test_slow(shared_sim, robot_agent, seed):
    robot_agent.run(shared_sim.episode(seed=seed))
    with open(f"where-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.txt", "a") as fh:
        fh.write(json.dumps(["slow", shared_sim.inline, shared_sim.stats().get("pid")]) + "\\n")
'''


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(sims=SIMS, policies=POLICIES)
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=240)


def where(pytester: pytest.Pytester) -> list[list]:
    """What each test wrote: its sim and whether its worker ran the sim itself; files cleared."""
    out = []
    for path in sorted(pytester.path.glob("where-*.txt")):
        out += [json.loads(line) for line in path.read_text().splitlines()]
        path.unlink()
    return out


def episodes(path) -> dict:
    """Each episode as its results line defines and grades it (not where, when or how fast it ran)."""
    return {(r.task, r.seed): (r.outcome, r.steps, r.total_reward, r.success, r.score, r.claim,
                               r.identity, r.contract, r.extra.get("terminated"), r.extra.get("truncated"))
            for r in load_results(path).episodes}


def run_each(project, runs: dict) -> tuple[dict, dict, dict]:
    """Each named run (its pytest arguments): its episodes, whether its workers ran the sim
    themselves, and its result."""
    seen, ran_inline, results = {}, {}, {}
    for name, args in runs.items():
        result = results[name] = run(project, *args, f"--hud-results={name}.jsonl")
        assert result.ret in (0, 1), result.stdout.str()
        seen[name] = episodes(project.path / f"{name}.jsonl")
        ran_inline[name] = {inline for _, inline in where(project)}
    return seen, ran_inline, results


def test_the_same_episodes_run_in_the_worker_and_through_the_bridge_under_any_workers_and_width(project):
    project.makepyfile(test_both=TESTS)
    runs = {
        "bridge-n0": ["-p", "no:xdist", "--hud-inline=never"],
        "bridge-n3w2": ["-n", "3", "--hud-width=2", "--hud-inline=never"],
        "auto-n2": ["-n", "2"],
        "auto-n0": ["-p", "no:xdist"],
        "always-n3w3": ["-n", "3", "--hud-width=3", "--hud-inline=always"],
    }
    seen, ran_inline, results = run_each(project, runs)
    for name, result in results.items():
        if name.startswith("auto"):  # the choice is said, with what it measured
            result.stdout.fnmatch_lines(["note: sims:cartpole: --hud-inline=auto: each worker steps its own env, "
                                         "since one env-step (* µs) costs less than a round trip to the bridge*"])
    assert ran_inline == {"bridge-n0": {False}, "bridge-n3w2": {False}, "auto-n2": {True}, "auto-n0": {True},
                          "always-n3w3": {True}}
    reference = seen["bridge-n0"]
    assert len(reference) == 12
    assert len({steps for _, steps, *_ in reference.values()}) > 2  # the seeds really differ
    assert {outcome for outcome, *_ in reference.values()} == {"passed", "failed"}
    for name, got in seen.items():
        assert got == reference, name


def test_auto_keeps_the_shared_bridge_for_a_sim_with_a_camera_whose_step_costs_more_than_a_round_trip(project):
    project.makepyfile(test_slow=SLOW)
    result = run(project, "-n", "2", "--hud-width=2", "--hud-results=r.jsonl")
    assert result.ret in (0, 1), result.stdout.str()
    said = where(project)
    assert [inline for _, inline, _ in said] == [False, False]
    assert len({pid for *_, pid in said}) == 1 and said[0][2]  # one bridge process served both workers
    assert "--hud-inline=auto" not in result.stdout.str()
    assert len(load_results(project.path / "r.jsonl").episodes) == 2


MULTITASK = '''
import json, os
import pytest

@pytest.mark.hud(sim="sims:tasks", policy="policies:swing")
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("task", ["short", "long"])
def test_tasks(shared_sim, robot_agent, task, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed, task=task))
    with open(f"where-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.txt", "a") as fh:
        fh.write(json.dumps(["tasks", shared_sim.inline]) + "\\n")
    assert result.success
'''


def test_a_camera_less_multi_task_sim_with_slow_steps_runs_in_the_workers_with_the_same_episodes(project):
    """Its step (2 ms) costs more than a round trip, but with no image to render the workers' envs
    step side by side where the bridge's would step one after another: auto runs them inline,
    each worker with a multi-task sim of one slot, and every (task, seed) is the bridge's episode."""
    project.makepyfile(test_tasks=MULTITASK)
    runs = {
        "bridge-n0": ["-p", "no:xdist", "--hud-inline=never"],
        "bridge-n3w2": ["-n", "3", "--hud-width=2", "--hud-inline=never"],
        "auto-n2": ["-n", "2"],
    }
    seen, ran_inline, results = run_each(project, runs)
    for name, result in results.items():
        said = "note: sims:tasks: --hud-inline=auto: each worker steps its own env, since the sim renders no camera*"
        if name.startswith("auto"):
            result.stdout.fnmatch_lines([said])
        else:
            result.stdout.no_fnmatch_line(said)
    assert ran_inline == {"bridge-n0": {False}, "bridge-n3w2": {False}, "auto-n2": {True}}
    reference = seen["bridge-n0"]
    assert len(reference) == 6
    assert {steps for _, steps, *_ in reference.values()} == {12, 25}  # each claim ran its task's env
    assert {outcome for outcome, *_ in reference.values()} == {"passed", "failed"}
    assert all(score is not None for _, _, _, _, score, *_ in reference.values())
    for name, got in seen.items():
        assert got == reference, name


def test_a_sim_found_camera_less_starts_no_bridge_on_the_next_run_until_it_has_a_camera(project):
    """pytest's cache keeps what a bridge found (camera-less, separate envs): the next run starts no
    bridge for that sim and runs the same episodes in the workers; once the factory renders a camera,
    the workers that find it ask for the bridge, which keeps it, and the cache forgets it."""
    project.makepyfile(test_tasks=MULTITASK)

    def cached(name: str) -> tuple[pytest.RunResult, dict]:
        result = project.runpytest_subprocess("-n", "2", "--hud-width=2", f"--hud-results={name}.jsonl", timeout=240)
        assert result.ret in (0, 1), result.stdout.str()
        where(project)
        return result, episodes(project.path / f"{name}.jsonl")

    first, reference = cached("first")
    first.stdout.fnmatch_lines(["note: sims:tasks: --hud-inline=auto: *since the sim renders no camera: *",
                                "startup *bridge for 'sims:tasks'*"])
    saved = json.loads((project.path / ".pytest_cache" / "v" / "hud" / "sims").read_text())
    # its bridge only timed the sim, so the next run needs none: not even the standby that imports ahead
    assert saved == {"camera_less": [["sims:tasks", "{}"]], "bridges": 0}

    second, again = cached("second")
    second.stdout.fnmatch_lines(["note: sims:tasks: --hud-inline=auto: *since the sim renders no camera (an earlier "
                                 "run's bridge found so: none is started for it now)*"])
    assert "bridge for" not in second.stdout.str()
    assert again == reference and len(reference) == 6

    sims = project.path / "sims.py"  # now the sim renders a camera: the workers find it and ask for the bridge
    sims.write_text(sims.read_text().replace(
        'return UpAtEnd(Slow(gym.make("Pendulum-v1", max_episode_steps=steps), delay))',
        'return Camera(UpAtEnd(Slow(gym.make("Pendulum-v1", max_episode_steps=steps), delay)))'))
    third, with_camera = cached("third")
    third.stdout.fnmatch_lines(["startup *bridge for 'sims:tasks'*"])
    assert "--hud-inline=auto" not in third.stdout.str()
    assert {key: (outcome, steps) for key, (outcome, steps, *_) in with_camera.items()} == \
        {key: (outcome, steps) for key, (outcome, steps, *_) in reference.items()}
    saved = json.loads((project.path / ".pytest_cache" / "v" / "hud" / "sims").read_text())
    assert saved == {"camera_less": [], "bridges": 1}


def test_a_worker_that_cannot_build_the_sim_itself_errs_those_episodes_with_the_reason(project):
    project.makepyfile(test_both=TESTS.replace('sim="sims:pendulum"', 'sim="sims:no_such_factory"'))
    result = run(project, "-n", "2", "--hud-inline=always", "--hud-results=r.jsonl")
    assert result.parseoutcomes().get("errors") == 4, result.stdout.str()
    result.stdout.fnmatch_lines(["*cannot build sim 'sims:no_such_factory' in this worker*no attribute*"])
    assert {tuple(w) for w in where(project)} == {("cartpole", True)}


ASYNC = '''
import pytest

@pytest.mark.asyncio
@pytest.mark.hud(sim="sims:cartpole", policy="policies:tilt")
@pytest.mark.parametrize("seed", range(4))
async def test_cartpole(shared_sim, robot_agent, seed):
    result = await robot_agent.arun(shared_sim.episode(seed=seed))
    assert result.success
'''


def test_asyncio_episodes_are_the_same_in_the_worker_and_through_the_bridge(project):
    project.makepyfile(test_async=ASYNC)
    project.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    seen = {}
    for inline in ("never", "always"):
        result = run(project, "-p", "no:xdist", f"--hud-inline={inline}", f"--hud-results={inline}.jsonl")
        assert result.ret in (0, 1), result.stdout.str()
        seen[inline] = episodes(project.path / f"{inline}.jsonl")
    assert len(seen["never"]) == 4 and seen["always"] == seen["never"]


GONE = '''
import os, time
import pytest

@pytest.mark.hud(sim="sims:cartpole", policy="policies:tilt")
@pytest.mark.parametrize("seed", range(2))
def test_cartpole(shared_sim, robot_agent, seed):
    robot_agent.run(shared_sim.episode(seed=seed))
    assert shared_sim.inline and shared_sim.address.pid
    for _ in range(300):  # a bounded wait: the pool stops it on a thread of its own
        try:
            os.kill(shared_sim.address.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail(f"the bridge that timed the env (pid {shared_sim.address.pid}) still runs")
'''


def test_the_bridge_that_timed_a_cheap_env_stops_once_the_workers_step_it_themselves(project):
    project.makepyfile(test_gone=GONE)
    result = run(project, "-n", "2", "--hud-width=2", "--hud-results=r.jsonl")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["note: sims:cartpole: --hud-inline=auto: each worker steps its own env*"])
