"""The policy harness: the agent loop and the Model seam (LeRobot and openpi adapters load lazily)."""

from .loop import Agent
from .model import Model, PolicyError, as_model, load_policy

__all__ = ["Agent", "Model", "PolicyError", "as_model", "load_policy"]
