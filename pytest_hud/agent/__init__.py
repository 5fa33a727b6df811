"""The policy harness: the agent loop and the Model seam (LeRobot and openpi adapters load lazily)."""

from pytest_hud.agent.loop import Agent
from pytest_hud.agent.model import Model, PolicyError, as_model, load_policy

__all__ = ["Agent", "Model", "PolicyError", "as_model", "load_policy"]
