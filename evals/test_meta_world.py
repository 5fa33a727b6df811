"""Meta-World MT10 from state: the ten tasks as one parametrized test (task x episode seed).

One multi-task bridge serves all ten tasks in its ``--hud-width`` slots (each claim names its task;
the bridge hands the task name to the policy as the episode's prompt). The policy is Meta-World's
scripted expert for each task. An episode ends at its first success (or Meta-World's 500-step cap).
Seed ``s`` is variation ``s % 50`` of ``metaworld.MT1(task, seed=s // 50)``: see
``evals/sims/meta_world.py``. Needs ``pip install "pytest-hud[metaworld]"``; skipped without it.
"""

from pathlib import Path

import pytest

pytest.importorskip("metaworld", reason='Meta-World is not installed: pip install "pytest-hud[metaworld]"')

HERE = Path(__file__).parent
MT10 = ("reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3", "drawer-close-v3",
        "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3")

pytestmark = pytest.mark.hud(
    sim=f"{HERE / 'sims' / 'meta_world.py'}:meta_world",
    policy=f"{HERE / 'policies' / 'meta_world_experts.py'}:expert",
    min_success=0.8,  # the gate's floor per task (the experts: 9 or 10 of 10)
)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("task", MT10)
def test_mt10(shared_sim, robot_agent, task, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed, task=task))
    assert result.success, f"{task} not solved in {result.steps} steps"
