"""Record LIBERO episodes in a fresh process, for the tests beside it: ``python episodes.py SPEC OUT``.

SPEC (JSON) is ``{"mode": "sim" | "libero", "episodes": [[suite, task, seed], ...], "steps": n,
"own_context": true}``. Every episode steps the same ``steps`` seeded random actions.

- ``sim``: the episodes' :class:`LiberoTask` envs are all built, then all reset, then stepped in turn
  (one step of each, round robin): several envs rendering in one process, as in a bridge.
- ``libero``: one episode with LIBERO alone, as openpi's LIBERO example runs it (the recipe of the
  sim's docstring), frames rotated by 180 degrees.

OUT (npz) holds ``{episode}/{step}/{feature}`` for every observation (step 0 is the reset's).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")
SIM = Path(__file__).resolve().parents[3] / "evals" / "sims" / "libero.py"


def load_sim():
    spec = importlib.util.spec_from_file_location("hud_libero_sim", SIM)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def actions(steps: int) -> np.ndarray:
    return np.random.default_rng(0).uniform(-1, 1, (steps, 7)).astype(np.float32)


def record_sim(spec: dict, out: dict) -> None:
    lib = load_sim()
    envs = [lib.LiberoTask(suite, task, own_context=spec.get("own_context", True))
            for suite, task, _ in spec["episodes"]]
    for k, (env, (_, _, seed)) in enumerate(zip(envs, spec["episodes"])):
        obs, _ = env.reset(seed=seed)
        out.update({f"{k}/0/{name}": v for name, v in obs.items()})
    for t, action in enumerate(actions(spec["steps"]), start=1):
        for k, env in enumerate(envs):
            obs = env.step(action)[0]
            out.update({f"{k}/{t}/{name}": v for name, v in obs.items()})
    for env in envs:
        env.close()


def record_libero(spec: dict, out: dict) -> None:
    """openpi's protocol with LIBERO's own classes only (no code of the sim's but its task lookup)."""
    from libero.libero import benchmark, get_libero_path
    from libero.libero.envs import OffScreenRenderEnv
    from robosuite.utils.transform_utils import quat2axisangle

    (suite_name, task_name, seed), = spec["episodes"]
    suite = benchmark.get_benchmark_dict()[suite_name]()
    i = int(task_name.split("_")[1])
    task = suite.get_task(i)
    bddl = os.path.join(get_libero_path("bddl_files"), task.problem_folder, task.bddl_file)
    env = OffScreenRenderEnv(bddl_file_name=bddl, camera_heights=256, camera_widths=256)
    env.seed(7)
    env.reset()
    obs = env.set_init_state(suite.get_task_init_states(i)[seed])
    for _ in range(10):
        obs, _, _, _ = env.step([0.0] * 6 + [-1.0])

    def keep(t: int, obs: dict) -> None:
        for name in ("agentview_image", "robot0_eye_in_hand_image"):
            out[f"0/{t}/{name}"] = np.ascontiguousarray(obs[name][::-1, ::-1])
        axis_angle = quat2axisangle(obs["robot0_eef_quat"].copy())
        out[f"0/{t}/state"] = np.concatenate([obs["robot0_eef_pos"], axis_angle,
                                              obs["robot0_gripper_qpos"]]).astype(np.float32)

    keep(0, obs)
    for t, action in enumerate(actions(spec["steps"]), start=1):
        obs, _, _, _ = env.step(action.astype(np.float64).tolist())
        keep(t, obs)
    env.close()


if __name__ == "__main__":
    spec = json.loads(Path(sys.argv[1]).read_text())
    out: dict = {}
    (record_sim if spec["mode"] == "sim" else record_libero)(spec, out)
    np.savez(sys.argv[2], **out)
