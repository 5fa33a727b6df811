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

A bridge is started only to learn what its sim is. Where pytest's cache is on (its default), the
pool remembers the sims it found camera-less (:class:`KnownSims`), and on the next run it starts
no bridge for them: the workers build the sim at once and check it themselves, and a worker that
finds a camera after all (the factory changed) asks for the bridge, which decides as above.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_hud.client.address import BridgeAddress

__all__ = ["KnownSims", "auto_decides", "camera_less", "inline_choice", "inline_wins"]

#: pytest's cache entry (``.pytest_cache/v/hud/sims``): the camera-less sims, and how many bridges the
#: last run started
CACHE_KEY = "hud/sims"


def inline_wins(env_step_s: float, round_trip_s: float) -> bool:
    """Whether one env-step costs less than one round trip to the bridge (both in seconds).

    >>> inline_wins(20e-6, 90e-6), inline_wins(2e-3, 90e-6)
    (True, False)
    """
    return env_step_s < round_trip_s


def auto_decides(spec: Any) -> bool:
    """Whether ``--hud-inline=auto`` may run a sim in the workers: the bridge's layout is left to
    ``auto`` too (an explicit ``--hud-vectorization``, ``--hud-tick`` or ``--hud-io-thread`` asks for
    a bridge; ``always`` never starts one, ``never`` keeps it)."""
    return (spec.inline == "auto" and spec.vectorization == "auto" and spec.tick == "auto"
            and not spec.io_thread)


def camera_less(announce: dict[str, Any]) -> bool:
    """Whether a bridge's sim renders no camera and is made of separate envs, as it announced."""
    return announce.get("cameras") == 0 and bool(announce.get("slot_envs"))


def inline_choice(spec: Any, target: str, announce: dict[str, Any], address: BridgeAddress) -> str | None:
    """Why the workers run ``target``'s env themselves, or None to keep the shared bridge
    (``spec``: the pool's :class:`~pytest_hud.controller.bridges.BridgeSpec`; ``announce``: what
    the bridge said of its sim once built).

    Only ``--hud-inline=auto`` decides (:func:`auto_decides`). A bridge elsewhere (``node``: placed on
    another machine) is kept, as is a sim whose slots are not separate envs, and one with cameras
    whose env-step costs more than a round trip. A camera-less sim keeps it too where a batching
    policy server answers (the bridge starts its slots' episodes together for the server's batches)."""
    if not auto_decides(spec) or address.node is not None or not announce.get("slot_envs"):
        return None
    never = "; --hud-inline=never keeps the shared bridge"
    step_s = announce.get("env_step_s")
    if step_s is not None:
        from pytest_hud.client.bridge import BridgeError, ControlClient

        try:
            with ControlClient(address, timeout=10.0) as control:
                round_trip_s = control.round_trip_s()
        except (BridgeError, OSError):
            return None  # a bridge that cannot answer now keeps the episodes it was started for
        if inline_wins(float(step_s), round_trip_s):
            return (f"{target}: --hud-inline=auto: each worker steps its own env, since one env-step "
                    f"({float(step_s) * 1e6:.0f} µs) costs less than a round trip to the bridge "
                    f"({round_trip_s * 1e6:.0f} µs)" + never)
    if camera_less(announce) and not spec.batched_policy:
        return (f"{target}: --hud-inline=auto: each worker steps its own env, since the sim renders no "
                f"camera: the workers' envs step side by side, without a round trip per step" + never)
    return None


class KnownSims:
    """What earlier runs in this project found about their sims, in pytest's cache (``cache``:
    ``config.cache``, None when the cache provider is off): which (target, build) render no camera
    and are made of separate envs (``earlier``), and how many bridges the last run started (none:
    no standby bridge either). Only a start-up shortcut: a worker checks the sim it builds (see the
    module). What this run's bridges find is saved for the next run, and how many of them served
    episodes (a bridge that only timed a sim the workers then stepped themselves does not count:
    the next run starts none for that sim)."""

    def __init__(self, cache: Any) -> None:
        self.cache = cache
        saved = cache.get(CACHE_KEY, None) if cache is not None else None
        saved = saved if isinstance(saved, dict) else {}  # (none yet, or not what this version writes)
        self.earlier = {tuple(k) for k in saved.get("camera_less", ()) if isinstance(k, list) and len(k) == 2}
        self.last_bridges = saved.get("bridges")
        self._found: dict[tuple[str, str], bool] = {}  # this run's bridges: camera-less or not
        self.bridges = 0  # started by this run and kept for its episodes
        self._lock = threading.Lock()

    def learned(self, key: tuple[str, str], announce: dict[str, Any], kept: bool = True) -> None:
        """What a bridge said of its sim once built (``key``: target and build args as JSON);
        ``kept``: it serves the sim's episodes (False: the workers step their own envs)."""
        with self._lock:
            self.bridges += kept
            self._found[key] = camera_less(announce)

    def forget(self, key: tuple[str, str]) -> None:
        """A worker found a camera, or could not run it alone: the bridge decides again."""
        with self._lock:
            self.earlier.discard(key)

    def save(self) -> None:
        if self.cache is None:
            return
        with self._lock:
            camera_less = (self.earlier - set(self._found)) | {k for k, yes in self._found.items() if yes}
            data = {"camera_less": sorted(list(k) for k in camera_less), "bridges": self.bridges}
        self.cache.set(CACHE_KEY, data)
