"""The plugin as users meet it: pytester runs in subprocesses, real bridges, xdist workers."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET

import pytest

from pluginkit import (  # noqa: F401 - project is a fixture
    BALANCE,
    BALANCE_NOTING_THE_BRIDGE,
    POLICIES,
    SIMS,
    bridges_noted,
    project,
    run,
)
from pytest_hud.client import ControlClient
from pytest_hud.core.results import load_results

pytestmark = pytest.mark.timeout(240)


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
    # (looked up while the workers start; the header waited for them and keeps their place)
    keys = list(prov)
    assert "git" in keys and keys.index("platform") < keys.index("versions") < keys.index("git") < keys.index("options")
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


def test_an_unknown_sim_is_a_usage_error(project):
    project.makepyfile(test_x=BALANCE)
    result = run(project, "-p", "no:xdist", "--hud-sim=NoSuchEnv-v9")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--hud-sim: unknown sim target 'NoSuchEnv-v9'*"])


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
