"""PointReach with a LeRobot Diffusion Policy: the checkpoint `scripts/make_diffusion_checkpoints.py` trains.

A small state-only `DiffusionPolicy` (1-D U-Net, DDIM, 10 denoising steps per chunk of 4 actions)
loaded by LeRobot's factory with its saved processors; each chunk is LeRobot's own denoising loop,
started from a fixed noise, so episodes are deterministic (see `pytest_hud.agent.lerobot_diffusion`).
In the workers by default; with `--hud-policy-server` one server batches every worker's chunks
(the denoising loop then runs once for the whole batch). `evals/baselines/reach_diffusion.jsonl` is
the final checkpoint's run of this file: gate a change against it with
`--hud-baseline=evals/baselines/reach_diffusion.jsonl`.

Seeds 0..N-1 (the demonstrations used 10000+), `REACH_DIFFUSION_EPISODES` of them (default 24).
Runs when LeRobot (with `diffusers`: LeRobot 0.6's `diffusion` extra) is installed; skipped with
the reason otherwise.
"""

import importlib.util
import os
from pathlib import Path

import pytest

HERE = Path(__file__).parent
EPISODES = int(os.environ.get("REACH_DIFFUSION_EPISODES", "24"))

# find_spec, not an import: with --hud-policy-server the workers must not load torch at all
if importlib.util.find_spec("lerobot") is None:
    pytest.skip("LeRobot is not installed: pip install 'pytest-hud[lerobot]'", allow_module_level=True)
if importlib.util.find_spec("diffusers") is None:
    pytest.skip("diffusers is not installed (LeRobot's Diffusion Policy needs it): "
                "pip install 'lerobot[diffusion]'", allow_module_level=True)

pytestmark = pytest.mark.hud(
    sim=f"{HERE / 'sims' / 'reach.py'}:make_reach",
    policy=str(HERE / "checkpoints" / "reach_diffusion" / "final"),
    min_success=0.8,  # the gate's floor (23 of 24)
)


@pytest.mark.parametrize("seed", range(EPISODES))
def test_reach_with_diffusion(shared_sim, robot_agent, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed, prompt="reach the green goal"))
    assert result.success, f"goal not reached in {result.steps} steps"
