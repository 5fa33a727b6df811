"""The controller's sim pool: spawn bridges on demand, route workers to them, replace and stop them.

The pool lives in the pytest controller (or the single process under ``-n 0``) and answers a tiny
loopback JSON-RPC service, authenticated with the run's secret, so workers can ask for a bridge:

    bridge(target, build, worker) -> {"control", "ws", "secret", "pid", "width", "host"}

One bridge serves one (sim target, build args) for ``width`` workers: worker ``i`` of ``n`` uses
group ``(i mod n) // width``. A bridge that died or reports itself broken is replaced when a worker
says so (``replace_pid``); its in-flight episodes were already errors.

*Where* a bridge or policy server runs is the launcher's business (:mod:`pytest_hud.launch.launcher`): a
local child by default, a process on a Ray node (``--hud-ray``), or an already-running endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_hud.client.bridge import BridgeAddress
from pytest_hud.launch.launcher import (
    ExitedWhileStarting, Launcher, LaunchError, LocalLauncher, Service,
)
from pytest_hud.wire.rpc import RpcError, RpcServer

__all__ = ["PoolError", "BridgeSpec", "SimPool", "PoolService"]

SECRET_ENV = "PYTEST_HUD_SECRET"
SERVER_MODULE = "pytest_hud.serving"  # what a policy server runs (python -m)


PoolError = LaunchError  # a bridge could not be started (the message carries the tail of its log)


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
    tick: str = "auto"
    batched_policy: bool = False  # a batching policy server answers the episodes (--hud-policy-server)
    tick_window: float = 0.001  # settings.OPTIONS["tick_window"]
    io_thread: bool = False  # settings.OPTIONS["io_thread"]
    host: str = "127.0.0.1"
    cwd: str | None = None
    python_path: list[str] = field(default_factory=list)


@dataclass
class _Prestart:
    """A policy server started before its contract: it waits for ``contract_path`` to appear."""

    contract_path: Path
    delivered: threading.Event = field(default_factory=threading.Event)  #: the contract is written
    done: threading.Event = field(default_factory=threading.Event)  #: announced, or failed
    service: Service | None = None
    error: BaseException | None = None


@dataclass
class _Bridge:
    key: tuple[str, str, int]
    process: Service  # poll() as subprocess.Popen's, wherever it runs
    address: BridgeAddress
    log: str
    started: float


class SimPool:
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

    # ---------------------------------------------------------------- routing
    def group_of(self, worker: int) -> int:
        return (worker % self.workers) // max(1, self.spec.width)

    def _sharing(self, group: int) -> int:
        """How many workers share the bridges of ``group`` (:meth:`group_of`): at most ``width``."""
        width = max(1, self.spec.width)
        return max(0, min(width, self.workers - group * width))

    def bridge_for(self, target: str, build: dict[str, Any] | None, worker: int = 0,
                   replace_pid: int | None = None) -> BridgeAddress:
        """The address of the bridge this worker should use, starting or replacing it if needed."""
        if self.attach is not None:
            return self.attach
        key = self._bridge_key(target, build, worker)
        with self._lock:
            if self.closed:
                raise PoolError("the run is shutting down")
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            current = self._bridges.get(key)
            if current is not None and replace_pid is not None and current.address.pid == replace_pid:
                self._retire(current)
                current = None
            if current is not None and current.process.poll() is not None:
                self._retire(current)  # died on its own: replace it
                current = None
            if current is None:
                current = self._once(key, lambda: self._spawn(key, target, build or {}))
                with self._lock:
                    self._bridges[key] = current
            return current.address

    def _bridge_key(self, target: str, build: dict[str, Any] | None, worker: int) -> tuple[str, str, int]:
        return target, json.dumps(build or {}, sort_keys=True), self.group_of(worker)

    def prestart_bridge(self, target: str, build: dict[str, Any] | None, worker: int = 0) -> bool:
        """Start the bridge :meth:`bridge_for` would give ``worker`` now, on a thread of its own, so
        that it boots while the workers still collect (xdist hands out the first test only once every
        worker has). A worker that asks meanwhile waits for this same bridge; a failure to start
        reaches the worker when it asks (:meth:`_once`). Once per bridge; True if started."""
        key = self._bridge_key(target, build, worker)
        with self._lock:
            if self.attach is not None or self.closed or key in self._bridge_prestarts:
                return False
            self._bridge_prestarts.add(key)

        def start() -> None:
            with contextlib.suppress(Exception):  # reported to the worker that asks (or started again)
                self.bridge_for(target, build, worker)

        threading.Thread(target=start, name="hud-prestart-bridge", daemon=True).start()
        return True

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

    # --------------------------------------------------------------- spawning
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
        return self.launcher.launch(cmd, what, role=role, env=env, timeout=self.spec.boot_timeout, files=files,
                                    **late)

    def add_python_path(self, paths: Iterable[str]) -> None:
        """Import paths a worker's project needs (its test folders on ``sys.path``): every service
        started from now on gets them on its ``PYTHONPATH``, after the run's own."""
        with self._lock:
            for p in paths or ():
                if isinstance(p, str) and p:
                    self._worker_paths[p] = None

    def prestart_policy_server(self, spec: str, worker: int = 0) -> bool:
        """Start ``spec``'s policy server for ``worker``'s replica now, before any worker has a contract.

        The server imports what the policy needs (torch and LeRobot take seconds) while the sims
        boot, then waits for the contract that :meth:`policy_server_for` hands it. The boot timeout
        counts from that hand-off. Local launchers only (the contract file must reach the server);
        one waiting server per (spec, replica); True if one was started. A server that no worker
        asks for waits, idle, until the run ends.
        """
        if not getattr(self.launcher, "prestarts", False):
            return False
        replica = worker % self.policy_replicas
        workdir = self.workdir
        with self._lock:
            if self.closed or (spec, replica) in self._prestarts or any(
                    key[1] == spec and key[3] == replica for key in self._servers):
                return False
            self._prestarted += 1
            pending = _Prestart(workdir / f"contract-{self._prestarted}.json")
            self._prestarts[(spec, replica)] = pending

        def start() -> None:
            try:
                pending.service = self._launch(
                    [*self._server_cmd(spec), "--contract-wait", str(pending.contract_path)],
                    f"policy server for {spec!r}", "policy", clock=pending.delivered)
            except BaseException as exc:  # noqa: BLE001 - handed to the worker that takes this server
                pending.error = exc
            finally:
                pending.done.set()

        threading.Thread(target=start, name=f"hud-prestart-{self._prestarted}", daemon=True).start()
        return True

    def _server_cmd(self, spec: str) -> list[str]:
        # Keyed: _launch gives the child the run secret (SECRET_ENV), which the server takes as its
        # API key when given none; workers send the secret (session.HudSession.agent).
        threads = self.server_threads()
        return ["-m", SERVER_MODULE, "--policy", spec, "--port", "0",
                *(["--threads", str(threads)] if threads else [])]

    def server_threads(self) -> int | None:
        """Torch threads for a policy server that shares this machine's cores with the bridges' env
        processes (None: torch's default, one per core).

        With ``processes`` vectorization (or ``auto``, which chooses it for envs of a few ms per step)
        a bridge runs one env process per core, up to its width, and in lanes mode one lane's forward
        pass runs while the other lanes step: the server then gets the cores those others leave it
        (one on a machine with no more cores than slots). A forward on more threads than free cores
        stalls at every parallel region whose threads wait for a core (on 2 cores, PushT's ACT forward
        of 4 observations took 41 ms on torch's 2 threads there against 37 ms on one). ``auto`` is
        counted as ``processes``, which the server cannot wait for (it starts before the bridges time
        their envs); where the envs stay in the bridge's process the forward loses little (the reach
        ACT suite, 24 episodes on 8 workers: 4.4-4.7 s on one thread or two). Not set where
        ``OMP_NUM_THREADS`` says, or where bridges and servers are not started on this machine.
        """
        if "OMP_NUM_THREADS" in os.environ or self.attach is not None or not isinstance(self.launcher, LocalLauncher):
            return None
        if self.spec.vectorization not in ("auto", "processes"):
            return None
        cores = os.cpu_count() or 1
        processes = min(cores, self.spec.width)
        if processes < 2:
            return None
        return max(1, cores - processes + 1)

    def warm_policy_server(self) -> bool:
        """Start a standby interpreter that imports torch and LeRobot's policy code now and becomes
        the next policy server this pool starts, whatever its policy (launchers that can:
        :meth:`pytest_hud.launch.launcher.LocalLauncher.warm`). True if one started."""
        warm = getattr(self.launcher, "warm", None)
        if warm is None or self.closed:
            return False
        return bool(warm("policy", SERVER_MODULE, "pytest_hud.agent.lerobot:preload"))

    def _prestarted_server(self, spec: str, replica: int, contract: dict[str, Any]) -> Service | None:
        """The prestarted server for (spec, replica), given ``contract`` and announced; None if there is none."""
        with self._lock:
            pending = self._prestarts.pop((spec, replica), None)
        if pending is None:
            return None
        tmp = pending.contract_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(contract))
        os.replace(tmp, pending.contract_path)  # the server polls for the file: never half of it
        pending.delivered.set()
        pending.done.wait()
        if pending.error is not None:
            raise pending.error
        return pending.service

    def policy_server_for(self, spec: str, contract: dict[str, Any] | None = None, worker: int = 0) -> dict[str, Any]:
        """This worker's policy server for ``spec``: ``{"url", "node", "host"}`` (started on first request).

        With ``policy_replicas`` > 1, worker ``i`` uses replica ``i mod replicas``; each replica batches
        across the workers that use it.
        """
        replica = worker % self.policy_replicas
        key = ("policy", spec, json.dumps(contract or {}, sort_keys=True), replica)
        with self._lock:
            if self.closed:
                raise PoolError("the run is shutting down")
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            known = self._servers.get(key)
            if known is not None and known[0].poll() is None:
                return known[1]
            service = self._once(key, lambda: self._start_policy_server(spec, replica, contract))
            data = service.announce
            url = data.get("url") or f"ws://{data.get('host', self.spec.host)}:{data['ws']}"
            reply = {"url": url, "node": service.node, "host": data.get("host"), "replica": replica}
            if data.get("key"):
                reply["key"] = data["key"]  # a server this run did not start: its own key, not the secret
            self._servers[key] = (service, reply)
            return reply

    def _start_policy_server(self, spec: str, replica: int, contract: dict[str, Any] | None) -> Service:
        """The prestarted server for (spec, replica) given ``contract``, else one started now."""
        if contract:
            try:
                service = self._prestarted_server(spec, replica, contract)
            except LaunchError as exc:
                if isinstance(exc, ExitedWhileStarting) and exc.returncode > 0:
                    raise  # its own error (a bad checkpoint): a new one would fail alike
                service = None  # killed or timed out: start one the usual way, whose error (if any) is reported
            if service is not None:
                return service
        cmd, files = self._server_cmd(spec), None
        if contract:
            files = {"contract.json": json.dumps(contract)}
            cmd += ["--contract", "{dir}/contract.json"]
        return self._launch(cmd, f"policy server for {spec!r}", "policy", files)

    def _spawn(self, key: tuple, target: str, build: dict[str, Any]) -> _Bridge:
        spec = self.spec
        sharing = self._sharing(key[2])  # workers that will claim on this bridge: they start together
        cmd = [
            "-m", "pytest_hud.bridge", target,
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
        service = self._launch(cmd, f"bridge for {target!r}", "bridge")
        for field_ in ("vectorization_note", "vectorization_auto"):
            note = service.announce.get(field_)
            if note:
                self.notes[f"{_label(key)}: --hud-vectorization={note}"] = None
        address = BridgeAddress.from_dict(dict(service.announce, node=service.node))
        return _Bridge(key, service, address, service.log, time.monotonic())

    def _retire(self, bridge: _Bridge) -> None:
        bridge.process.stop()
        with self._lock:
            self._bridges.pop(bridge.key, None)
            self._retired.append(bridge)

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
        """What the live bridges say: slots they retired after faults of their envs, and what would
        make their sims step faster (see ``stepping_hint``).

        Asked all at once, for ``timeout`` seconds in all: a bridge stuck in a sim call (one that
        accepts but does not answer) delays the summary by that much, however many there are."""
        from pytest_hud.client.bridge import BridgeError, ControlClient

        with self._lock:
            bridges = [b for b in self._bridges.values() if b.process.poll() is None]
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

    def stop_all(self, timeout: float = 5.0) -> None:
        """Stop every service this run started (all at once) and remove the work dir with its secrets."""
        with self._lock:
            self.closed = True
            self._bridges.clear()
            self._servers.clear()
        self.launcher.close(timeout)
        if self._workdir is not None:
            shutil.rmtree(self._workdir, ignore_errors=True)


class PoolService:
    """The pool's loopback JSON-RPC service, on its own asyncio thread in the controller.

    ``extra_methods`` lets the plugin add calls (episode declarations, sequential decisions).
    """

    def __init__(self, pool: SimPool, secret: str, host: str = "127.0.0.1",
                 extra_methods: dict[str, Callable[..., Any]] | None = None) -> None:
        self.pool = pool
        self.host = host
        self._loop = asyncio.new_event_loop()
        methods: dict[str, Any] = {"bridge": self._bridge, "bridges": self._bridges,
                                   "policy_server": self._policy_server}
        for name, fn in (extra_methods or {}).items():
            methods[name] = self._wrap(fn)
        self._server = RpcServer(methods, secret, hello_info=lambda: {"service": "pytest-hud/pool/1"})
        self.port = 0
        self._thread = threading.Thread(target=self._run, name="hud-pool", daemon=True)
        started = threading.Event()
        self._started = started
        self._failure: list[BaseException] = []
        self._thread.start()
        started.wait(30)
        if self._failure:
            raise PoolError(f"cannot start the pool service: {self._failure[0]}")

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self.port = self._loop.run_until_complete(self._server.start(self.host, 0))
        except BaseException as exc:  # noqa: BLE001 - reported to the constructor
            self._failure.append(exc)
            self._started.set()
            return
        self._started.set()
        self._loop.run_forever()

    @staticmethod
    def _wrap(fn: Callable[..., Any]):
        async def handler(conn: Any, **params: Any) -> Any:
            return await asyncio.get_running_loop().run_in_executor(None, lambda: fn(**params))

        return handler

    async def _bridge(self, conn: Any, target: str, build: dict | None = None, worker: int = 0,
                      replace_pid: int | None = None, python_path: list[str] = ()) -> dict[str, Any]:
        self.pool.add_python_path(python_path)
        try:
            address = await asyncio.get_running_loop().run_in_executor(
                None, self.pool.bridge_for, target, build, worker, replace_pid
            )
        except PoolError as exc:
            raise RpcError(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - every failure reaches the worker as a message
            raise RpcError(f"{type(exc).__name__}: {exc}") from None
        return address.to_dict()

    async def _policy_server(self, conn: Any, spec: str, contract: dict | None = None,
                             worker: int = 0, python_path: list[str] = ()) -> dict[str, Any]:
        self.pool.add_python_path(python_path)
        try:
            return await asyncio.get_running_loop().run_in_executor(
                None, self.pool.policy_server_for, spec, contract, worker
            )
        except PoolError as exc:
            raise RpcError(str(exc)) from None

    async def _bridges(self, conn: Any) -> list[dict[str, Any]]:
        return self.pool.bridges()

    def close(self) -> None:
        async def shutdown() -> None:
            await self._server.close()

        if self._loop.is_running():
            fut = asyncio.run_coroutine_threadsafe(shutdown(), self._loop)
            try:
                fut.result(5)
            except Exception:  # noqa: BLE001
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

