"""Privileged state for LIBERO pick-and-place tasks: the goal's object and target, and where they are.

A LIBERO task's BDDL goal names the object to move and its destination, e.g. ``(On akita_black_bowl_1
plate_1)``; the environment parses it into ``parsed_problem["goal_state"]`` (``[['on', obj, target]]``).
:func:`goal_pair` reads that pair; :func:`environment_state` reads live positions from the MuJoCo state
as one float32[9] vector (world metres):

====  ==================================================================================
0:3   the goal's object (its body origin: the bottom centre of a bowl)
3:6   the goal's target (a body, or a region's site)
6:9   the nearest other movable object to the goal's object in the table plane (the
      target excluded; the object's own position when there is none): what a grasp must
      keep clear of
====  ==================================================================================

The LIBERO sim built with ``privileged=True`` adds it to each observation as ``environment_state``
(recorded as LeRobot's ``observation.environment_state``); the scripted expert
(``evals/policies/libero_expert.py``) acts on it, and a state-only policy trained on the expert's
episodes sees the same vector. Works on robosuite's inner LIBERO environment (``ControlEnv(...).env``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["ENVIRONMENT_STATE_NAMES", "ENVIRONMENT_STATE_SIZE", "environment_state", "goal_pair"]

ENVIRONMENT_STATE_NAMES = tuple(f"{part}_{axis}" for part in ("object", "target", "obstacle")
                                for axis in "xyz")
ENVIRONMENT_STATE_SIZE = len(ENVIRONMENT_STATE_NAMES)

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
    best, best_distance = obj_pos, np.inf
    for name in getattr(env, "objects_dict", {}):
        if name in pair:
            continue
        pos = _position(env, name)
        distance = float(np.linalg.norm((pos - obj_pos)[:2]))
        if distance < best_distance:
            best, best_distance = pos, distance
    return best


def environment_state(env, pair: tuple[str, str]) -> np.ndarray:
    """The float32[9] privileged vector (object, target, nearest other object) of the table above."""
    obj_pos = _position(env, pair[0])
    parts = [obj_pos, _position(env, pair[1]), _nearest_other(env, pair, obj_pos)]
    return np.concatenate(parts).astype(np.float32)
