"""A LeRobot policy pipeline told its task by the sim's instruction: in the worker, behind the policy
server, and behind an attached server.

The checkpoint (:func:`evals.policies.instructed.instructed_act_checkpoint`) is the shipped PointReach
ACT policy with one more preprocessor step, which reads LeRobot's ``task`` (complementary data, as
``lerobot-eval`` passes it) and writes the goal it names into the state. InstructedReach shows the
policy no goal, so an episode succeeds only when its instruction arrived as ``task``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest.importorskip("lerobot.policies")  # not "lerobot": tests/e2e/lerobot itself would satisfy that

from conftest import stop  # noqa: E402
from policykit import start_server  # noqa: E402
from pytest_hud.core.results import load_results  # noqa: E402

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[3]
SIM = REPO / "evals" / "sims" / "instructed_reach.py"

SUITE = f'''
import pytest

SIM = {str(SIM)!r}

@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("goal", ["left", "right"])
@pytest.mark.hud(sim=SIM + ":instructed_reach")
def test_task(shared_sim, robot_agent, goal, seed):
    assert robot_agent.run(shared_sim.episode(seed=seed, task=goal)).success

@pytest.mark.hud(sim=SIM + ":make_instructed_reach", build={{"goal": "right"}})
def test_env_right(shared_sim, robot_agent):
    assert robot_agent.run(shared_sim.episode(seed=0)).success
'''


@pytest.fixture
def checkpoint(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    # LeRobot imports the checkpoint's processor step by its path in this repository
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    monkeypatch.syspath_prepend(str(REPO))
    from evals.policies.instructed import instructed_act_checkpoint

    return instructed_act_checkpoint(tmp_path_factory.mktemp("ckpt") / "instructed_act")


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_instructed=SUITE)
    return pytester


def _check(project: pytest.Pytester, *args: str) -> None:
    result = project.runpytest_subprocess("-n", "2", "--hud-results=r.jsonl", *args, timeout=240)
    result.assert_outcomes(passed=5)
    prompts = {r.nodeid.split("::")[-1]: r.claim.get("prompt") for r in load_results(project.path / "r.jsonl").episodes}
    assert prompts["test_task[left-0]"] == "reach the left goal"
    assert prompts["test_env_right"] == "reach the right goal"


def test_a_lerobot_pipeline_in_the_worker_gets_the_instruction_as_its_task(project, checkpoint):
    _check(project, f"--hud-policy={checkpoint}")


def test_the_policy_server_gives_the_lerobot_pipeline_each_requests_task(project, checkpoint):
    _check(project, f"--hud-policy={checkpoint}", "--hud-policy-server")


def test_an_attached_server_running_the_lerobot_pipeline_gets_the_prompt(project, checkpoint, tmp_path):
    proc, announce = start_server(tmp_path, str(checkpoint), timeout=180)
    try:
        _check(project, f"--hud-policy={announce['url']}")
    finally:
        stop(proc)


def test_without_its_task_the_pipeline_refuses_to_guess(checkpoint):
    from evals.sims.instructed_reach import make_instructed_reach
    from pytest_hud.agent.lerobot import LeRobotPolicy

    policy = LeRobotPolicy.from_checkpoint(checkpoint, {"state": ((4,), "state")})
    obs, _ = make_instructed_reach("left").reset(seed=0)
    left, right = policy.predict(obs, "reach the left goal"), policy.predict(obs, "reach the right goal")
    assert left[0][0] < 0 < right[0][0]  # the first action heads for the named goal
    with pytest.raises(ValueError, match="names neither the left nor the right goal"):
        policy.predict(obs, None)  # LeRobot's task "" (what lerobot-eval sends without one)
