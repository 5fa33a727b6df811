"""Privileged state for LIBERO tasks: which object the goal moves, where to, and where both are now.

A LIBERO task's BDDL goal names the object to move and its destination, e.g. ``(On akita_black_bowl_1
plate_1)``; the environment parses it into ``parsed_problem["goal_state"]`` (``[['on', obj, target]]``).
:func:`goal_pair` reads that pair, :func:`privileged_observation` reads the live positions from the
MuJoCo state: the scripted expert (``evals/policies/libero_expert.py``) acts on them, and a state-only
policy trained on the expert's episodes sees the same keys.

Works on robosuite's inner LIBERO environment (``ControlEnv(...).env``); imports nothing from LIBERO.
"""

from __future__ import annotations

import numpy as np

__all__ = ["PRIVILEGED_KEYS", "PRIVILEGED_STATE_SIZE", "goal_pair", "privileged_observation", "privileged_state"]

# order of the flat privileged state vector; sizes in PRIVILEGED_SIZES
PRIVILEGED_KEYS = ("object_pos", "target_pos", "obstacle_pos", "eef_pos", "eef_quat", "gripper_qpos")
PRIVILEGED_SIZES = {"object_pos": 3, "target_pos": 3, "obstacle_pos": 3, "eef_pos": 3, "eef_quat": 4, "gripper_qpos": 2}
PRIVILEGED_STATE_SIZE = sum(PRIVILEGED_SIZES.values())

# goal predicates that mean "move OBJECT onto/into TARGET"
_PLACEMENT_PREDICATES = ("on", "in")


def goal_pair(parsed_problem: dict) -> tuple[str, str]:
    """The (object, target) names of the goal's first placement predicate (``On``/``In``).

    Raises ValueError naming the goal when it has none (e.g. ``(Open drawer)``: no object to place).
    """
    goal = parsed_problem.get("goal_state")
    if not goal:
        raise ValueError(f"the task's BDDL problem has no goal_state (keys: {sorted(parsed_problem)})")
    for predicate in goal:
        if len(predicate) == 3 and str(predicate[0]).lower() in _PLACEMENT_PREDICATES:
            return str(predicate[1]), str(predicate[2])
    raise ValueError(
        f"the task's goal {goal!r} has no On/In predicate: the privileged state names an object to move "
        "and its target, so it serves pick-and-place goals only (e.g. libero_spatial)")


def _position(env, name: str) -> np.ndarray:
    """World position of an object or fixture body, or of a region site."""
    body_ids = getattr(env, "obj_body_id", {})
    if name in body_ids:
        return np.array(env.sim.data.body_xpos[body_ids[name]], dtype=np.float64)
    if name in getattr(env, "object_sites_dict", {}):
        return np.array(env.sim.data.get_site_xpos(name), dtype=np.float64)
    raise ValueError(f"no body or site named {name!r} in this LIBERO scene (objects: {sorted(body_ids)})")


def _nearest_other(env, pair: tuple[str, str], obj_pos: np.ndarray) -> np.ndarray:
    """Position of the movable object nearest (in the table plane) to the goal's object, target excluded."""
    best, best_distance = obj_pos, np.inf
    for name in getattr(env, "objects_dict", {}):
        if name in pair:
            continue
        pos = _position(env, name)
        distance = float(np.linalg.norm((pos - obj_pos)[:2]))
        if distance < best_distance:
            best, best_distance = pos, distance
    return best


def privileged_observation(env, pair: tuple[str, str]) -> dict[str, np.ndarray]:
    """Live ``object_pos``, ``target_pos``, ``obstacle_pos`` (the movable object nearest the object, the
    target excluded; the object's own position when there is none), all world metres, and the end
    effector's pose and gripper."""
    robot = env.robots[0]
    obj_pos = _position(env, pair[0])
    eef_site = robot.eef_site_id if not isinstance(robot.eef_site_id, dict) else robot.eef_site_id["right"]
    xmat = np.array(env.sim.data.site_xmat[eef_site], dtype=np.float64).reshape(3, 3)
    return {
        "object_pos": obj_pos.astype(np.float32),
        "target_pos": _position(env, pair[1]).astype(np.float32),
        "obstacle_pos": _nearest_other(env, pair, obj_pos).astype(np.float32),
        "eef_pos": np.array(env.sim.data.site_xpos[eef_site], dtype=np.float32),
        "eef_quat": _mat_to_quat_xyzw(xmat).astype(np.float32),
        "gripper_qpos": np.array(
            [env.sim.data.qpos[i] for i in robot._ref_gripper_joint_pos_indexes], dtype=np.float32),
    }


def privileged_state(observation: dict[str, np.ndarray]) -> np.ndarray:
    """The privileged keys of an observation as one flat float32 vector (order: PRIVILEGED_KEYS)."""
    missing = [key for key in PRIVILEGED_KEYS if key not in observation]
    if missing:
        raise ValueError(
            f"the observation lacks the privileged keys {missing}; build the LIBERO sim with privileged=True")
    return np.concatenate([np.asarray(observation[key], dtype=np.float32).reshape(-1) for key in PRIVILEGED_KEYS])


def _mat_to_quat_xyzw(m: np.ndarray) -> np.ndarray:
    """Rotation matrix to a unit quaternion (x, y, z, w), w >= 0."""
    trace = m[0, 0] + m[1, 1] + m[2, 2]
    if trace > 0:
        s = 2.0 * np.sqrt(trace + 1.0)
        q = np.array([(m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s, 0.25 * s])
    elif m[0, 0] > m[1, 1] and m[0, 0] > m[2, 2]:
        s = 2.0 * np.sqrt(1.0 + m[0, 0] - m[1, 1] - m[2, 2])
        q = np.array([0.25 * s, (m[0, 1] + m[1, 0]) / s, (m[0, 2] + m[2, 0]) / s, (m[2, 1] - m[1, 2]) / s])
    elif m[1, 1] > m[2, 2]:
        s = 2.0 * np.sqrt(1.0 + m[1, 1] - m[0, 0] - m[2, 2])
        q = np.array([(m[0, 1] + m[1, 0]) / s, 0.25 * s, (m[1, 2] + m[2, 1]) / s, (m[0, 2] - m[2, 0]) / s])
    else:
        s = 2.0 * np.sqrt(1.0 + m[2, 2] - m[0, 0] - m[1, 1])
        q = np.array([(m[0, 2] + m[2, 0]) / s, (m[1, 2] + m[2, 1]) / s, 0.25 * s, (m[1, 0] - m[0, 1]) / s])
    q = q / np.linalg.norm(q)
    return -q if q[3] < 0 else q
