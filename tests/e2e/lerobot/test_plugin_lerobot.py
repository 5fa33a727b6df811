"""LeRobot checkpoints through the plugin: in-worker, through the policy server, and mismatches."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytest.importorskip("lerobot.policies")  # not "lerobot": tests/e2e/lerobot itself would satisfy that

from pytest_hud.core.results import load_results  # noqa: E402

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[3]
REACH = ROOT / "evals" / "sims" / "reach.py"
FINAL = ROOT / "evals" / "checkpoints" / "reach_act" / "final"

SUITE = f'''
import sys
import pytest

pytestmark = pytest.mark.hud(sim={str(REACH) + ":make_reach"!r}, policy={str(FINAL)!r})

@pytest.mark.parametrize("seed", range(6))
def test_reach(shared_sim, robot_agent, record_property, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed, prompt="reach the green goal"))
    record_property("torch_loaded", "torch" in sys.modules)
    assert result.success
'''

MISMATCH = '''
import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

class Other(gym.Env):
    observation_space = spaces.Dict({"joints": spaces.Box(-1, 1, (4,), np.float32)})
    action_space = spaces.Box(-1, 1, (2,), np.float32)
    def reset(self, *, seed=None, options=None):
        return {"joints": np.zeros(4, np.float32)}, {}
    def step(self, action):
        return {"joints": np.zeros(4, np.float32)}, 0.0, True, False, {}

def other():
    return Other()
'''


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_reach=SUITE, sims_other=MISMATCH)
    return pytester


def _records(path: Path) -> dict[str, object]:
    return {r.episode: r for r in load_results(path).episodes}


def _torch_loaded(junit: Path) -> dict[str, str | None]:
    """Each testcase's ``torch_loaded`` property (None where it has none)."""
    def value(case: ET.Element) -> str | None:
        return next((p.get("value") for p in case.iter("property") if p.get("name") == "torch_loaded"), None)

    return {case.get("name"): value(case) for case in ET.parse(junit).getroot().iter("testcase")}


def test_a_lerobot_checkpoint_drives_episodes_through_the_bridge_and_the_plugin(project):
    result = project.runpytest_subprocess("-n", "2", "--hud-results=r.jsonl", "--junitxml=j.xml", timeout=240)
    result.assert_outcomes(passed=6)
    records = _records(project.path / "r.jsonl")
    assert all(r.success and r.steps < 40 for r in records.values())
    loaded = _torch_loaded(project.path / "j.xml")
    assert len(loaded) == 6 and set(loaded.values()) == {"True"}, loaded  # every worker ran the model
    (policy,) = load_results(project.path / "r.jsonl").provenance["policies"]
    assert policy["policy"] == str(FINAL) and policy["policy_hash"].startswith("sha256:")


def test_with_the_policy_server_workers_load_no_model_and_results_are_identical(project):
    local = project.runpytest_subprocess("-n", "2", "--hud-results=local.jsonl", timeout=240)
    local.assert_outcomes(passed=6)
    served = project.runpytest_subprocess("-n", "2", "--hud-policy-server", "--hud-results=served.jsonl",
                                          "--junitxml=j.xml", timeout=240)
    served.assert_outcomes(passed=6)
    loaded = _torch_loaded(project.path / "j.xml")
    assert len(loaded) == 6 and set(loaded.values()) == {"False"}, loaded  # no worker imported torch
    a, b = _records(project.path / "local.jsonl"), _records(project.path / "served.jsonl")
    # Same episodes; a batched forward may differ from a single one in the last float bits only.
    assert {k: (r.steps, r.success) for k, r in a.items()} == {k: (r.steps, r.success) for k, r in b.items()}
    for k in a:
        assert a[k].total_reward == pytest.approx(b[k].total_reward, abs=1e-5)


def test_a_feature_mismatch_is_an_error_naming_both_sides(project):
    project.makepyfile(test_other=f'''
import pytest

@pytest.mark.hud(sim="sims_other:other", policy={str(FINAL)!r})
def test_other(shared_sim, robot_agent):
    robot_agent.run(shared_sim.episode(seed=0))
''')
    result = project.runpytest_subprocess("test_other.py", "-p", "no:xdist", timeout=240)
    result.assert_outcomes(errors=1)
    text = result.stdout.str()
    assert "observation.state" in text and "joints" in text


SERVERS = '''
import json

import psutil


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller: note, in order, when it starts a server
        from pytest_hud.controller.hooks import HudController

        start = HudController.prestart_policy_servers

        def noted(self, specs, *args, **kwargs):
            specs = list(specs)
            if specs and self.settings.policy_server:
                with open("events.txt", "a") as out:
                    out.write("server started\\n")
            return start(self, specs, *args, **kwargs)

        HudController.prestart_policy_servers = noted


def pytest_sessionfinish(session):
    if not hasattr(session.config, "workerinput"):  # the controller: which policy servers it started
        servers = [p for p in psutil.Process().children(recursive=True)
                   if "pytest_hud.serving" in " ".join(p.cmdline())]
        with open("servers.json", "w") as out:
            json.dump([p.pid for p in servers], out)
'''

# Collecting this module takes 6 s; its import ends before this worker can declare its tests.
SLOW_TO_COLLECT = '''
import time

time.sleep(6)
with open("events.txt", "a") as out:  # only now can this worker collect and declare its tests
    out.write("worker imported\\n")
''' + SUITE


def test_a_checkpoint_named_on_the_command_line_starts_its_server_before_the_workers_collect(project):
    # --hud-policy beats markers: the controller knows the policy at once and starts its server
    # while pytest starts, not once a worker has collected and declared (one server all the same).
    project.makeconftest(SERVERS)
    project.makepyfile(test_slow=SLOW_TO_COLLECT)
    args = ("test_slow.py", "-n", "2", "--hud-policy-server", f"--hud-policy={FINAL}")
    listed = project.runpytest_subprocess(*args, "--collect-only", timeout=240)
    assert listed.ret == 0 and json.loads((project.path / "servers.json").read_text()) == []
    (project.path / "events.txt").unlink(missing_ok=True)
    result = project.runpytest_subprocess(*args, timeout=240)
    result.assert_outcomes(passed=6)
    assert len(json.loads((project.path / "servers.json").read_text())) == 1
    events = (project.path / "events.txt").read_text().splitlines()
    # The order, not a clock: the server was started before either worker's import ended, so before
    # any worker could declare its tests (a server started on the declarations comes after that).
    assert events.count("worker imported") == 2 and events.index("server started") == 0, events
