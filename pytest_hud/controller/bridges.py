"""The pool's bridges: spawn them on demand, route workers to them, replace and stop them.

One bridge serves one (sim target, build args) for ``width`` workers: worker ``i`` of ``n`` uses
group ``(i mod n) // width``. A bridge that died or reports itself broken is replaced when a worker
says so (``replace_pid``); its in-flight episodes were already errors.

:class:`Bridges` holds the pool's bridges (live and retired) and the notes they gave; it starts
them through the run's :class:`~pytest_hud.controller.services.ServiceStarter`, which the policy
servers share. :class:`~pytest_hud.controller.pool.SimPool` holds one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_hud.controller.inline import KnownSims, auto_decides, inline_choice
from pytest_hud.client.address import BridgeAddress
from pytest_hud.controller.services import PoolError, ServiceStarter
from pytest_hud.launch.launcher import LocalLauncher, Service

__all__ = ["PoolError", "BridgeSpec", "Bridges", "BRIDGE_MODULE"]

BRIDGE_MODULE = "pytest_hud.bridge"  # what a bridge runs (python -m)


def first_sims(episode_sims: Sequence[int | None], workers: int) -> list[int]:
    """The sims (indices, in order) of the episodes the run's ``workers`` begin with, as
    pytest-xdist's load scheduling hands out tests (``episode_sims``: each declared episode's sim,
    None for one on no bridge, in collection order): one test each, round-robin, when there are
    fewer than two per worker, else each a chunk of consecutive tests, a quarter of its share and
    at least two. (A guess for starting bridges early: another scheduler costs a wait, not an episode.)"""
    n, workers = len(episode_sims), max(1, workers)
    if n < 2 * workers:
        starts: Iterable[int] = range(min(n, workers))
    else:
        chunk = max(2, n // workers // 4)
        starts = range(0, chunk * workers, chunk)
    return list(dict.fromkeys(sim for sim in (episode_sims[i] for i in starts) if sim is not None))


def _sim_key(target: str, build: dict[str, Any] | str | None) -> tuple[str, str]:
    """A sim as the pool keys its bridges: its target and its build arguments as sorted JSON
    (given as such, as the ledger names a finished sim, or as a dict)."""
    return target, build if isinstance(build, str) else json.dumps(build or {}, sort_keys=True)


def _label(key: tuple[str, str, int]) -> str:
    """A bridge as the summary names it: its target, and its build arguments when it has any
    (two bridges of one target differ there)."""
    return f"bridge for {key[0]}" + (f" {key[1]}" if key[1] != "{}" else "")


@dataclass
class BridgeSpec:
    """How the pool starts bridges (shared by every bridge of a run)."""

    width: int
    boot_timeout: float = 120.0
    claim_timeout: float = 30.0
    first_action_timeout: float = 300.0
    step_timeout: float = 30.0
    vectorization: str = "auto"
    inline: str = "auto"  # settings.OPTIONS["inline"]: whether workers may run a cheap env themselves
    tick: str = "auto"
    batched_policy: bool = False  # a batching policy server answers the episodes (--hud-policy-server)
    tick_window: float = 0.001  # settings.OPTIONS["tick_window"]
    io_thread: bool = False  # settings.OPTIONS["io_thread"]
    policy_rename: dict[str, str] = field(default_factory=dict)  # HudSettings.rename, for policy servers
    host: str = "127.0.0.1"
    cwd: str | None = None
    python_path: list[str] = field(default_factory=list)


@dataclass
class _Bridge:
    key: tuple[str, str, int]
    process: Service  # poll() as subprocess.Popen's, wherever it runs
    address: BridgeAddress
    log: str
    started: float


class Bridges:
    """The bridges of a run (see the module docstring): routing, spawning, retiring, and what the
    live bridges say. ``workers``: the run's xdist workers; ``attach``: a bridge this run did not
    start, which every worker uses."""

    def __init__(self, starter: ServiceStarter, spec: BridgeSpec, workers: int = 1,
                 attach: BridgeAddress | None = None, known: KnownSims | None = None) -> None:
        self.starter = starter
        self.spec = spec
        self.known = known or KnownSims(None)  # what earlier runs found about their sims
        self.workers = max(1, workers)
        self.attach = attach
        self._lock = threading.Lock()  # guards the maps below
        self._bridges: dict[tuple, _Bridge] = {}
        self._retired: list[_Bridge] = []
        self._prestarts: set[tuple[str, str, int]] = set()  # bridges prestart_bridge started
        self._finishing: list[threading.Thread] = []  # stopping the bridges of sims with nothing left to run
        self._said: list[str] = []  # what those bridges said before they stopped (stepping_notes)
        self._order: list[tuple[str, dict[str, Any]]] = []  # the run's sims in collection order (plan)
        self._begun: set[tuple[str, str]] = set()  # sims (target, build JSON) whose bridges were started
        self._finished: set[tuple[str, str]] = set()  # sims whose declared episodes were all reported
        #: What the run should be told about its bridges (a --hud-vectorization that did not apply), once each
        self.notes: dict[str, None] = {}

    # ---------------------------------------------------------------- routing
    def group_of(self, worker: int) -> int:
        return (worker % self.workers) // max(1, self.spec.width)

    def _sharing(self, group: int) -> int:
        """How many workers share the bridges of ``group`` (:meth:`group_of`): at most ``width``."""
        width = max(1, self.spec.width)
        return max(0, min(width, self.workers - group * width))

    def bridge_for(self, target: str, build: dict[str, Any] | None, worker: int = 0,
                   replace_pid: int | None = None, refuse_inline: bool = False) -> BridgeAddress:
        """The address of the bridge this worker should use, starting or replacing it if needed;
        for a sim an earlier run found camera-less, none (the worker runs it: ``inline_known``)
        unless the worker found a camera after all (``refuse_inline``)."""
        if self.attach is not None:
            return self.attach
        key = self._bridge_key(target, build, worker)
        why = (f"{target}: --hud-inline=auto: each worker steps its own env, since the sim renders no camera "
               f"(an earlier run's bridge found so: none is started for it now); --hud-inline=never "
               "keeps the shared bridge")
        if refuse_inline:
            self.known.forget(key[:2])
            self.notes.pop(why, None)
        elif self._known_inline(key):
            self.notes[why] = None
            return BridgeAddress(control=0, ws=0, secret="", inline=why, inline_known=True)
        with self.starter.key_lock(key):
            current = self._bridges.get(key)
            if current is not None and replace_pid is not None and current.address.pid == replace_pid:
                self._retire(current)
                current = None
            if current is not None and current.address.inline is None and current.process.poll() is not None:
                self._retire(current)  # died on its own: replace it (a stopped timing bridge is not replaced)
                current = None
            if current is None:
                current = self.starter.once(key, lambda: self._spawn(key, target, build or {}))
                with self._lock:
                    self._bridges[key] = current
            return current.address

    def _bridge_key(self, target: str, build: dict[str, Any] | None, worker: int) -> tuple[str, str, int]:
        return (*_sim_key(target, build), self.group_of(worker))

    def _known_inline(self, key: tuple[str, str, int]) -> bool:
        """Whether ``auto`` would run this sim in the workers as an earlier run's bridge found it
        (camera-less, separate envs), with no layout or remote placement asked for: then no bridge starts."""
        return (key[:2] in self.known.earlier and auto_decides(self.spec) and not self.spec.batched_policy
                and isinstance(self.starter.launcher, LocalLauncher))

    def plan(self, sims: Sequence[Sequence[Any]], first: Iterable[int]) -> None:
        """The run's sims in collection order (``[target, build]``) and those its workers begin
        with (indices, :func:`first_sims`): their bridges start now, for every group of workers,
        and so does the next sim's, booting ahead. Each time a sim finishes (:meth:`finish`), the
        next one not started yet boots. A run of many suites (LIBERO's four, each bridge ``width``
        envs of a few GB) then holds the bridges of the suites it runs plus one, not all of them.
        The first declaration plans; a sim no plan named starts when a worker asks for it."""
        with self._lock:
            if self._order:
                return
            self._order = [(str(target), dict(build or {})) for target, build in sims]
        for index in dict.fromkeys(first):
            self._prestart_groups(*self._order[index])
        self._start_next()

    def _prestart_groups(self, target: str, build: dict[str, Any]) -> None:
        with self._lock:
            self._begun.add(_sim_key(target, build))
        width = max(1, self.spec.width)
        for group in range((self.workers + width - 1) // width):
            self.prestart_bridge(target, build, group * width)

    def _start_next(self) -> None:
        """Start the bridges of the first sim in collection order not started or finished yet."""
        with self._lock:
            begun = self._begun | self._finished | {key[:2] for key in self._bridges}
            upcoming = [(t, b) for t, b in self._order if _sim_key(t, b) not in begun]
        if upcoming and not self.starter.closed:
            self._prestart_groups(*upcoming[0])

    def prestart_bridge(self, target: str, build: dict[str, Any] | None, worker: int = 0) -> bool:
        """Start the bridge :meth:`bridge_for` would give ``worker`` now, on a thread of its own, so
        that it boots while the workers still collect (xdist hands out the first test only once every
        worker has). A worker that asks meanwhile waits for this same bridge; a failure to start
        reaches the worker when it asks (:meth:`ServiceStarter.once`). Once per bridge; True if started."""
        key = self._bridge_key(target, build, worker)
        with self._lock:
            if (self.attach is not None or self.starter.closed or key in self._prestarts or self.spec.inline == "always"
                    or self._known_inline(key)):
                return False
            self._prestarts.add(key)

        def start() -> None:
            with contextlib.suppress(Exception):  # reported to the worker that asks (or started again)
                self.bridge_for(target, build, worker)

        threading.Thread(target=start, name="hud-prestart-bridge", daemon=True).start()
        return True

    def warm_bridge(self) -> bool:
        """Start a standby interpreter that imports a bridge's modules now (asyncio, numpy,
        gymnasium: a few hundred ms on a busy machine) and becomes the next bridge this pool starts,
        whatever its sim (launchers that can: :meth:`pytest_hud.launch.launcher.LocalLauncher.warm`).
        Nothing starts for a run that attaches to a bridge or never starts one
        (``--hud-inline=always``). True if one started."""
        warm = getattr(self.starter.launcher, "warm", None)
        if (warm is None or self.attach is not None or self.starter.closed or self.spec.inline == "always"
                or (self.known.last_bridges == 0 and bool(self.known.earlier))):
            return False  # (the last run started no bridge: its sims ran in the workers)
        return bool(warm("bridge", BRIDGE_MODULE, f"{BRIDGE_MODULE}.__main__:preload"))

    # --------------------------------------------------------------- spawning
    def _spawn(self, key: tuple, target: str, build: dict[str, Any]) -> _Bridge:
        spec = self.spec
        sharing = self._sharing(key[2])  # workers that will claim on this bridge: they start together
        cmd = [
            "-m", BRIDGE_MODULE, target,
            "--width", str(spec.width),
            "--vectorization", spec.vectorization,
            "--tick", spec.tick,
            "--tick-window", repr(spec.tick_window),
            *(["--batched-policy"] if spec.batched_policy else []),
            *(["--start-together", str(sharing)] if spec.batched_policy and sharing > 1 else []),
            *(["--io-thread"] if spec.io_thread else []),
            "--build-args", json.dumps(build),
            "--claim-timeout", str(spec.claim_timeout),
            "--first-action-timeout", str(spec.first_action_timeout),
            "--step-timeout", str(spec.step_timeout),
        ]
        # (named with its build arguments where it has any: a run's bridges of one target differ there)
        service = self.starter.launch(cmd, f"bridge for {target!r}" + (f" {key[1]}" if key[1] != "{}" else ""),
                                      "bridge")
        for field_ in ("vectorization_note", "vectorization_auto"):
            note = service.announce.get(field_)
            if note:
                self.notes[f"{_label(key)}: --hud-vectorization={note}"] = None
        address = BridgeAddress.from_dict(dict(service.announce, node=service.node))
        inline = inline_choice(spec, target, service.announce, address)
        self.known.learned(key[:2], service.announce, kept=not inline)
        if inline:
            self.notes[inline] = None
            address = dataclasses.replace(address, inline=inline)
            # its workers step their own envs: the bridge has timed its env, nothing more to do
            threading.Thread(target=service.stop, name="hud-stop-timing-bridge", daemon=True).start()
        return _Bridge(key, service, address, service.log, time.monotonic())

    def _retire(self, bridge: _Bridge) -> None:
        bridge.process.stop()
        with self._lock:
            self._bridges.pop(bridge.key, None)
            self._retired.append(bridge)

    def finish(self, target: str, build: dict[str, Any] | str | None) -> None:
        """Every declared episode of this sim has been reported: stop its bridges (on a thread: the
        caller is the controller's report hook) once they said what the summary should tell
        (:meth:`stepping_notes`). A run of many suites (LIBERO's four, each bridge holding ``width``
        envs of a few GB) then holds the bridges of the suites it is running, not all of them. A
        worker that still asks for the sim (a rerun of a failed test) gets a fresh bridge."""
        key2 = _sim_key(target, build)
        with self._lock:
            self._finished.add(key2)
            done = [b for key, b in self._bridges.items() if key[:2] == key2 and b.address.inline is None]
            if self.starter.closed:
                return
            thread = threading.Thread(target=self._finish, args=(done,), name="hud-stop-finished-bridge", daemon=True)
            self._finishing.append(thread)
        thread.start()

    def _finish(self, bridges: list[_Bridge]) -> None:
        """Stop ``bridges`` once they said their notes, then start the next sim's (:meth:`plan`)."""
        said = self._ask(bridges, timeout=2.0)
        with self._lock:
            self._said.extend(said)
        for bridge in bridges:
            with self.starter.key_lock(bridge.key):  # not while a worker's request replaces it
                with self._lock:
                    current = self._bridges.get(bridge.key) is bridge
                if current:
                    self._retire(bridge)
        self._start_next()

    def forget(self) -> None:
        """The run is over: no bridge is handed out any more (the starter stops them)."""
        with self._lock:
            self._bridges.clear()

    # ------------------------------------------------------------------ views
    def bridges(self) -> list[dict[str, Any]]:
        with self._lock:
            items = list(self._bridges.values()) + self._retired
        return [
            {"target": b.key[0], "build": json.loads(b.key[1]), "group": b.key[2], "pid": b.address.pid,
             "alive": b.process.poll() is None, "log": str(b.log), "node": b.address.node, "host": b.address.host,
             "vectorization": b.process.announce.get("vectorization"), "tick": b.process.announce.get("tick")}
            for b in items
        ]

    def stepping_notes(self, timeout: float = 2.0) -> list[str]:
        """What the bridges say: slots they retired after faults of their envs, and what would
        make their sims step faster (see ``stepping_hint``); a bridge stopped once its sim's
        episodes were all reported (:meth:`finish`) said it then.

        Asked all at once, for ``timeout`` seconds in all: a bridge stuck in a sim call (one that
        accepts but does not answer) delays the summary by that much, however many there are."""
        deadline = time.monotonic() + timeout
        with self._lock:
            finishing = list(self._finishing)
        for thread in finishing:  # bridges stopping as their sims finished: what they said first
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            bridges = [b for b in self._bridges.values() if b.process.poll() is None]
            said = list(self._said)
        return said + self._ask(bridges, max(0.1, deadline - time.monotonic()))

    def _ask(self, bridges: list[_Bridge], timeout: float) -> list[str]:
        """The notes and stepping hints of ``bridges``, each line labelled with its bridge."""
        if not bridges:
            return []  # (workers that stepped their sims themselves: no client stack to import)
        from pytest_hud.client.bridge import BridgeError, ControlClient

        hints: dict[int, list[str]] = {}

        def ask(i: int, bridge: _Bridge) -> None:
            try:
                with ControlClient(bridge.address, timeout=timeout) as control:
                    stats = control.stats()
            except (BridgeError, OSError):
                return  # a bridge that cannot answer now has nothing to add
            said = [*stats.get("notes", []), *([stats["hint"]] if stats.get("hint") else [])]
            if said:
                hints[i] = [f"{_label(bridge.key)}: {line}" for line in said]

        threads = [threading.Thread(target=ask, args=(i, b), daemon=True, name="hud-stats")
                   for i, b in enumerate(bridges)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        got = dict(hints)  # a copy: a late answer may still arrive
        return [line for i in sorted(got) for line in got[i]]
