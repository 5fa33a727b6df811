"""Where the pool's bridges and policy servers run: the launcher seam and its backends.

The pool decides *what* to start (``-m pytest_hud.bridge TARGET --width N ...``); a :class:`Launcher`
decides *where* and returns a :class:`Service` handle carrying the service's announce (ports,
secret, the host to reach it on, and the node it landed on). Three backends:

- :class:`LocalLauncher` (the default): a child process of the controller on loopback;
- :class:`~pytest_hud.launch.ray.RayLauncher` (``--hud-ray``): a process started by a Ray actor
  on a cluster node chosen by resources, bound to the node's address, held by a lease;
- :class:`StaticLauncher`: services an operator started their own way, listed by announce files or
  ``host:control:ws`` in :data:`BRIDGES_ENV` / ``ws://`` URLs in :data:`POLICY_SERVERS_ENV`.

A command given to :meth:`Launcher.launch` is the part after the interpreter (``["-m", "pytest_hud.bridge",
...]``); the launcher adds ``--announce``, ``--host``, ``--parent-pid`` (and ``--lease`` where the
service runs out of the controller's reach). ``{dir}`` in an argument stands for a private directory
on the service's machine, where ``files`` (name -> text) are written first.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

__all__ = ["BRIDGES_ENV", "POLICY_SERVERS_ENV", "LaunchError", "Launcher", "LocalLauncher", "LocalService",
           "Service", "StaticLauncher", "log_tail", "terminate"]

BRIDGES_ENV = "PYTEST_HUD_BRIDGES"
POLICY_SERVERS_ENV = "PYTEST_HUD_POLICY_SERVERS"


class LaunchError(RuntimeError):
    """A service could not be started (the message carries the tail of its log)."""


class ExitedWhileStarting(LaunchError):
    """The service exited before announcing itself: started the same way, it fails the same way
    (unless a signal killed it: ``returncode`` < 0)."""

    def __init__(self, message: str, returncode: int) -> None:
        super().__init__(message)
        self.returncode = returncode


class Service(Protocol):
    """A started bridge or policy server."""

    announce: dict[str, Any]  #: its announce, with "host" (where to reach it) and "node" (where it runs)
    log: str  #: where its output went (a path on its machine)

    @property
    def node(self) -> str | None: ...

    def poll(self) -> int | None:
        """None while it runs (as :meth:`subprocess.Popen.poll`), else an exit code (negative: lost)."""

    def stop(self) -> None: ...


class Launcher(Protocol):
    remote: bool  #: services run beyond the controller's reach (bind the node's address, hold a lease)

    def launch(self, cmd: list[str], what: str, *, role: str, env: Mapping[str, str], timeout: float,
               files: Mapping[str, str] | None = None) -> Service: ...

    def describe(self) -> str: ...

    def close(self, timeout: float = 5.0) -> None: ...


def log_tail(path: str | os.PathLike[str], lines: int = 25) -> str:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def fill(cmd: list[str], directory: str) -> list[str]:
    return [arg.replace("{dir}", directory) for arg in cmd]


# ------------------------------------------------------------------------ local
class LocalService:
    """A child of this process. ``poll``/``pid`` as :class:`subprocess.Popen`."""

    def __init__(self, process: subprocess.Popen, announce: dict[str, Any], log: Path) -> None:
        self.process = process
        self.announce = announce
        self.log = str(log)
        self.pid = process.pid

    @property
    def node(self) -> str | None:
        return None

    def poll(self) -> int | None:
        return self.process.poll()

    def stop(self) -> None:
        terminate(self.process)


class LocalLauncher:
    """Today's backend: children of the controller, in a new session, announcing into ``workdir``."""

    remote = False
    prestarts = True  #: may start a policy server before its contract exists (see ``SimPool.prestart_policy_server``)

    def __init__(self, workdir: Any, host: str = "127.0.0.1", cwd: str | None = None) -> None:
        self._workdir = workdir  # a callable: the pool makes its 0700 directory on first use
        self.host = host
        self.cwd = cwd
        self._lock = threading.Lock()
        self._count = 0
        self._children: list[subprocess.Popen] = []
        self._standby: dict[str, tuple[str, subprocess.Popen, Path]] = {}  # role -> (module, process, log)
        self._closed = False

    def describe(self) -> str:
        return "bridges spawned on demand"

    def launch(self, cmd: list[str], what: str, *, role: str, env: Mapping[str, str], timeout: float,
               files: Mapping[str, str] | None = None, clock: threading.Event | None = None) -> LocalService:
        """Start ``cmd`` and wait for its announce. ``clock``: the ``timeout`` counts from when it is
        set (a prestarted server waits for its contract first); until then only an exit ends the wait."""
        workdir: Path = self._workdir()
        with self._lock:
            self._count += 1
            stem = f"{role}-{self._count}"
        directory = workdir / stem
        if files or any("{dir}" in arg for arg in cmd):
            directory.mkdir(mode=0o700)
            for name, text in (files or {}).items():
                (directory / name).write_text(text)
        announce, log = workdir / f"{stem}.json", workdir / f"{stem}.log"
        full = [sys.executable, *fill(cmd, str(directory)), "--announce", str(announce), "--host", self.host,
                "--parent-pid", str(os.getpid())]
        child_env = dict(os.environ)
        child_env.update(env)
        # Started and listed under the lock: close() either stops this child or came first, and
        # then nothing starts (a prestart's thread may get here after the run's end began).
        with self._lock:
            if self._closed:
                raise LaunchError(f"{what} was not started: the run is shutting down")
            taken = self._hand_over(role, full, env)
            if taken is not None:
                process, log = taken
            else:
                with open(log, "wb") as log_fh:
                    # A new session: Ctrl-C in the terminal reaches pytest, which then stops children
                    # in order; the children's parent-death watch covers SIGKILL of pytest.
                    process = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=log_fh, stderr=log_fh,
                                               cwd=self.cwd, env=child_env, start_new_session=True)
                self._children.append(process)
        deadline = None if clock is not None else time.monotonic() + timeout
        while not announce.exists():
            if process.poll() is not None:
                raise ExitedWhileStarting(
                    f"{what} exited with code {process.returncode} while starting:\n{log_tail(log)}",
                    process.returncode)
            if deadline is None and clock is not None and clock.is_set():
                deadline = time.monotonic() + timeout
            if deadline is not None and time.monotonic() > deadline:
                terminate(process)
                raise LaunchError(f"{what} did not announce itself within {timeout:.0f} s (--hud-boot-timeout); "
                                  f"its log:\n{log_tail(log)}")
            time.sleep(0.02)
        data = json.loads(announce.read_text())
        data.setdefault("host", self.host)
        return LocalService(process, data, log)

    def warm(self, role: str, module: str, preload: str | None = None) -> bool:
        """Start a standby interpreter (:mod:`pytest_hud.launch.standby`) for ``role``'s next launch of
        ``-m module``: it calls ``preload`` (``module:function``) now, and that launch hands it its
        arguments instead of starting a process, so the imports overlap the run's start. One
        standby per role; True if one started."""
        with self._lock:
            if self._closed or role in self._standby:
                return False
            log = self._workdir() / f"{role}-standby.log"
            with open(log, "wb") as log_fh:
                process = subprocess.Popen(
                    [sys.executable, "-m", "pytest_hud.launch.standby", "--parent-pid", str(os.getpid()),
                     module, *([preload] if preload else [])],
                    stdin=subprocess.PIPE, stdout=log_fh, stderr=log_fh, cwd=self.cwd, start_new_session=True)
            self._children.append(process)
            self._standby[role] = (module, process, log)
            return True

    def _hand_over(self, role: str, full: list[str], env: Mapping[str, str]) -> tuple[subprocess.Popen, Path] | None:
        """Give ``role``'s standby the launch ``full`` (``[python, -m, module, args...]``) if it can
        take it: the same module, still alive. The lock is held."""
        module, process, log = self._standby.pop(role, (None, None, None))
        if process is None or full[1:3] != ["-m", module] or process.poll() is not None:
            if process is not None:
                terminate(process)
            return None
        order = json.dumps({"argv": full[3:], "env": dict(env)}) + "\n"
        try:
            process.stdin.write(order.encode())
            process.stdin.close()
        except OSError:  # it died since poll(): start one the usual way
            terminate(process)
            return None
        return process, log

    def close(self, timeout: float = 5.0) -> None:
        """Stop every child at once (SIGTERM, then SIGKILL after ``timeout``); start none after."""
        with self._lock:
            self._closed = True
            children = list(self._children)
        for process in children:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.monotonic() + timeout
        for process in children:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                terminate(process, kill=True)


def terminate(process: subprocess.Popen, kill: bool = False) -> None:
    if process.poll() is not None:
        return
    sig = signal.SIGKILL if kill else signal.SIGTERM
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            process.send_signal(sig)
        except ProcessLookupError:
            return
    try:
        process.wait(3.0)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        process.wait(3.0)


# ----------------------------------------------------------------------- static
class StaticService:
    """A service someone else runs: never stopped by us; alive as far as we can tell."""

    def __init__(self, announce: dict[str, Any], source: str) -> None:
        self.announce = announce
        self.log = f"(started outside this run: {source})"
        self.pid = announce.get("pid")

    @property
    def node(self) -> str | None:
        return self.announce.get("node") or self.announce.get("host")

    def poll(self) -> int | None:
        return None

    def stop(self) -> None:
        pass


def parse_endpoints(text: str, secret: str | None) -> list[dict[str, Any]]:
    """Bridge endpoints from ``PYTEST_HUD_BRIDGES``: comma-separated announce-file paths or
    ``host:control:ws`` triples (the latter take the secret from ``PYTEST_HUD_SECRET``).

    >>> parse_endpoints("10.0.0.5:7001:7002", "s3")
    [{'host': '10.0.0.5', 'control': 7001, 'ws': 7002, 'secret': 's3', 'node': '10.0.0.5'}]
    """
    endpoints = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        pieces = item.rsplit(":", 2)
        if len(pieces) == 3 and pieces[1].isdigit() and pieces[2].isdigit():
            if not secret:
                raise LaunchError(f"{BRIDGES_ENV} lists {item!r} without an announce file: "
                                  "set PYTEST_HUD_SECRET to the secret the bridges were started with")
            endpoints.append({"host": pieces[0], "control": int(pieces[1]), "ws": int(pieces[2]),
                              "secret": secret, "node": pieces[0]})
            continue
        try:
            data = json.loads(Path(item).read_text())
        except FileNotFoundError:
            raise LaunchError(f"{BRIDGES_ENV}: announce file {item!r} does not exist; "
                              "list announce files or host:control:ws triples, separated by commas") from None
        except ValueError as exc:
            raise LaunchError(f"{BRIDGES_ENV}: announce file {item!r} is not JSON: {exc}") from None
        data.setdefault("host", "127.0.0.1")
        endpoints.append(data)
    return endpoints


class StaticLauncher:
    """Hands out already-running services in turn instead of starting any.

    Bridges come from :data:`BRIDGES_ENV`, policy servers (``ws://host:port`` URLs) from
    :data:`POLICY_SERVERS_ENV`. The n-th launch of a role gets the n-th endpoint; running out is an
    error naming the variable to extend. A role with no endpoint listed at all is started locally
    (list only policy servers, say, and bridges are children of the controller as usual).
    """

    remote = True

    def __init__(self, environ: Mapping[str, str] | None = None, host: str = "127.0.0.1",
                 cwd: str | None = None) -> None:
        environ = os.environ if environ is None else environ
        secret = environ.get("PYTEST_HUD_SECRET")
        self.endpoints = {
            "bridge": parse_endpoints(environ.get(BRIDGES_ENV, ""), secret),
            # Servers started by an operator have the operator's key (PYTEST_HUD_POLICY_KEY), not this run's secret.
            "policy": [{"url": url.strip(), "host": url.strip().split("//")[-1].rsplit(":", 1)[0],
                        "key": environ.get("PYTEST_HUD_POLICY_KEY") or None}
                       for url in environ.get(POLICY_SERVERS_ENV, "").split(",") if url.strip()],
        }
        self._used = {"bridge": 0, "policy": 0}
        self._lock = threading.Lock()
        self._local_dir: Path | None = None
        self.local = LocalLauncher(self._workdir, host, cwd)  # for roles with nothing listed

    def _workdir(self) -> Path:
        with self._lock:
            if self._local_dir is None:
                import tempfile

                self._local_dir = Path(tempfile.mkdtemp(prefix="pytest-hud-"))  # 0700
            return self._local_dir

    def describe(self) -> str:
        return (f"static endpoints: {len(self.endpoints['bridge'])} bridge(s) from ${BRIDGES_ENV}, "
                f"{len(self.endpoints['policy'])} policy server(s) from ${POLICY_SERVERS_ENV}")

    def warm(self, role: str, module: str, preload: str | None = None) -> bool:
        """A standby for a role started locally (none listed): :meth:`LocalLauncher.warm`."""
        return False if self.endpoints.get(role) else self.local.warm(role, module, preload)

    def launch(self, cmd: list[str], what: str, *, role: str, env: Mapping[str, str], timeout: float,
               files: Mapping[str, str] | None = None) -> Service:
        variable = BRIDGES_ENV if role == "bridge" else POLICY_SERVERS_ENV
        if not self.endpoints.get(role):
            return self.local.launch(cmd, what, role=role, env=env, timeout=timeout, files=files)
        with self._lock:
            listed = self.endpoints.get(role, [])
            n = self._used.get(role, 0)
            if n >= len(listed):
                raise LaunchError(f"{what}: the run needs endpoint #{n + 1} but ${variable} lists {len(listed)}; "
                                  f"start another and add it to ${variable}")
            self._used[role] = n + 1
        return StaticService(dict(listed[n]), variable)

    def close(self, timeout: float = 5.0) -> None:
        self.local.close(timeout)
        if self._local_dir is not None:
            import shutil

            shutil.rmtree(self._local_dir, ignore_errors=True)
