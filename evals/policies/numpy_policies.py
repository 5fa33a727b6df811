"""Small numpy policies for the example evals, loaded from checkpoints that ``evals/train_policies.py`` writes.

- ``cartpole``: a linear policy on the 4-D state (trained with the cross-entropy method).
- ``mountain_car``: a linear policy on [position, velocity] squashed by tanh (cross-entropy method).
- ``reach_pixels``: sees only the camera image; finds the red agent and the green goal by their
  colour centroids and maps them to a velocity with a linear head fitted by behaviour cloning on
  scripted-expert demonstrations.

Each factory returns an object with ``predict(observation, prompt=None)`` (the pytest-hud Model seam).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

CHECKPOINTS = Path(__file__).parent / "checkpoints"


def _load(name: str) -> dict[str, np.ndarray]:
    path = CHECKPOINTS / f"{name}.npz"
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} is missing; run `python evals/train_policies.py`")
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


class LinearDiscrete:
    """``argmax`` over a linear score per action (CartPole: two actions)."""

    def __init__(self, weights: np.ndarray, bias: np.ndarray) -> None:
        self.weights, self.bias = weights, bias

    def predict(self, observation, prompt=None):
        return int(np.argmax(self.weights @ observation["state"] + self.bias))


class LinearTanh:
    def __init__(self, weights: np.ndarray, bias: np.ndarray) -> None:
        self.weights, self.bias = weights, bias

    def predict(self, observation, prompt=None):
        return np.tanh(self.weights @ observation["state"] + self.bias).astype(np.float32)


def colour_centroids(pixels: np.ndarray) -> np.ndarray:
    """``[agent_x, agent_y, goal_x, goal_y]`` in [0, 1] from the red and green pixels (y up)."""
    img = np.asarray(pixels, dtype=np.int16)
    h, w = img.shape[:2]
    r, g = img[..., 0], img[..., 1]
    out = []
    for mask in (r > g + 80, g > r + 80):
        ys, xs = np.nonzero(mask)
        if xs.size == 0:
            out += [0.5, 0.5]
        else:
            out += [(xs.mean() + 0.5) / w, 1.0 - (ys.mean() + 0.5) / h]
    return np.asarray(out, dtype=np.float64)


def reach_features(pixels: np.ndarray) -> np.ndarray:
    """The goal's offset from the agent, as seen in the image: ``[dx, dy]``."""
    c = colour_centroids(pixels)
    return c[2:4] - c[0:2]


class PixelReach:
    def __init__(self, head: np.ndarray) -> None:
        self.head = head  # [2, 2]: velocity = head @ offset

    def predict(self, observation, prompt=None):
        return np.clip(self.head @ reach_features(observation["pixels"]), -1, 1).astype(np.float32)


def cartpole():
    ckpt = _load("cartpole_linear")
    return LinearDiscrete(ckpt["weights"], ckpt["bias"])


def cartpole_early():
    """An earlier, worse checkpoint of the same CEM run (for the gate demonstration)."""
    ckpt = _load("cartpole_linear_early")
    return LinearDiscrete(ckpt["weights"], ckpt["bias"])


def mountain_car():
    ckpt = _load("mountain_car_linear")
    return LinearTanh(ckpt["weights"], ckpt["bias"])


def reach_pixels():
    return PixelReach(_load("reach_pixels_head")["head"])
