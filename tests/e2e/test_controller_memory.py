"""What the controller and the workers keep per episode in a real run: tallies and ids, not records.

The records are on disk (the results file, or a private spool without ``--hud-results``); once
every plugin has seen an episode's reports, pytest keeps them without their episode payload, and
JUnit XML, the short summary and the gate still get everything they need. pytest keeps every test
item in the workers until the run ends: once an episode's reports are made, its item holds neither
the episode (result, grade, claim) nor the properties mirrored from its record.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from pytest_hud.core.results import load_results

pytestmark = pytest.mark.timeout(240)

CARTPOLE = Path(__file__).resolve().parents[2] / "evals" / "sims" / "classic.py"

SUITE = f'''
import pytest

pytestmark = pytest.mark.hud(sim={str(CARTPOLE) + ":cartpole"!r}, policy="policies:lean", max_steps=20,
                              min_success=0.3)


@pytest.mark.parametrize("seed", range(12))
def test_balance(shared_sim, robot_agent, seed):
    if seed == 11:
        raise RuntimeError("the policy crashed")  # an error, not a failed episode
    result = robot_agent.run(shared_sim.episode(seed=seed))
    assert seed % 2 == 0, "odd seeds fail on purpose"
'''

POLICIES = '''
def lean():
    return lambda obs: int(obs["state"][2] > 0)
'''

# Runs in the controller at the very end: what pytest still holds of each episode's reports;
# and in each worker once its tests ran: what its test items still hold.
CONFTEST = '''
import json

def pytest_sessionfinish(session):
    config = session.config
    if not hasattr(config, "workerinput"):
        return
    from pytest_hud.worker.keys import EPISODES_KEY

    held = [{"nodeid": item.nodeid, "episode": EPISODES_KEY in item.stash,
             "properties": [p[0] for p in item.user_properties]} for item in session.items]
    tr = config.pluginmanager.get_plugin("terminalreporter")  # the worker's reports, kept too
    held += [{"nodeid": rep.nodeid, "episode": set(getattr(rep, "hud_episode", None) or {}) - {"outcome"} != set(),
              "properties": [p[0] for p in rep.user_properties]}
             for reports in tr.stats.values() for rep in reports if hasattr(rep, "when")]
    with open(f"items-{config.workerinput['workerid']}.json", "w") as fh:
        json.dump(held, fh)

def pytest_unconfigure(config):
    if hasattr(config, "workerinput"):
        return
    tr = config.pluginmanager.get_plugin("terminalreporter")
    kept = []
    for reports in tr.stats.values():
        for rep in reports:
            if hasattr(rep, "when"):
                kept.append({"nodeid": rep.nodeid, "when": rep.when, "hud_episode": dict(getattr(rep, "hud_episode", None) or {}),
                             "properties": [p[0] for p in rep.user_properties],
                         "keywords": len(rep.keywords)})
    with open("kept.json", "w") as fh:
        json.dump(kept, fh)
'''


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(policies=POLICIES, test_balance=SUITE)
    pytester.makeconftest(CONFTEST)
    return pytester


@pytest.mark.parametrize("results", [True, False], ids=["results-file", "no-results-file"])
def test_kept_reports_lose_their_episode_payload_after_junit_and_the_summary_read_it(project, results):
    args = ["-n", "2", "--hud-width=2", "-rA", "--junitxml=junit.xml",
            "-p", "no:cacheprovider"] + (["--hud-results=r.jsonl"] if results else [])
    result = project.runpytest_subprocess(*args, timeout=180)
    # The gate (a floor) passes 6/11 = 55% > 30%: the failed episodes are data, the run exits 0.
    assert result.ret == 0, result.stdout.str()
    result.stdout.fnmatch_lines(["*test_balance* 11 * 6 * 54.5%*", "ERROR test_balance.py::test_balance[[]11[]]*"])
    kept = json.loads((project.path / "kept.json").read_text())
    assert {k["nodeid"] for k in kept} == {f"test_balance.py::test_balance[{s}]" for s in range(12)}
    # Nothing but a marker of the outcome (the short summary's ERROR reads it) stays on a report.
    assert all(set(k["hud_episode"]) <= {"outcome"} and "task" not in k["properties"] for k in kept), kept
    # nor the keywords of the report that carried the episode (read while it was logged)
    assert all(k["keywords"] == 0 for k in kept if k["when"] == "call"), kept
    # JUnit XML read each episode's properties before they were dropped.
    cases = ET.parse(project.path / "junit.xml").getroot().iter("testcase")
    props = {c.get("name"): {p.get("name"): p.get("value") for p in c.iter("property")} for c in cases}
    assert props["test_balance[2]"]["success"] == "True" and props["test_balance[3]"]["success"] == "False"
    assert props["test_balance[11]"]["outcome"] == "error"
    # The workers' items (each worker collects all 12) and the reports they keep dropped the episode
    # and its properties once the reports were sent.
    held = [h for path in project.path.glob("items-gw*.json") for h in json.loads(path.read_text())]
    assert len(held) == 24 + 3 * 12 and not any(h["episode"] or h["properties"] for h in held), held
    if results:
        assert len(load_results(project.path / "r.jsonl").episodes) == 12
    else:  # the private spool is gone, and no results file was written
        assert not list(project.path.glob("*.jsonl")) and "hud: results ->" not in result.stdout.str()
