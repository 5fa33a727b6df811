"""A bridge lives while its sim has episodes to run: a run of several sims (LIBERO's suites, each
bridge holding ``width`` envs of a few GB) starts the bridges of the sims its workers begin with and
the next one's ahead, stops each once the last of its sim's declared episodes is reported, and then
starts the next; what a stopped bridge had to say (a slot it retired) still reaches the summary."""

from __future__ import annotations

import json
import re

import pytest

from conftest import SIMKIT

pytestmark = pytest.mark.timeout(240)

SUITE = '''
import json, time
import pytest
from pytest_hud.worker.keys import SESSION_KEY

SIM = {simkit!r} + ":faulty"
BUILDS = {{"a": {{"reset_faults": [13]}}, "b": {{"delay": 0.001}}, "c": {{"delay": 0.0015}}}}
NAMES = {{json.dumps(b, sort_keys=True): n for n, b in BUILDS.items()}}

def hold():
    return lambda obs: [0.0]

def seen(request, name, wait_for_stopped=None):
    """The bridges the pool has started so far ({{sim name: alive}}), written to bridges-NAME.jsonl;
    first waiting (up to 20 s) until the bridges of ``wait_for_stopped`` are not alive."""
    session = request.config.stash[SESSION_KEY]
    deadline = time.monotonic() + 20
    while True:
        now = {{}}
        for b in session.pool_call("bridges"):
            key = NAMES[json.dumps(b["build"], sort_keys=True)]
            now[key] = now.get(key, False) or b["alive"]
        if wait_for_stopped is None or not now.get(wait_for_stopped) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    with open(f"bridges-{{name}}.jsonl", "a") as fh:
        fh.write(json.dumps(now) + "\\n")

@pytest.mark.hud(sim=SIM, build=BUILDS["a"], policy="test_suite.py:hold", max_steps=3)
@pytest.mark.parametrize("seed", [pytest.param(13, id="x"), pytest.param(13, id="y"), pytest.param(13, id="z"), 1])
def test_a(shared_sim, robot_agent, seed, request):
    seen(request, "a")
    robot_agent.run(shared_sim.episode(seed=seed))

@pytest.mark.hud(sim=SIM, build=BUILDS["b"], policy="test_suite.py:hold", max_steps=3)
@pytest.mark.parametrize("seed", range(2))
def test_b(shared_sim, robot_agent, seed, request):
    robot_agent.run(shared_sim.episode(seed=seed))
    seen(request, "b", wait_for_stopped="a")

@pytest.mark.hud(sim=SIM, build=BUILDS["c"], policy="test_suite.py:hold", max_steps=3)
@pytest.mark.parametrize("seed", range(2))
def test_c(shared_sim, robot_agent, seed, request):
    robot_agent.run(shared_sim.episode(seed=seed))
'''


def test_each_bridge_starts_when_its_sim_is_first_needed_and_stops_once_its_episodes_are_reported(pytester):
    pytester.makepyfile(test_suite=SUITE.format(simkit=str(SIMKIT)))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-p", "no:xdist", "--hud-width=2",
                                           "--hud-inline=never", "--hud-results=r.jsonl", timeout=200)
    # three claims of a seed its env refuses: slot 0 raised, was rebuilt twice, then retired
    result.assert_outcomes(passed=5, errors=3)

    def lines(name):
        return [json.loads(line) for line in (pytester.path / f"bridges-{name}.jsonl").read_text().splitlines()]

    # while sim a's episodes ran, its bridge was up and at most the next sim's besides (booting
    # ahead): c's starts only once a's is done
    assert all(now.get("a") and "c" not in now for now in lines("a")), lines("a")
    # once a's last episode was reported, its bridge stopped while b's ran
    assert all(now.get("b") for now in lines("b")) and not lines("b")[-1]["a"], lines("b")
    # what the stopped bridge said reaches the summary, labelled with its build
    result.stdout.fnmatch_lines(['note: bridge for *simkit.py:faulty {"reset_faults": [[]13[]]}: slot 0 retired: '
                                 "its env raised 3 times*the bridge runs on 1 of 2 slots"])
    # the start-up line tells the bridges of one target apart by their build arguments (in the
    # order they started: a and the next sim's, booting ahead, may start in the same instant)
    startup = [line for line in result.outlines if line.startswith("startup ")]
    assert len(startup) == 1, result.outlines
    for build in ('{"reset_faults": [13]}', '{"delay": 0.001}'):
        assert re.search(rf" · bridge for '[^']*simkit.py:faulty' {re.escape(build)} [0-9.]+→[0-9.]+ s", startup[0]), \
            startup[0]
    records = [json.loads(line) for line in (pytester.path / "r.jsonl").read_text().splitlines()]
    assert sum(r.get("record") == "episode" for r in records) == 8
