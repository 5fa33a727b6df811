"""Renders no one reads: how a bridge tells a sim which slots' next images may be skipped.

A policy that executes action chunks open loop (ACT with ``n_action_steps`` 10, Diffusion with 8)
reads one observation per chunk; the agent says so with each action it sends
(``{"actions": ..., "render": False}``: "I will not read the images of the observation this
action brings"), and the bridge hands the slots' flags to its sim before the step
(:meth:`~pytest_hud.sim.base.VectorSim.skip_renders`, ``[N]`` bool, True where no one reads).

A sim made of gymnasium envs passes each flag on to its slot's env when the env (or one of its
wrappers) has a ``hud_skip_render(skip: bool)`` method: the env may then leave its rendered
features (camera images) of the *next* step as they were, and must still give every other feature
fresh, step exactly the same physics, and render as usual at every reset and every step it was not
told to skip. The flag holds for the next step only (a reset clears it). Only the frames an agent
reads are rendered, and those are bit-identical to rendering every step (``tests/e2e/libero``,
``tests/e2e/meta_world``)::

    class MyEnv(gym.Env):
        def hud_skip_render(self, skip: bool) -> None:
            self._skip_next = skip          # read (and cleared) by the next step()

Camera images of a skipped step are the last rendered ones: a frame's layout never changes. The
videos of failed episodes are made from a replay of each with every frame rendered
(:mod:`pytest_hud.agent.replay`), so they do not keep a chunking policy's episodes rendering.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["env_skipper", "skip_env_renders"]


def env_skipper(env: Any) -> Any:
    """``env``'s ``hud_skip_render`` method (through its gymnasium wrappers), or None."""
    if env is None:
        return None
    try:
        method = env.get_wrapper_attr("hud_skip_render") if hasattr(env, "get_wrapper_attr") \
            else getattr(env, "hud_skip_render")
    except AttributeError:
        return None
    return method if callable(method) else None


def skip_env_renders(envs: Sequence[Any], unread: np.ndarray) -> None:
    """Tell each env of ``envs`` (one per slot, None where a slot has none) whether its next step's
    images go unread (``unread[i]``)."""
    for env, skip in zip(envs, np.asarray(unread, bool).tolist()):
        method = env_skipper(env)
        if method is not None:
            method(skip)
