"""Where a run's first seconds went: the ``startup`` summary line and the results file's figures."""

from __future__ import annotations

import json

import pytest

from pytest_hud.controller.startup import StartupClock

pytestmark = pytest.mark.timeout(240)

SUITE = '''
import gymnasium as gym
import pytest

def cartpole():
    return gym.make("CartPole-v1", max_episode_steps=20)

def push_right():
    return lambda obs: 1

@pytest.mark.hud(sim="test_suite.py:cartpole", policy="test_suite.py:push_right")
@pytest.mark.parametrize("seed", range(4))
def test_episode(shared_sim, robot_agent, seed):
    robot_agent.run(shared_sim.episode(seed=seed))
'''


@pytest.mark.parametrize("inline", ["never", "always"])
def test_a_run_says_when_its_workers_collection_bridge_and_first_episode_came(pytester, inline):
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", f"--hud-inline={inline}",
                                           "--hud-results=r.jsonl", timeout=200)
    result.assert_outcomes(passed=4)
    bridge = " · bridge for 'test_suite.py:cartpole' *→* s" if inline == "never" else ""
    result.stdout.fnmatch_lines([f"startup (s since pytest started): workers up * s · collected * s{bridge}"
                                 " · first episode * s · first result * s"])
    summary = json.loads((pytester.path / "r.jsonl").read_text().splitlines()[-1])
    startup = summary["provenance"]["startup"]
    # in the order they happen: pytest starts, its workers come up and collect, the first episode runs
    assert 0 < startup["workers_up_s"] <= startup["collected_s"] <= startup["first_episode_started_s"] \
        <= startup["first_result_s"], startup
    services = startup.get("services", [])
    assert [s["what"] for s in services] == (["bridge for 'test_suite.py:cartpole'"] if inline == "never" else [])
    for service in services:  # started once a worker declared the sim, ready before the first episode
        assert 0 < service["started_s"] <= service["ready_s"] <= startup["first_episode_started_s"]


def test_the_clock_keeps_the_last_of_some_marks_and_the_first_of_others():
    clock = StartupClock(origin=10.0)
    clock.mark("collected", 11.0)
    clock.mark("collected", 12.5)  # the last worker to collect
    clock.first("first_result", 14.0)
    clock.first("first_result", 15.0)
    assert clock.to_dict() == {"collected_s": 2.5, "first_result_s": 4.0}
    assert clock.line([("policy server for 'ckpt'", 10.5, 13.0)]) == \
        "collected 2.5 s · policy server for 'ckpt' 0.5→3.0 s · first result 4.0 s"


LATE_SIM = '''
import gymnasium as gym

def cartpole(max_episode_steps=20):
    return gym.make("CartPole-v1", max_episode_steps=max_episode_steps)
'''


def test_the_first_bridge_is_a_standby_that_imported_ahead_with_the_runs_secret_and_paths(tmp_path):
    # The sim's module is importable only from a path a worker declares after the standby started.
    from conftest import standbys
    from pytest_hud.client.bridge import ControlClient
    from pytest_hud.controller.pool import BridgeSpec, SimPool

    (tmp_path / "late_sims.py").write_text(LATE_SIM)
    pool = SimPool("s3cret", BridgeSpec(width=1, inline="never"), workers=1)
    try:
        assert pool.warm_bridge()
        assert not pool.warm_bridge()  # one standby
        (standby,) = standbys()
        pool.add_python_path([str(tmp_path)])
        address = pool.bridge_for("late_sims:cartpole", {})
        assert address.pid == standby.pid  # it became the bridge: no other process started
        with ControlClient(address, timeout=10.0) as control:  # the control channel takes the run's secret
            assert control.round_trip_s() > 0
        assert pool.bridge_for("late_sims:cartpole", {"max_episode_steps": 5}).pid != standby.pid
    finally:
        pool.stop_all()
    assert not standby.is_running()


@pytest.mark.parametrize("spec", [{"inline": "always"}, {"attach": True}])
def test_a_run_that_starts_no_bridge_warms_none(spec):
    from pytest_hud.client.bridge import BridgeAddress
    from pytest_hud.controller.pool import BridgeSpec, SimPool

    attach = BridgeAddress(host="127.0.0.1", control=1, ws=2, secret="s") if spec.get("attach") else None
    pool = SimPool("s3cret", BridgeSpec(width=1, inline=spec.get("inline", "auto")), workers=1, attach=attach)
    try:
        assert not pool.warm_bridge()
    finally:
        pool.stop_all()


IMPORTS = '''
import sys
import pytest

HEAVY = ("numpy", "websockets", "gymnasium")


def _write(name):
    with open(f"imports-{name}.txt", "w") as fh:
        fh.write(",".join(sorted(m for m in HEAVY if m in sys.modules)))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    """Before xdist starts its workers: what the controller has imported so far."""
    if not hasattr(session.config, "workerinput"):  # (this run may itself run in an xdist worker)
        _write("controller-start")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """At the very end: what this process imported (the controller, or a worker by its id)."""
    _write(getattr(config, "workerinput", {}).get("workerid", "controller") + "-end")
'''


def _imports(pytester, *args: str) -> dict[str, str]:
    """Run the suite with ``args``; what each process had imported of numpy, websockets and gymnasium,
    by ``controller-start``, ``controller-end``, ``gw0-end``, ..."""
    pytester.makepyfile(test_suite=SUITE)
    pytester.makeconftest(IMPORTS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--hud-results=r.jsonl", *args,
                                           timeout=200)
    result.assert_outcomes(passed=4)
    return {f.stem.removeprefix("imports-"): f.read_text() for f in pytester.path.glob("imports-*.txt")}


def test_the_controller_starts_the_workers_before_it_imports_numpy_or_the_websocket_stack(pytester):
    """The controller's start-up is on every run's critical path (xdist starts its workers after
    it): it reads its settings and gate without numpy, the bridge client or a sim."""
    assert _imports(pytester, "--hud-max-drop=0.1")["controller-start"] == ""


def test_a_run_whose_workers_step_their_sims_imports_no_websocket_stack_and_no_numpy_in_the_controller(pytester):
    """Sims stepped in the workers talk to no bridge: neither the controller (its summary, its progress
    line, its results file) nor a worker imports the WebSocket stack, and the controller no numpy."""
    imports = _imports(pytester, "--hud-inline=always")
    assert imports["controller-end"] == ""
    assert imports["gw0-end"] == imports["gw1-end"] == "gymnasium,numpy"
