"""What the pool's bridges and policy servers share: how a service is started, and the run's end.

:class:`ServiceStarter` holds the launcher, the run secret and the import paths a service gets,
the run's work dir (announce files with the secret, logs), one lock per service key (two workers
asking for one service wait for the same start), the services that exited on their own error
while starting (not started again), and whether the run is shutting down. The pool's
:class:`~pytest_hud.controller.bridges.Bridges` and
:class:`~pytest_hud.controller.policy_servers.PolicyServers` each take one.
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

from pytest_hud.launch.launcher import ExitedWhileStarting, Launcher, LaunchError, LocalLauncher, Service

__all__ = ["PoolError", "SECRET_ENV", "ServiceStarter"]

PoolError = LaunchError  # a service could not be started (the message carries the tail of its log)
SECRET_ENV = "PYTEST_HUD_SECRET"


class ServiceStarter:
    """Starts a run's services (see the module docstring). ``python_path``: the run's own import
    paths; ``boot_timeout``: how long a service may take to announce itself."""

    def __init__(self, secret: str, *, host: str = "127.0.0.1", cwd: str | None = None,
                 python_path: list[str] | None = None, boot_timeout: float = 120.0,
                 launcher: Launcher | None = None) -> None:
        self.secret = secret
        self.python_path = python_path if python_path is not None else []  # read at each launch
        self.boot_timeout = boot_timeout
        self.launcher: Launcher = launcher or LocalLauncher(lambda: self.workdir, host, cwd)
        self.closed = False
        self._workdir: Path | None = None  # made on the first start: a run that starts nothing leaves nothing
        self._lock = threading.Lock()
        self._key_locks: dict[tuple, threading.Lock] = {}
        self._worker_paths: dict[str, None] = {}  # the workers' project import paths (add_python_path)
        self._start_failures: dict[tuple, str] = {}  # services that exited while starting
        #: ``(what, started, announced)`` of every service started (monotonic seconds)
        self.launches: list[tuple[str, float, float]] = []

    @property
    def workdir(self) -> Path:
        """The 0700 directory of announce files (with the secret) and logs, made on first use."""
        with self._lock:
            if self._workdir is None:
                if self.closed:
                    raise PoolError("the run is shutting down")
                self._workdir = Path(tempfile.mkdtemp(prefix="pytest-hud-"))  # mkdtemp makes it 0700
            return self._workdir

    def key_lock(self, key: tuple) -> threading.Lock:
        """The lock of the service ``key`` (held while it is looked up or started); raises
        :data:`PoolError` once the run is shutting down."""
        with self._lock:
            if self.closed:
                raise PoolError("the run is shutting down")
            return self._key_locks.setdefault(key, threading.Lock())

    def once(self, key: tuple, start: Callable[[], Any]) -> Any:
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

    def launch(self, cmd: list[str], what: str, role: str, files: dict[str, str] | None = None,
               clock: threading.Event | None = None) -> Service:
        """Start a service through the launcher; it announces itself (or its failure is raised)."""
        env = {SECRET_ENV: self.secret, "SDL_VIDEODRIVER": os.environ.get("SDL_VIDEODRIVER", "dummy")}
        with self._lock:
            workers = list(self._worker_paths)
        paths = [p for p in self.python_path if p] + workers + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if paths:
            env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
        late = {"clock": clock} if clock is not None else {}  # only launchers that prestart take a clock
        started = time.monotonic()
        service = self.launcher.launch(cmd, what, role=role, env=env, timeout=self.boot_timeout, files=files,
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

    def close(self, timeout: float = 5.0) -> None:
        """The run is over: stop every service the launcher started (all at once) and remove the
        work dir with its secrets."""
        with self._lock:
            self.closed = True
        self.launcher.close(timeout)
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)
