"""The policy harness: the agent loop and the Model seam (LeRobot and openpi adapters load lazily)."""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # (for type checkers and the API docs; at run time each name comes on first use)
    from .loop import Agent
    from .model import Model, PolicyError, as_model, load_policy

_WHERE = {"Agent": "loop", "Model": "model", "PolicyError": "model", "as_model": "model", "load_policy": "model"}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    """Each name from its module on first use: the controller checks a policy spec
    (:mod:`pytest_hud.agent.model`) without the agent loop's imports (numpy, the clients)."""
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
