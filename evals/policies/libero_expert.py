"""A scripted pick-and-place expert for LIBERO on privileged state, and a degraded variant.

It reads the observation of a LIBERO sim built with ``privileged=True`` (``evals/sims/libero.py``):
``state`` (end-effector position, its orientation as an axis-angle vector, the two finger positions)
and ``environment_state`` (``evals/sims/libero_goal.py``: live world positions of the goal's
``(On OBJECT TARGET)`` object and target, and of the nearest other object). It drives
LIBERO's OSC_POSE delta actions (7 floats in [-1, 1]: dx, dy, dz, drx, dry, drz, gripper; 1.0 moves
the position target 5 cm and the orientation target 0.5 rad; gripper -1 opens, +1 closes) through
waypoints: above the object's rim -> down -> close -> lift -> above the target -> down -> open -> up.
The gripper is held pointing down (a proportional correction of its tilt; its yaw stays free, since
holding a fixed yaw drives the wrist into its limit at the far side of the table).

The grasp pinches the bowl's wall: the grasp point is the object's centre shifted by the rim radius
along the axis the fingers close on (the hand's y axis, in the table plane). While carrying, the
placement target follows the live object position (target minus object), so a grasp that slipped
still lands centred.

The grasp side (either end of the finger axis) is the one away from the nearest other
movable object, whose wall would otherwise block the outer finger. An object beyond ``far_x``
(6 cm past the table's middle, away from the robot) is pinched on the wall nearest the robot
instead, the hand turned a quarter: pointing down, the arm cannot reach the far walls there (and a
drawer's sides leave the fingers no room).

- ``expert``: the scripted expert (its success rates on libero_spatial: docs/libero-policies.md).
- ``expert_late_release``: the expert that opens its gripper 8 cm above the target: the object lands
  off the plate or tips more often (a regression for gate demonstrations).

Factories take no arguments (``--hud-policy evals/policies/libero_expert.py:expert``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["PickPlaceExpert", "expert", "expert_late_release"]

_POS_SCALE = 0.05  # metres per unit action (robosuite OSC_POSE output_max)
_ROT_SCALE = 0.5  # radians per unit action



def _rotation(axis_angle: np.ndarray) -> np.ndarray:
    """Rotation matrix of an axis-angle vector (Rodrigues)."""
    angle = float(np.linalg.norm(axis_angle))
    if angle < 1e-9:
        return np.eye(3)
    x, y, z = axis_angle / angle
    k = np.array([[0.0, -z, y], [z, 0.0, -x], [-y, x, 0.0]])
    return np.eye(3) + np.sin(angle) * k + (1.0 - np.cos(angle)) * (k @ k)




class PickPlaceExpert:
    """Waypoint controller for ``(On OBJECT TARGET)`` goals on privileged state."""

    def __init__(self, *, rim_radius: float = 0.040, grasp_depth: float = 0.032, carry_height: float = 0.12,
                 release_height: float = 0.015, gain: float = 20.0, integral_gain: float = 3.0,
                 far_x: float = 0.06) -> None:
        self.far_x = float(far_x)
        self.integral_gain = float(integral_gain)
        self.rim_radius, self.grasp_depth = float(rim_radius), float(grasp_depth)
        self.carry_height, self.release_height = float(carry_height), float(release_height)
        self.gain = float(gain)
        self.reset()

    def reset(self) -> None:
        """Called at each episode start: back to the first waypoint."""
        self.phase = "approach"
        self._count = 0
        self._integral = np.zeros(3)
        self._rest_z: float | None = None  # object's resting height at the start
        self._side = 1.0
        self._axis: np.ndarray | None = None  # finger axis to turn to (None: keep the arm's yaw)

    def _move(self, eef: np.ndarray, target: np.ndarray, rotation: np.ndarray, gripper: float,
              limit: float = 1.0) -> np.ndarray:
        action = np.zeros(7, dtype=np.float64)
        error = target - eef
        # the OSC arm stops about 1 cm short of a small step: an integral term removes that offset
        if np.linalg.norm(error) < 0.03:
            self._integral = np.clip(self._integral + error, -0.05, 0.05)
        action[:3] = np.clip(error * self.gain + self._integral * self.integral_gain, -limit, limit)
        # tilt only: bring the gripper's axis to pointing down, leave the yaw where the arm has it
        axis = rotation[:, 2]
        tilt = np.cross(axis, np.array([0.0, 0.0, -1.0]))
        angle = np.arctan2(np.linalg.norm(tilt), float(np.dot(axis, [0.0, 0.0, -1.0])))
        if np.linalg.norm(tilt) > 1e-9:
            action[3:6] = np.clip(tilt / np.linalg.norm(tilt) * angle / _ROT_SCALE, -0.5, 0.5)
        if self._axis is not None:  # turn the finger axis onto the chosen one (either end: symmetric fingers)
            fingers, wanted = rotation[:2, 1], self._axis[:2]
            yaw = np.arctan2(fingers[0] * wanted[1] - fingers[1] * wanted[0], float(np.dot(fingers, wanted)))
            yaw = (yaw + np.pi / 2) % np.pi - np.pi / 2
            action[5] = np.clip(yaw / _ROT_SCALE, -0.5, 0.5)
        action[6] = gripper
        return action

    def _next(self, phase: str) -> None:
        self.phase, self._count = phase, 0
        self._integral = np.zeros(3)

    def predict(self, observation, prompt: str | None = None) -> np.ndarray:
        if "environment_state" not in observation or "state" not in observation:
            raise ValueError(
                "the LIBERO expert needs the observation's 'state' and privileged 'environment_state'; "
                f"it has {sorted(observation)}: build the LIBERO sim with privileged=True "
                "(evals/sims/libero.py)")
        state = np.asarray(observation["state"], dtype=np.float64).reshape(-1)
        privileged = np.asarray(observation["environment_state"], dtype=np.float64).reshape(-1)
        if state.size != 8 or privileged.size != 9:
            raise ValueError(f"the LIBERO expert expects state[8] and environment_state[9], got "
                             f"{state.size} and {privileged.size}")
        eef, rotation = state[:3], _rotation(state[3:6])
        obj, goal, obstacle = privileged[:3], privileged[3:6], privileged[6:9]
        self._count += 1
        if self.phase in ("approach", "descend") or self._rest_z is None:
            self._rest_z = float(obj[2])  # the object is still on the table: follow it while it settles
        fingers = rotation[:, 1]  # the fingers close along the hand's y axis
        fingers = np.array([fingers[0], fingers[1], 0.0]) / max(np.linalg.norm(fingers[:2]), 1e-6)
        if self.phase == "approach" and self._count == 1 and self._axis is None:
            if obj[0] > self.far_x:
                # far from the robot, pointing down, the arm cannot reach the far walls: turn the hand
                # a quarter and pinch the wall nearest the robot
                self._axis, self._side = np.array([1.0, 0.0, 0.0]), -1.0
            else:
                # grasp the wall on the side away from the nearest other object (the outer finger needs room)
                self._side = 1.0 if float(np.dot(obj - obstacle, fingers)) >= 0.0 else -1.0
        if self._axis is not None:
            fingers = self._axis
        if self.phase == "carry" and obj[2] < self._rest_z + 0.02 and np.linalg.norm((goal - obj)[:2]) > 0.03:
            self._next("approach")  # dropped on the way: grasp again
            self._count = 1
        grasp = obj + self._side * self.rim_radius * fingers
        grasp[2] = self._rest_z + self.grasp_depth
        above = grasp + np.array([0.0, 0.0, self.carry_height])
        if self.phase == "approach":
            if np.linalg.norm((above - eef)[:2]) < 0.005 and abs(above[2] - eef[2]) < 0.02:
                self._next("descend")
            return self._move(eef, above, rotation, -1.0)
        if self.phase == "descend":
            if np.linalg.norm(grasp - eef) < 0.006 or self._count > 40:
                self._next("close")
            return self._move(eef, grasp, rotation, -1.0)
        if self.phase == "close":
            if self._count > 12:
                self._next("lift")
            return self._move(eef, grasp, rotation, 1.0)
        # carrying: the end effector target is offset so the object (live) lands on the target
        offset = eef - obj
        if self.phase == "lift":
            target = eef.copy()
            target[2] = self._rest_z + self.grasp_depth + self.carry_height
            if eef[2] > self._rest_z + self.grasp_depth + 0.06 and obj[2] < self._rest_z + 0.03:
                self._next("approach")  # the grasp missed: open and try again
                self._count = 1
            elif abs(target[2] - eef[2]) < 0.02:
                self._next("carry")
            return self._move(eef, target, rotation, 1.0)
        if self.phase == "carry":
            target = goal + offset
            target[2] = self._rest_z + self.grasp_depth + self.carry_height
            if np.linalg.norm((goal - obj)[:2]) < 0.008:
                self._next("lower")
            return self._move(eef, target, rotation, 1.0)
        if self.phase == "lower":
            target = goal + offset
            target[2] = eef[2] + (goal[2] + self.release_height - obj[2])
            if obj[2] - goal[2] < self.release_height + 0.005 or self._count > 60:
                self._next("release")
            return self._move(eef, target, rotation, 1.0, limit=0.6)
        if self.phase == "release":
            if self._count > 10:
                self._next("retreat")
            return self._move(eef, eef, rotation, -1.0)
        target = eef + np.array([0.0, 0.0, 0.1])
        return self._move(eef, target, rotation, -1.0)


def expert() -> PickPlaceExpert:
    """The scripted pick-and-place expert."""
    return PickPlaceExpert()


def expert_late_release() -> PickPlaceExpert:
    """The expert releasing 8 cm above the target (a regression for the gate demonstration)."""
    return PickPlaceExpert(release_height=0.08)
