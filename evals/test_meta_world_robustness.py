"""Meta-World robustness: the scripted expert under perturbations, one sensitivity table per run.

The ``perturbation`` parameter is a robustness axis (``hud_axis``): each level is a build of the
Meta-World sim (``evals/sims/meta_world.py``: ``obs_noise``, ``action_noise``, ``action_delay``),
so each level runs on a bridge of its own, and the summary tests every level against ``none`` (the
unperturbed sim) with an exact test, Holm-adjusted over the levels. A seed means the same task
variation at every level, and its noise is drawn from the seed, so the levels' episodes pair up
seed by seed (exact McNemar).

    pytest evals/test_meta_world_robustness.py -n 2 --hud-width=2 --hud-results=robustness.jsonl

Two MT10 tasks (one that needs precise positions, one that does not), 8 seeds, 7 levels: 112
episodes, about a minute on 2 cores. Every episode is a test, so perturbed levels fail tests by
design; the sensitivity table, not the exit status, is the result (gate it with ``--hud-baseline``).
Needs ``pip install "pytest-hud[metaworld]"``; skipped without it.
"""

from pathlib import Path

import pytest

pytest.importorskip("metaworld", reason='Meta-World is not installed: pip install "pytest-hud[metaworld]"')

HERE = Path(__file__).parent
TASKS = ("pick-place-v3", "door-open-v3")

#: level -> the sim's build arguments for it (the reference level first)
PERTURBATIONS = {
    "none": {},
    "obs_noise_0.005": {"obs_noise": 0.005},
    "obs_noise_0.03": {"obs_noise": 0.03},
    "action_noise_0.3": {"action_noise": 0.3},
    "action_noise_1.0": {"action_noise": 1.0},
    "action_delay_5": {"action_delay": 5},
    "action_delay_15": {"action_delay": 15},
}

pytestmark = [
    pytest.mark.hud(sim=f"{HERE / 'sims' / 'meta_world.py'}:meta_world",
                    policy=f"{HERE / 'policies' / 'meta_world_experts.py'}:expert"),
    pytest.mark.hud_axis("perturbation", reference="none"),
]


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("perturbation", [
    pytest.param(level, marks=pytest.mark.hud(build={"tasks": list(TASKS), **build}))
    for level, build in PERTURBATIONS.items()
])
def test_mt10_perturbed(shared_sim, robot_agent, perturbation, task, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed, task=task))
    assert result.success, f"{task} under {perturbation} not solved in {result.steps} steps"
