"""The controller's sim pool: owns every bridge and policy server of a run, and starts and stops them.

The pool lives in the pytest controller (or the single process under ``-n 0``); workers reach it
through its loopback service (:mod:`pytest_hud.controller.pool_service`). :class:`SimPool` joins its
bridges (:mod:`pytest_hud.controller.bridges`: spawn on demand, route, replace) and its policy
servers (:mod:`pytest_hud.controller.policy_servers`), and holds what they share: the locks, the
work dir, how a service is launched and with which import paths, and the stop.

*Where* a bridge or policy server runs is the launcher's business (:mod:`pytest_hud.launch.launcher`): a
local child by default, a process on a Ray node (``--hud-ray``), or an already-running endpoint.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pytest_hud.client.bridge import BridgeAddress
from pytest_hud.controller.bridges import Bridges, BridgeSpec, PoolError, _Bridge
from pytest_hud.controller.policy_servers import PolicyServers, _Prestart
from pytest_hud.launch.launcher import ExitedWhileStarting, Launcher, LaunchError, LocalLauncher, Service

__all__ = ["PoolError", "BridgeSpec", "SimPool"]

SECRET_ENV = "PYTEST_HUD_SECRET"


class SimPool(Bridges, PolicyServers):
    """Owns every bridge process of a run. Thread-safe; spawning blocks only the asking caller."""

    def __init__(self, secret: str, spec: BridgeSpec, workers: int = 1,
                 attach: BridgeAddress | None = None, launcher: Launcher | None = None,
                 policy_replicas: int = 1) -> None:
        self.secret = secret
        self.spec = spec
        self.workers = max(1, workers)
        self.attach = attach
        self.launcher: Launcher = launcher or LocalLauncher(lambda: self.workdir, spec.host, spec.cwd)
        self.policy_replicas = max(1, policy_replicas)
        self._workdir: Path | None = None  # made on the first spawn: a run that starts nothing leaves nothing
        self._lock = threading.Lock()
        self._key_locks: dict[tuple, threading.Lock] = {}
        self._bridges: dict[tuple, _Bridge] = {}
        self._retired: list[_Bridge] = []
        self._servers: dict[tuple, tuple[Service, dict[str, Any]]] = {}
        self._prestarts: dict[tuple[str, int], _Prestart] = {}  # (spec, replica) -> a server awaiting its contract
        self._prestarted = 0
        self._bridge_prestarts: set[tuple[str, str, int]] = set()  # bridges prestart_bridge started
        #: What the run should be told about its bridges (a --hud-vectorization that did not apply), once each
        self.notes: dict[str, None] = {}
        self._worker_paths: dict[str, None] = {}  # the workers' project import paths (add_python_path)
        self._start_failures: dict[tuple, str] = {}  # services that exited while starting: not started again
        self.closed = False
        #: ``(what, started, announced)`` of every service started (monotonic seconds)
        self.launches: list[tuple[str, float, float]] = []

    # ------------------------------------------------------------- services
    def _once(self, key: tuple, start: Callable[[], Any]) -> Any:
        """``start()`` the service of ``key`` (its key lock held), unless it already exited on its own
        error while starting in this run: a bad checkpoint or sim fails every later start the same
        way, so each later episode gets that error at once instead of minutes of restarts. One
        killed by a signal is started again."""
        failed = self._start_failures.get(key)
        if failed is not None:
            raise LaunchError(f"{failed}\n(started once in this run and not again: it exited while starting)")
        try:
            return start()
        except ExitedWhileStarting as exc:
            if exc.returncode > 0:
                self._start_failures[key] = str(exc)
            raise

    @property
    def workdir(self) -> Path:
        """The 0700 directory of announce files (with the secret) and logs, made on first use."""
        with self._lock:
            if self._workdir is None:
                if self.closed:
                    raise PoolError("the run is shutting down")
                self._workdir = Path(tempfile.mkdtemp(prefix="pytest-hud-"))  # mkdtemp makes it 0700
            return self._workdir

    def _launch(self, cmd: list[str], what: str, role: str, files: dict[str, str] | None = None,
                clock: threading.Event | None = None) -> Service:
        """Start a service through the launcher; it announces itself (or its failure is raised)."""
        env = {SECRET_ENV: self.secret, "SDL_VIDEODRIVER": os.environ.get("SDL_VIDEODRIVER", "dummy")}
        with self._lock:
            workers = list(self._worker_paths)
        paths = [p for p in self.spec.python_path if p] + workers + [
            p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if paths:
            env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        late = {"clock": clock} if clock is not None else {}  # only launchers that prestart take a clock
        started = time.monotonic()
        service = self.launcher.launch(cmd, what, role=role, env=env, timeout=self.spec.boot_timeout, files=files,
                                       **late)
        self.launches.append((what, started, time.monotonic()))  # the run's start-up summary reads them
        return service

    def add_python_path(self, paths: Iterable[str]) -> None:
        """Import paths a worker's project needs (its test folders on ``sys.path``): every service
        started from now on gets them on its ``PYTHONPATH``, after the run's own."""
        with self._lock:
            for p in paths or ():
                if isinstance(p, str) and p:
                    self._worker_paths[p] = None

    # ----------------------------------------------------------------- stop
    def stop_all(self, timeout: float = 5.0) -> None:
        """Stop every service this run started (all at once) and remove the work dir with its secrets."""
        with self._lock:
            self.closed = True
            self._bridges.clear()
            self._servers.clear()
        self.launcher.close(timeout)
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
