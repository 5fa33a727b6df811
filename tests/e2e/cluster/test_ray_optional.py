"""Ray stays out of every run that does not pass --hud-ray, even where it is installed."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("ray", reason="Ray is not installed: pip install 'pytest-hud[ray]' (tox -e ray)")

from conftest import SIMKIT  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

CONFTEST = '''
import json, os, sys

def pytest_sessionfinish(session):
    config = session.config
    name = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    with open(config.rootpath / f"modules-{name}.json", "w") as fh:
        json.dump(sorted(m for m in sys.modules if m == "ray" or m.startswith("ray.")), fh)
'''

SUITE = f'''
import numpy as np
import pytest

pytestmark = pytest.mark.hud(sim="{SIMKIT}:counter", policy="test_suite:one")

def one():
    return lambda obs: np.ones(1, np.float32)

@pytest.mark.parametrize("seed", range(4))
def test_counter(shared_sim, robot_agent, seed):
    assert robot_agent.run(shared_sim.episode(seed=seed)).steps == 3
'''


def test_a_run_without_hud_ray_never_imports_ray(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess("-n", "2", "--hud-width", "2", "--hud-policy-server")
    result.assert_outcomes(passed=4)
    files = sorted(pytester.path.glob("modules-*.json"))
    assert [f.name for f in files] == ["modules-controller.json", "modules-gw0.json", "modules-gw1.json"]
    for path in files:
        assert json.loads(path.read_text()) == [], path.name
