"""The plugin as users meet it: pytester runs in subprocesses, real bridges, xdist workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest

from pytest_hud.client import ControlClient
from pytest_hud.core.results import load_results
from pytest_hud.sim.threads import default_threads

pytestmark = pytest.mark.timeout(240)

SIMS = '''
import gymnasium as gym

class Success(gym.Wrapper):
    """CartPole succeeds when it is still up at the time limit."""
    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        info["is_success"] = bool(truncated and not terminated)
        return obs, reward, terminated, truncated, info

def cartpole(max_steps=60):
    return Success(gym.make("CartPole-v1", max_episode_steps=max_steps))
'''

POLICIES = '''
import numpy as np

def balance():
    return lambda obs: int(obs["state"][2] + 0.5 * obs["state"][3] > 0)

def tilt():
    """Weak on purpose: episode lengths then depend on the seed."""
    return lambda obs: int(obs["state"][2] > 0)

def pendulum_zero():
    return lambda obs: np.zeros(1, np.float32)
'''

INI = """
[pytest]
hud_sim = sims:cartpole
hud_policy = policies:balance
hud_inline = never
"""  # (this file drives real bridges: CartPole's cheap steps would otherwise run in the workers)


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(sims=SIMS, policies=POLICIES)
    pytester.makeini(INI)
    return pytester


def run(pytester: pytest.Pytester, *args: str, timeout: float = 180) -> pytest.RunResult:
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=timeout)


BALANCE = '''
import pytest

@pytest.mark.parametrize("seed", range(6))
def test_balance(shared_sim, robot_agent, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed))
    assert result.success
'''


# BALANCE, each episode also noting which worker ran it on which bridge process
BALANCE_NOTING_THE_BRIDGE = BALANCE.replace("import pytest\n", "import os\nimport pytest\n", 1) + '''
    with open("bridges.txt", "a") as fh:
        fh.write(f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')} {shared_sim.stats()['pid']}\\n")
'''


def bridges_noted(pytester: pytest.Pytester) -> list[tuple[str, int]]:
    """(worker, bridge pid) of every episode of BALANCE_NOTING_THE_BRIDGE (read after the run ended)."""
    lines = (pytester.path / "bridges.txt").read_text().splitlines()
    return [(worker, int(pid)) for worker, pid in (line.split() for line in lines)]


def test_two_workers_share_a_bridge_and_junit_carries_episode_properties(project):
    project.makepyfile(test_cartpole=BALANCE_NOTING_THE_BRIDGE)
    result = run(project, "-n", "2", "--hud-width=2", "--junitxml=junit.xml", "--hud-results=r.jsonl")
    result.assert_outcomes(passed=6)
    # both workers' episodes ran on one bridge process (one per worker would show two pids)
    noted = bridges_noted(project)
    assert len(noted) == 6 and {worker for worker, _ in noted} == {"gw0", "gw1"}, noted
    assert len({pid for _, pid in noted}) == 1, noted
    result.stdout.fnmatch_lines(["*pytest-hud summary*", "*test_cartpole.py::test_balance*6*6*100.0%*",
                                 "coverage: 6/6 declared episodes reported, 6 graded, 0 errors*"])
    root = ET.parse(project.path / "junit.xml").getroot()
    cases = root.findall(".//testcase")
    assert len(cases) == 6
    for case in cases:
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        assert props["task"] == "test_cartpole.py::test_balance"
        assert props["success"] == "True" and props["steps"] == "60" and props["slot"] in ("0", "1")
        assert props["seed"] == props["episode"]
    results = load_results(project.path / "r.jsonl")
    assert results.complete and len(results.episodes) == 6
    assert {r.worker for r in results.episodes} == {"gw0", "gw1"}
    prov = results.provenance
    assert prov["policy"] == "policies:balance" and prov["policy_hash"].startswith("sha256:")
    assert prov["width"] == 2 and "gymnasium" in prov["versions"]
    # Every record's identity (what --hud-resume matches on) has the policy's hash, hashed once by
    # the controller from the files the workers found: the same as the provenance's.
    from pytest_hud.agent.model import policy_content_hash

    assert {r.identity["policy_hash"] for r in results.episodes} == {prov["policy_hash"]}
    assert prov["policy_hash"] == policy_content_hash(str(project.path / "policies.py") + ":balance")


def test_a_policy_only_the_workers_can_import_still_has_its_hash_on_every_record(project):
    # The test folder is on the workers' sys.path (pytest's collection), not on the controller's:
    # the workers find the policy's files, the controller hashes them once.
    suite = project.mkdir("suite")
    (suite / "suite_policies.py").write_text(POLICIES)
    (suite / "test_marked.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.hud(policy='suite_policies:balance')\n"
        "@pytest.mark.parametrize('seed', range(4))\n"
        "def test_marked(shared_sim, robot_agent, seed):\n"
        "    assert robot_agent.run(shared_sim.episode(seed=seed)).success\n")
    result = run(project, "suite", "-n", "2", "--hud-width=2", "--hud-results=r.jsonl")
    result.assert_outcomes(passed=4)
    from pytest_hud.agent.model import policy_content_hash

    results = load_results(project.path / "r.jsonl")
    want = policy_content_hash(f"{suite / 'suite_policies.py'}:balance")
    assert want and {r.identity["policy_hash"] for r in results.episodes} == {want}


def test_no_xdist_runs_in_process(project):
    project.makepyfile(test_cartpole=BALANCE)
    result = run(project, "-p", "no:xdist")
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["hud: sim=sims:cartpole width=1 workers=1*"])


def test_a_killed_worker_is_an_error_its_slot_is_freed_and_the_rest_pass(project):
    # One worker on one bridge of one slot: the replacement worker shares the bridge (one worker per
    # bridge group) and every episode after the crash claims the very slot the dead worker held.
    # Freed when the dead worker's control connection closed, it is claimed again at once; left held,
    # those claims would wait for the bridge's 600 s slot wait, and --timeout fails them instead.
    project.makepyfile(test_crash='''
import os, time, pytest

@pytest.mark.parametrize("seed", range(6))
def test_episode(shared_sim, robot_agent, seed):
    if seed == 2:
        with shared_sim.episode(seed=seed) as ep:
            with open("crash.txt", "w") as fh:
                fh.write(f"{time.time()}\\n")
            os._exit(1)   # the worker dies holding a claimed slot
    with shared_sim.episode(seed=seed) as ep:
        with open("claims.txt", "a") as fh:
            fh.write(f"{time.time()}\\n")
        result = robot_agent.run(ep)
    assert result.success
''')
    result = run(project, "-n", "1", "--hud-width=1", "--hud-results=r.jsonl", "--timeout=30")
    result.assert_outcomes(passed=5, errors=1)
    crashed = float((project.path / "crash.txt").read_text())
    claims = [float(t) for t in (project.path / "claims.txt").read_text().split()]
    after = sorted(t for t in claims if t > crashed)
    assert len(after) == 3, (crashed, claims)  # one worker runs the seeds in order: 3, 4 and 5 came after
    result.stdout.fnmatch_lines(["*coverage: 6/6 declared episodes reported, 5 graded, 1 errors*"])
    records = {r.episode: r for r in load_results(project.path / "r.jsonl").episodes}
    assert records["2"].outcome == "error" and "crashed" in records["2"].error
    assert all(records[s].outcome == "passed" for s in "01345")


def test_numpy_scalars_recorded_by_users_cross_the_xdist_channel(project):
    project.makepyfile(test_props='''
import numpy as np, pytest

@pytest.mark.parametrize("seed", range(2))
def test_props(shared_sim, robot_agent, record_property, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed))
    record_property("mean_obs", np.float32(0.5))
    record_property("flags", np.array([1, 2], dtype=np.int64))
    assert result.success
''')
    result = run(project, "-n", "2", "--junitxml=j.xml")
    result.assert_outcomes(passed=2)
    text = (project.path / "j.xml").read_text()
    assert 'name="mean_obs" value="0.5"' in text and 'value="[1, 2]"' in text


def test_two_sims_in_one_session_get_two_bridges(project):
    project.makepyfile(test_two='''
import pytest

@pytest.mark.parametrize("seed", range(2))
def test_cartpole(shared_sim, robot_agent, seed):
    assert robot_agent.run(shared_sim.episode(seed=seed)).success
    pytest.cartpole_pid = shared_sim.stats()["pid"]

@pytest.mark.hud(sim="Pendulum-v1", policy="policies:pendulum_zero", max_steps=5)
@pytest.mark.parametrize("seed", range(2))
def test_pendulum(shared_sim, robot_agent, record_property, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed))
    assert result.steps == 5 and shared_sim.contract.action.type == "box"
    assert shared_sim.stats()["pid"] != getattr(pytest, "cartpole_pid", None)
    record_property("bridge_pid", shared_sim.stats()["pid"])
''')
    result = run(project, "-p", "no:xdist", "--hud-results=r.jsonl")
    result.assert_outcomes(passed=4)
    tasks = load_results(project.path / "r.jsonl").summary["tasks"]
    assert set(tasks) == {"test_two.py::test_cartpole", "test_two.py::test_pendulum"}


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


def test_an_xdist_worker_leaves_its_last_garbage_collection_to_the_os_once_its_work_is_done(project):
    """Only after the worker's session closed: its episodes are reported and its files written."""
    project.makeconftest('''
import atexit, gc

def pytest_configure(config):
    if hasattr(config, "workerinput"):  # (not the environment: this run may itself be in a worker)
        worker = config.workerinput["workerid"]

        def _exit_state():  # runs after pytest_unconfigure, when the worker exits
            with open(f"exit-{worker}.txt", "w") as fh:
                fh.write(str(gc.get_freeze_count()))

        atexit.register(_exit_state)

def pytest_runtest_teardown(item):
    assert gc.get_freeze_count() == 0  # not while episodes run
''')
    project.makepyfile(test_balance=BALANCE)
    run(project, "-n", "2", "--hud-results=r.jsonl").assert_outcomes(passed=6)
    frozen = [int((project.path / f"exit-gw{i}.txt").read_text()) for i in range(2)]
    assert all(count > 1000 for count in frozen), frozen
    assert len(load_results(project.path / "r.jsonl").episodes) == 6


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


def test_the_tutorials_layout_runs_its_sim_and_policy_modules_from_the_eval_folder(pytester):
    """The README's tutorial: ``sims.py`` and ``policies.py`` beside the test file in ``my_evals/``,
    named as ``sims:my_task``, run from the folder above. Only pytest's collection puts
    ``my_evals/`` on a worker's path, so bridges and policy servers get the workers' project paths."""
    evals = pytester.mkdir("my_evals")
    (evals / "sims.py").write_text(SIMS)
    (evals / "policies.py").write_text(POLICIES)
    (evals / "test_my_task.py").write_text("""
import pytest

pytestmark = pytest.mark.hud(sim="sims:cartpole", policy="policies:balance", max_steps=60)

@pytest.mark.parametrize("seed", range(4))
def test_my_task(shared_sim, robot_agent, seed):
    assert robot_agent.run(shared_sim.episode(seed=seed)).success
""")
    for args in (["-n", "2"], ["-n", "2", "--hud-policy-server"], ["-p", "no:xdist"]):
        result = run(pytester, "my_evals/test_my_task.py", *args)
        result.assert_outcomes(passed=4)
    # the same modules named on the command line: checked at start-up with the tests' folder on the path
    (evals / "test_cli.py").write_text("""
def test_cli(shared_sim, robot_agent):
    assert robot_agent.run(shared_sim.episode(seed=1)).success
""")
    cli = run(pytester, "my_evals/test_cli.py", "-n", "2", "--hud-sim=sims:cartpole",
              "--hud-policy=policies:balance", "--hud-max-steps=60")
    cli.assert_outcomes(passed=1)
    unknown = run(pytester, "my_evals/test_cli.py", "-n", "2", "--hud-sim=simz:cartpole")
    assert unknown.ret == pytest.ExitCode.USAGE_ERROR
    unknown.stderr.fnmatch_lines(["*--hud-sim: unknown sim target 'simz:cartpole': no module 'simz' is "
                                  "importable here, and it is not a registered gymnasium id*"])


def test_a_sim_or_policy_server_that_exits_while_starting_is_started_once_and_every_episode_gets_its_error(project):
    project.makepyfile(test_cartpole=BALANCE, broken="""
import os

def sim():
    with open(os.path.join(os.path.dirname(__file__), "starts.txt"), "a") as fh:
        fh.write("start\\n")
    raise RuntimeError("this env cannot be built")
""", test_broken="""
import pytest

@pytest.mark.parametrize("seed", range(4))
def test_broken(shared_sim, robot_agent, seed):
    robot_agent.run(shared_sim.episode(seed=seed))
""")
    result = run(project, "test_broken.py", "-n", "2", "--hud-sim=broken:sim")
    result.assert_outcomes(errors=4)
    result.stdout.fnmatch_lines(["*RuntimeError: this env cannot be built*"])
    assert "not again: it exited while starting" in result.stdout.str()
    assert (project.path / "starts.txt").read_text().count("start") == 1
    # a policy server that cannot load its policy: the same, once per run
    project.makepyfile(bad_policy="""
import os

def policy():
    with open(os.path.join(os.path.dirname(__file__), "loads.txt"), "a") as fh:
        fh.write("load\\n")
    raise RuntimeError("these weights are corrupt")
""")
    served = run(project, "test_cartpole.py", "-n", "2", "--hud-policy-server", "--hud-policy=bad_policy:policy")
    served.assert_outcomes(errors=6)
    served.stdout.fnmatch_lines(["*no policy server for 'bad_policy:policy'*"])
    assert (project.path / "loads.txt").read_text().count("load") == 1
    # in the workers: loaded once per worker, every episode names the policy
    (project.path / "loads.txt").unlink()
    local = run(project, "test_cartpole.py", "-n", "2", "--hud-policy=bad_policy:policy")
    local.assert_outcomes(errors=6)
    local.stdout.fnmatch_lines(["*cannot load policy 'bad_policy:policy': RuntimeError: these weights are corrupt*"])
    assert "not loaded again" in local.stdout.str()
    assert (project.path / "loads.txt").read_text().count("load") <= 2  # one per worker


def test_results_file_keeps_every_finished_episode_when_the_run_is_killed(project):
    project.makepyfile(test_slow='''
import time, pytest

@pytest.mark.parametrize("seed", range(40))
def test_slow(shared_sim, robot_agent, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed))
    time.sleep(0.15)
    assert result.success
''')
    results = project.path / "r.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:xdist", f"--hud-results={results}", "-v"],
        cwd=project.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    passed = 0
    deadline = time.monotonic() + 120
    while passed < 5 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        passed += " PASSED" in line
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)
    loaded = load_results(results)
    assert not loaded.complete
    assert len(loaded.episodes) >= passed >= 5
    assert all(r.outcome == "passed" for r in loaded.episodes)


def test_an_unknown_sim_is_a_usage_error(project):
    project.makepyfile(test_x=BALANCE)
    result = run(project, "-p", "no:xdist", "--hud-sim=NoSuchEnv-v9")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--hud-sim: unknown sim target 'NoSuchEnv-v9'*"])


def test_a_policy_error_is_an_error_not_a_failure(project):
    # (A policy that names nothing is a usage error before anything runs; this one fails to load.)
    project.makepyfile(broken_policies='def broken():\n    raise RuntimeError("no checkpoint here")\n')
    project.makepyfile(test_bad='''
import pytest

@pytest.mark.hud(policy="broken_policies:broken")
def test_bad(shared_sim, robot_agent):
    robot_agent.run(shared_sim.episode(seed=0))

def test_failed_assertion_is_a_failure(shared_sim, robot_agent):
    result = robot_agent.run(shared_sim.episode(seed=0))
    assert result.steps > 1000
''')
    result = run(project, "-p", "no:xdist", "--junitxml=j.xml")
    result.assert_outcomes(failed=1, errors=1)
    root = ET.parse(project.path / "j.xml").getroot()
    assert len(root.findall(".//error")) == 1 and len(root.findall(".//failure")) == 1


def test_async_tests_use_arun_under_pytest_asyncio(project):
    project.makepyfile(test_async='''
import pytest

@pytest.mark.asyncio
@pytest.mark.parametrize("seed", range(2))
async def test_async(shared_sim, robot_agent, seed):
    result = await robot_agent.arun(shared_sim.episode(seed=seed))
    assert result.success and result.steps == 60
''')
    result = run(project, "-p", "no:xdist")
    result.assert_outcomes(passed=2)


def test_a_dead_bridge_is_replaced_and_later_episodes_run(project):
    project.makepyfile(test_replace='''
import os, signal, pytest

@pytest.mark.parametrize("seed", range(4))
def test_episode(shared_sim, robot_agent, seed):
    if seed == 1:
        with shared_sim.episode(seed=seed) as ep:
            os.kill(shared_sim.stats()["pid"], signal.SIGKILL)
            robot_agent.run(ep)
    assert robot_agent.run(shared_sim.episode(seed=seed)).success
''')
    result = run(project, "-p", "no:xdist", "--hud-results=r.jsonl")
    result.assert_outcomes(passed=3, errors=1)
    records = {r.episode: r for r in load_results(project.path / "r.jsonl").episodes}
    assert records["1"].outcome == "error" and "slot" in records["1"].error


def test_fixtures_are_documented(project):
    result = run(project, "--fixtures", "-p", "no:xdist")
    result.stdout.fnmatch_lines(["shared_sim -- *", "*handle on the shared simulator bridge*"])
    result.stdout.fnmatch_lines(["robot_agent -- *", "*policy harness*"])


def test_disabling_the_plugin_with_p_no_hud(project):
    project.makepyfile(test_plain="def test_plain():\n    assert True\n")
    result = run(project, "-p", "no:hud")
    result.assert_outcomes(passed=1)
    assert "pytest-hud" not in result.stdout.str()


def test_attach_to_a_bridge_someone_else_started(project, bridge):
    address = bridge(f"{project.path / 'sims.py'}:cartpole", 1)
    announce = project.path / "announce.json"
    announce.write_text(json.dumps(address.to_dict()))
    project.makepyfile(test_cartpole=BALANCE_NOTING_THE_BRIDGE)
    result = run(project, "-p", "no:xdist", f"--hud-sim-url={announce}")
    result.assert_outcomes(passed=6)
    # the episodes ran on the given bridge, not on one the plugin started for itself
    assert address.pid == bridge.processes[-1].pid
    assert {pid for _, pid in bridges_noted(project)} == {address.pid}
    with ControlClient(address) as control:
        stats = control.stats()
    assert stats["pid"] == address.pid and stats["episodes"] == 6, stats


def test_a_policy_that_never_returns_does_not_hang_the_worker(project):
    project.makepyfile(test_hang='''
import time

def test_hang(shared_sim, robot_agent):
    robot_agent.policy = "test_hang:forever"
    robot_agent.run(shared_sim.episode(seed=0))

def forever():
    def act(obs):
        time.sleep(3600)
    return act

def test_after(shared_sim, robot_agent):
    assert robot_agent.run(shared_sim.episode(seed=1)).success
''')
    t0 = time.monotonic()
    result = run(project, "-p", "no:xdist", "-p", "no:timeout", "--hud-first-action-timeout=1",
                 "--hud-results=r.jsonl")
    assert time.monotonic() - t0 < 60
    result.assert_outcomes(passed=1, errors=1)
    hung = {r.task: r for r in load_results(project.path / "r.jsonl").episodes}["test_hang.py::test_hang"]
    assert hung.outcome == "error" and "--hud-first-action-timeout" in hung.error
