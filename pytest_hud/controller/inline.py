"""Whether a worker runs a sim's env itself (``--hud-inline``) instead of sharing the bridge's.

A step through a shared bridge costs the worker a round trip (its action out, the observation
back) on top of the env-step, and a bridge that keeps its slots' envs in its own process steps them
one after another, however many workers wait on it. ``auto`` lets each worker step its own env,
as the bridge's loader would build it with one slot, when either

- one env-step costs less than that round trip (CartPole, MountainCar, small state-only sims): the
  bridge's hand-offs would be most of an episode's time. ``auto`` measures both when the bridge
  starts (the bridge times its env's first steps; the pool times round trips to its control
  channel), never by a list of sim names; or
- the sim's observations hold no image (Meta-World or MuJoCo from state): with no renderer or GL
  context to share, the workers' envs step side by side on the cores, where a bridge steps its
  slots one after another in its process (or hands each step through a pipe to a process of its
  own), on top of the round trip.

Sims with cameras keep the shared bridge (it renders, skips renders and spreads slow rendering envs
over processes), as does a sim a worker cannot run alone (one whose slots are not separate envs).
The episodes are the same either way: a worker runs the bridge's own slot rules on one slot of its
own (:mod:`pytest_hud.worker.inline`).
"""

from __future__ import annotations

from typing import Any

from pytest_hud.client.bridge import BridgeAddress, BridgeError, ControlClient

__all__ = ["inline_choice", "inline_wins"]


def inline_wins(env_step_s: float, round_trip_s: float) -> bool:
    """Whether one env-step costs less than one round trip to the bridge (both in seconds).

    >>> inline_wins(20e-6, 90e-6), inline_wins(2e-3, 90e-6)
    (True, False)
    """
    return env_step_s < round_trip_s


def inline_choice(spec: Any, target: str, announce: dict[str, Any], address: BridgeAddress) -> str | None:
    """Why the workers run ``target``'s env themselves, or None to keep the shared bridge
    (``spec``: the pool's :class:`~pytest_hud.controller.bridges.BridgeSpec`; ``announce``: what
    the bridge said of its sim once built).

    Only ``--hud-inline=auto`` decides, and only where the bridge's layout is left to ``auto`` too:
    an explicit ``--hud-vectorization``, ``--hud-tick`` or ``--hud-io-thread`` asks for a bridge
    (``always`` never starts one, ``never`` keeps it). A bridge elsewhere (``node``: placed on
    another machine) is kept, as is a sim whose slots are not separate envs, and one with cameras
    whose env-step costs more than a round trip. A camera-less sim keeps it too where a batching
    policy server answers (the bridge starts its slots' episodes together for the server's batches)."""
    if (spec.inline != "auto" or spec.vectorization != "auto" or spec.tick != "auto" or spec.io_thread
            or address.node is not None or not announce.get("slot_envs")):
        return None
    never = "; --hud-inline=never keeps the shared bridge"
    step_s = announce.get("env_step_s")
    if step_s is not None:
        try:
            with ControlClient(address, timeout=10.0) as control:
                round_trip_s = control.round_trip_s()
        except (BridgeError, OSError):
            return None  # a bridge that cannot answer now keeps the episodes it was started for
        if inline_wins(float(step_s), round_trip_s):
            return (f"{target}: --hud-inline=auto: each worker steps its own env, since one env-step "
                    f"({float(step_s) * 1e6:.0f} µs) costs less than a round trip to the bridge "
                    f"({round_trip_s * 1e6:.0f} µs)" + never)
    if announce.get("cameras") == 0 and not spec.batched_policy:
        return (f"{target}: --hud-inline=auto: each worker steps its own env, since the sim renders no "
                f"camera: the workers' envs step side by side, without a round trip per step" + never)
    return None
