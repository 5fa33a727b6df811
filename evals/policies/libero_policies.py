"""Policies for the LIBERO evals that need no checkpoint.

- ``hold``: LIBERO's no-op (no motion, gripper open: the settle steps' action) on every step, after
  checking what the episode gives a LIBERO policy: both cameras (uint8, square), the 8-d state, the
  39-d proprio, and an instruction as the prompt (not a bare task id). It never solves a task: it
  drives the suites end to end in CI. Give a real policy with ``--hud-policy`` for the full protocol.

Each factory returns an object with ``predict(observation, prompt=None)`` (the pytest-hud Model seam).
"""

from __future__ import annotations

import re

import numpy as np

HOLD = np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float32)


class Hold:
    def __init__(self, cameras: bool = True) -> None:
        self.cameras = cameras

    def predict(self, observation, prompt=None) -> np.ndarray:
        if not prompt or re.fullmatch(r"task_\d+", prompt):
            raise ValueError(f"a LIBERO policy needs the task's instruction as its prompt, got {prompt!r}; "
                             "the LIBERO sim declares each task's instruction (evals/sims/libero.py): "
                             "claim a task of its suite, or pass prompt= with the text")
        if np.shape(observation["state"]) != (8,) or np.shape(observation["proprio"]) != (39,):
            raise ValueError(f"expected an 8-d state and a 39-d proprio, got "
                             f"{np.shape(observation['state'])} and {np.shape(observation['proprio'])}")
        if self.cameras:
            for name in ("agentview_image", "robot0_eye_in_hand_image"):
                image = np.asarray(observation[name])
                if image.dtype != np.uint8 or image.ndim != 3 or image.shape[0] != image.shape[1]:
                    raise ValueError(f"{name}: expected a square uint8 image, "
                                     f"got {image.dtype}{list(image.shape)}")
        return HOLD.copy()


def hold() -> Hold:
    return Hold()
