"""A test's hud markers as pytest-hud reads them per episode: merged once per test, read again when
the test got a marker since (a fixture calling ``request.node.add_marker``)."""

from __future__ import annotations

import pytest

from pluginkit import project, run  # noqa: F401 - project is a fixture
from pytest_hud.core.results import load_results

pytestmark = pytest.mark.timeout(240)

MARKED_LATE = '''
import pytest

@pytest.fixture(autouse=True)
def shorter(request):
    if request.node.callspec.params["seed"] % 2:
        # after collection, and first (append=False: the closest marker wins): odd seeds stop early
        request.node.add_marker(pytest.mark.hud(max_steps=7), append=False)

@pytest.mark.hud(max_steps=20)
@pytest.mark.parametrize("seed", range(4))
def test_balance(shared_sim, robot_agent, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed))
    assert result.steps == (7 if seed % 2 else 20)
'''


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["one-process", "xdist"])
def test_a_marker_a_fixture_adds_applies_to_the_episode_and_its_record(project, workers):
    project.makepyfile(test_marked=MARKED_LATE)
    result = run(project, *workers, "--hud-width=2", "--hud-results=r.jsonl")
    result.assert_outcomes(passed=4)
    steps = {r.seed: (r.steps, r.identity["max_steps"]) for r in load_results(project.path / "r.jsonl").episodes}
    assert steps == {0: (20, 20), 1: (7, 7), 2: (20, 20), 3: (7, 7)}
