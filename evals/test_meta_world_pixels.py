"""Meta-World MT10 with a 128-px camera in every observation: the rendering path end to end.

The same ten tasks and scripted experts as ``test_meta_world.py`` (the experts act on the state),
with ``pixels=True``: every step of every slot renders its own env's camera (multisampling, shadows
and reflections off; the env's GL context made current before each render). Fewer episodes than the
state suite: rendering costs 8-13 ms per frame on a CPU. Skipped without Meta-World.
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
    build={"pixels": True},
    min_success=0.5,  # the gate's floor per task (2 of 2)
)


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("task", MT10)
def test_mt10_pixels(shared_sim, robot_agent, task, seed):
    assert shared_sim.contract.cameras == ["pixels"]
    result = robot_agent.run(shared_sim.episode(seed=seed, task=task))
    assert result.success, f"{task} not solved in {result.steps} steps"
