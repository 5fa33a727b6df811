"""Meta-World from state with a LeRobot ACT trained on recorded expert rollouts (record -> train -> gate).

``scripts/make_metaworld_checkpoints.py`` records Meta-World's scripted experts on the tasks below
with ``--hud-record`` (this file, run with ``--hud-policy`` naming the expert and demonstration
seeds from 1000 on), trains one small state-only ACT on all of them with LeRobot's training code,
and writes ``evals/checkpoints/metaworld_act/final`` (the trained policy, the default here) and
``.../early`` (an earlier snapshot of the same run: pass it with ``--hud-policy`` to see the gate
flag it against ``evals/baselines/metaworld_act.jsonl``, the final checkpoint's run).

Episode ``seed`` s of a task is always the same Meta-World task variation (see
``evals/sims/meta_world.py``); evaluation uses seeds 0..N-1, which the demonstrations never saw.
``METAWORLD_ACT_FIRST_SEED`` and ``METAWORLD_ACT_EPISODES`` (default 0 and 20) change the seeds.

Needs LeRobot and Meta-World (``pip install -e ".[lerobot,metaworld]" -c constraints/lerobot-metaworld.txt``);
skipped with the reason otherwise.
"""

import importlib.util
import os
from pathlib import Path

import pytest

# find_spec, not an import: with --hud-policy-server the workers must not load torch at all
if importlib.util.find_spec("metaworld") is None:
    pytest.skip("Meta-World is not installed: pip install 'pytest-hud[metaworld]'", allow_module_level=True)
if importlib.util.find_spec("lerobot") is None:
    pytest.skip("LeRobot is not installed: pip install 'pytest-hud[lerobot]'", allow_module_level=True)

HERE = Path(__file__).parent
#: The tasks the checkpoints are trained and evaluated on (one policy for all three).
TASKS = ("reach-v3", "button-press-topdown-v3", "drawer-close-v3")
FIRST_SEED = int(os.environ.get("METAWORLD_ACT_FIRST_SEED", "0"))
EPISODES = int(os.environ.get("METAWORLD_ACT_EPISODES", "20"))
MAX_STEPS = 200  # the experts finish these tasks in 35-80 steps; Meta-World's own cap is 500

# one multi-task bridge serves the three tasks in its slots; each claim names its task, which the
# bridge also makes the episode's prompt (the recording's ``task`` column)
pytestmark = pytest.mark.hud(
    sim=f"{HERE / 'sims' / 'meta_world.py'}:meta_world",
    policy=str(HERE / "checkpoints" / "metaworld_act" / "final"),
    max_steps=MAX_STEPS,
    min_success=0.8,  # the gate's floor per task (20 of 20)
)


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("seed", range(FIRST_SEED, FIRST_SEED + EPISODES))
def test_metaworld_with_act(shared_sim, robot_agent, task, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed, task=task))
    assert result.success, f"{task} not solved in {result.steps} steps"
