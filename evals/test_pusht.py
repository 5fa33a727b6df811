"""LeRobot's own PushT (gym-pusht) from pixels, driven by a LeRobot ACT checkpoint.

Proves the image path with LeRobot's env: the bridge serves ``{"pixels": 96x96x3 uint8,
"agent_pos": [2]}``; the LeRobot seam feeds ``pixels`` to ``observation.image`` [3, 96, 96] and
``agent_pos`` to ``observation.state`` [2] of an ACT (ResNet-18 backbone) loaded by LeRobot's own
factory with its saved processors. The checkpoint is a briefly trained imitation of a crude
scripted pusher, so its success rate is low (usually 0 %) and most of these tests fail: a test
passes exactly when PushT reports ``is_success`` (95 % goal coverage), the metric ``lerobot-eval``
reports, so the summary's success rate is PushT's. The score column is the best coverage reward
of the episode (``max_reward`` in ``lerobot-eval``).

The checkpoint (~46 MB: ACT's ResNet-18 is the smallest vision encoder the seam can run) is not in
the repository: ``scripts/make_pusht_checkpoint.py`` builds it on first use into
``~/.cache/pytest-hud/pusht_act-<script hash>-lerobot<X.Y>`` (~1-2 min on 2 cores, once per LeRobot
line: a 0.6 checkpoint does not load in 0.4), or into ``$PUSHT_CHECKPOINT``, when this module is
collected (also under ``--collect-only`` or ``--hud-policy``: once). Seeds are ``PUSHT_FIRST_SEED``
(default 1000, ``lerobot-eval``'s first seed) onwards, ``PUSHT_EPISODES`` of them (default 8).

Needs LeRobot and gym-pusht (``pip install --no-deps gym-pusht==0.1.8`` then ``pip install
"pymunk>=6.6,<7" "shapely>=2.0.3,<3"``, versions in ``constraints/lerobot-metaworld.txt``; pygame
comes with LeRobot 0.6 (pygame-ce) or ``gymnasium[classic-control]``); skipped with the reason
otherwise.
"""

import importlib.util
import os
from pathlib import Path

import pytest

# find_spec, not importorskip: the workers never build a PushT env (the bridge does), and importing
# gym_pusht (pygame, pymunk, shapely) in each of -n 8 workers costs ~2 CPU-seconds of start-up.
_MISSING = [m for m in ("gym_pusht", "pymunk", "pygame", "shapely") if importlib.util.find_spec(m) is None]
if _MISSING:
    pytest.skip(
        f"gym-pusht is not installed (missing: {', '.join(_MISSING)}): pip install --no-deps "
        "gym-pusht==0.1.8 && pip install 'pymunk>=6.6,<7' 'shapely>=2.0.3,<3'"
        + (" pygame-ce" if "pygame" in _MISSING else ""),
        allow_module_level=True,
    )
# find_spec, not importorskip: importing lerobot.policies costs ~8 s and loads torch, and with
# --hud-policy-server the workers must not load torch at all.
if importlib.util.find_spec("lerobot") is None or importlib.util.find_spec("lerobot.policies") is None:
    pytest.skip("LeRobot is not installed: pip install 'pytest-hud[lerobot]'", allow_module_level=True)

HERE = Path(__file__).parent
MAKER = HERE.parent / "scripts" / "make_pusht_checkpoint.py"
MAX_STEPS = 300  # LeRobot's PushtEnv episode_length
FIRST_SEED = int(os.environ.get("PUSHT_FIRST_SEED", "1000"))
EPISODES = int(os.environ.get("PUSHT_EPISODES", "8"))


def _maker():
    spec = importlib.util.spec_from_file_location("make_pusht_checkpoint", MAKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Built here, when the module is collected, not in a fixture: the run declares its episodes at the
# end of collection and checks then that the marker's checkpoint exists. A file lock makes one xdist
# worker build it while the others wait; once built, this only looks at the folder. A failed build
# is this module's collection error.
CHECKPOINT = _maker().ensure_checkpoint()

pytestmark = pytest.mark.hud(
    sim=f"{HERE / 'sims' / 'pusht.py'}:make_pusht",
    policy=str(CHECKPOINT),
    max_steps=MAX_STEPS,
)


@pytest.mark.parametrize("seed", range(FIRST_SEED, FIRST_SEED + EPISODES))
def test_push_t_from_pixels(shared_sim, robot_agent, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed))
    assert result.success, (
        f"T not pushed onto the goal in {result.steps} steps (best coverage reward {result.score:.2f})"
    )
