"""--hud-record through the plugin: one LeRobot dataset from every worker's part."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("lerobot.policies")

from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: E402

from pytest_hud.core.results import load_results  # noqa: E402

pytestmark = pytest.mark.timeout(300)

REACH = Path(__file__).resolve().parents[3] / "evals" / "sims" / "reach.py"

SUITE = f'''
import numpy as np
import pytest

def expert():
    import sys
    sys.path.insert(0, {str(REACH.parent)!r})
    from reach import expert_action
    return lambda obs: expert_action(obs["state"])

pytestmark = pytest.mark.hud(sim={str(REACH) + ":make_reach"!r}, policy="test_rec:expert")

@pytest.mark.parametrize("seed", range(3))
def test_rec(shared_sim, robot_agent, seed):
    assert robot_agent.run(shared_sim.episode(seed=seed, prompt="reach the green goal")).success
'''


def test_recording_three_episodes_under_xdist_yields_one_dataset(pytester: pytest.Pytester):
    pytester.makepyfile(test_rec=SUITE)
    rollouts = pytester.path / "rollouts"
    result = pytester.runpytest_subprocess("-n", "2", "--hud-width=2", f"--hud-record={rollouts}",
                                           "--hud-results=r.jsonl", "-p", "no:cacheprovider", timeout=240)
    result.assert_outcomes(passed=3)
    steps = sum(r.steps for r in load_results(pytester.path / "r.jsonl").episodes)
    result.stdout.fnmatch_lines([f"recorded: 3 episodes, {steps} frames -> {rollouts}*"])
    ds = LeRobotDataset("pytest-hud/rollouts", root=rollouts)
    assert ds.num_episodes == 3 and ds.num_frames == steps
    assert not (rollouts / "parts").exists()
    lines = (rollouts / "meta" / "pytest_hud_episodes.jsonl").read_text().splitlines()
    assert {json.loads(line)["seed"] for line in lines} == {0, 1, 2}
    frame = ds[0]
    assert tuple(frame["observation.state"].shape) == (4,) and tuple(frame["action"].shape) == (2,)
    assert frame["task"] == "reach the green goal"


def test_recording_into_an_existing_dataset_is_refused(pytester: pytest.Pytester):
    pytester.makepyfile(test_rec=SUITE)
    rollouts = pytester.path / "rollouts"
    first = pytester.runpytest_subprocess("-p", "no:xdist", f"--hud-record={rollouts}", timeout=240)
    first.assert_outcomes(passed=3)
    again = pytester.runpytest_subprocess("-p", "no:xdist", f"--hud-record={rollouts}", timeout=240)
    assert again.ret == pytest.ExitCode.USAGE_ERROR
    again.stderr.fnmatch_lines(["*--hud-record*"])
