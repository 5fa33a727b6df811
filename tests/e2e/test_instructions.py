"""A sim's instruction reaches the policy as the episode's prompt, by every way a policy runs.

InstructedReach (``evals/sims/instructed_reach.py``) has two goals and says which one counts only
in its instruction; ``follow_instruction`` heads for the goal its prompt names and raises when the
prompt names none. So each run below passes only if the instruction arrived, and the run with a
contradicting explicit prompt fails: the outcome depends on the instruction.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import stop
from policykit import openpi_style_server, start_server
from pytest_hud.agent.model import load_policy
from pytest_hud.core.results import load_results

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[2]
SIM = REPO / "evals" / "sims" / "instructed_reach.py"
POLICY = f"{REPO / 'evals' / 'policies' / 'instructed.py'}:follow_instruction"

def _suite() -> str:
    return f'''
import pytest

SIM = {str(SIM)!r}

@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("goal", ["left", "right"])
@pytest.mark.hud(sim=SIM + ":instructed_reach")
def test_task(shared_sim, robot_agent, goal, seed):
    assert robot_agent.run(shared_sim.episode(seed=seed, task=goal)).success

@pytest.mark.parametrize("seed", range(2))
@pytest.mark.hud(sim=SIM + ":make_instructed_reach", build={{"goal": "right"}})
def test_env_right(shared_sim, robot_agent, seed):
    assert robot_agent.run(shared_sim.episode(seed=seed)).success

@pytest.mark.hud(sim=SIM + ":instructed_reach")
def test_an_explicit_prompt_wins(shared_sim, robot_agent):
    # the task is "left", the prompt says right: the policy goes right and the left task fails
    assert not robot_agent.run(shared_sim.episode(seed=0, task="left", prompt="reach the right goal")).success
'''


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_instructed=_suite())
    return pytester


def _check(project: pytest.Pytester, *args: str) -> None:
    result = project.runpytest_subprocess("-n", "2", "--hud-results=r.jsonl", *args, timeout=150)
    result.assert_outcomes(passed=7)
    records = {r.nodeid.split("::")[-1]: r for r in load_results(project.path / "r.jsonl").episodes}
    prompts = {name: r.claim.get("prompt") for name, r in records.items()}
    # each episode's record names the instruction it ran with
    assert prompts["test_task[left-0]"] == "reach the left goal"
    assert prompts["test_task[right-1]"] == "reach the right goal"
    assert prompts["test_env_right[0]"] == "reach the right goal"  # the env's task_description
    assert prompts["test_an_explicit_prompt_wins"] == "reach the right goal"
    # the env's own verdict: the explicit prompt led the policy to the wrong goal for task "left"
    assert records["test_an_explicit_prompt_wins"].extra["env_success"] is False


def test_a_numpy_policy_in_the_worker_is_prompted_with_each_tasks_instruction(project):
    # envs in processes: the instructions cross from the sim's processes to the bridge
    _check(project, f"--hud-policy={POLICY}", "--hud-vectorization=processes")


def test_the_policy_server_passes_the_instruction_to_the_policy(project):
    _check(project, f"--hud-policy={POLICY}", "--hud-policy-server")


def test_an_attached_openpi_style_server_receives_the_instruction_as_its_prompt(project, tmp_path):
    proc, announce = start_server(tmp_path, POLICY)
    try:
        _check(project, f"--hud-policy={announce['url']}")
    finally:
        stop(proc)


def test_an_openpi_server_of_its_own_reads_the_instruction_from_the_prompt_key(project):
    # not our server: one that answers as openpi's WebsocketPolicyServer does, with a policy whose
    # only source of the goal is the observation map's "prompt" entry, as openpi's policies read it
    policy = load_policy(POLICY, None)
    prompts: list[str] = []

    def infer(obs: dict) -> dict:
        prompts.append(obs["prompt"])
        state = {key: value for key, value in obs.items() if key != "prompt"}
        return {"actions": policy.predict(state, obs["prompt"])}

    url, stop_server = openpi_style_server(infer, {})
    try:
        _check(project, f"--hud-policy={url}")
    finally:
        stop_server()
    assert {"reach the left goal", "reach the right goal"} == set(prompts)


def test_without_the_instruction_the_policy_cannot_act(pytester: pytest.Pytester):
    # a sim that declares no instruction: the policy gets no prompt and its error errs the episode
    pytester.makepyfile(test_bare=f'''
import gymnasium as gym
import pytest
import sys
sys.path.insert(0, {str(SIM.parent)!r})
from instructed_reach import make_instructed_reach

class Silent(gym.Wrapper):
    task_description = ""  # a LeRobot env before its first reset: no instruction

def bare():
    return Silent(make_instructed_reach("left"))

@pytest.mark.hud(sim=__file__ + ":bare")
def test_bare(shared_sim, robot_agent):
    robot_agent.run(shared_sim.episode(seed=0))
''')
    result = pytester.runpytest_subprocess("-p", "no:xdist", f"--hud-policy={POLICY}", timeout=120)
    result.assert_outcomes(errors=1)  # the policy raised: the episode errs
    result.stdout.fnmatch_lines(["*names neither the left nor the right goal*"])
