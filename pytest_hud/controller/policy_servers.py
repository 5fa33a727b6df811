"""The pool's policy servers: one per (policy, contract, replica), started on first request or
before it (prestarted, or a warm standby interpreter), so that their imports overlap the sims' boot.

:class:`PolicyServers` holds the run's policy servers (started, and prestarted waiting for their
contract); it starts them through the run's :class:`~pytest_hud.controller.services.ServiceStarter`,
which the bridges share. :class:`~pytest_hud.controller.pool.SimPool` holds one.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_hud.controller.bridges import BridgeSpec
from pytest_hud.controller.services import ServiceStarter
from pytest_hud.launch.launcher import ExitedWhileStarting, LaunchError, LocalLauncher, Service

if TYPE_CHECKING:
    from pytest_hud.client.address import BridgeAddress

__all__ = ["PolicyServers", "SERVER_MODULE"]

SERVER_MODULE = "pytest_hud.serving"  # what a policy server runs (python -m)


@dataclass
class _Prestart:
    """A policy server started before its contract: it waits for ``contract_path`` to appear."""

    contract_path: Path
    rename: dict[str, str]  #: what it feeds the checkpoint (observation key -> input feature)
    delivered: threading.Event = field(default_factory=threading.Event)  #: the contract is written
    done: threading.Event = field(default_factory=threading.Event)  #: announced, or failed
    service: Service | None = None
    error: BaseException | None = None


class PolicyServers:
    """The policy servers of a run (see the module docstring): start them (now, ahead of their
    contract, or from a warm standby) and hand each worker its replica's. ``spec``: the bridges'
    spec (host, vectorization and width say how many cores a server gets); ``attach``: a bridge
    this run did not start (then no core count is assumed)."""

    def __init__(self, starter: ServiceStarter, spec: BridgeSpec, attach: BridgeAddress | None = None,
                 replicas: int = 1) -> None:
        self.starter = starter
        self.spec = spec
        self.attach = attach
        self.policy_replicas = max(1, replicas)
        self._lock = threading.Lock()  # guards the maps below
        self._servers: dict[tuple, tuple[Service, dict[str, Any]]] = {}
        self._prestarts: dict[tuple[str, int], _Prestart] = {}  # (spec, replica) -> a server awaiting its contract
        self._prestarted = 0

    def prestart_policy_server(self, spec: str, worker: int = 0, rename: dict[str, str] | None = None) -> bool:
        """Start ``spec``'s policy server for ``worker``'s replica now, before any worker has a contract.

        The server imports what the policy needs (torch and LeRobot take seconds) while the sims
        boot, then waits for the contract that :meth:`policy_server_for` hands it. The boot timeout
        counts from that hand-off. Local launchers only (the contract file must reach the server);
        one waiting server per (spec, rename, replica); True if one was started. ``rename``: what
        the server feeds the checkpoint (default: ``--hud-policy-rename``). A server that no worker
        asks for waits, idle, until the run ends.
        """
        if not getattr(self.starter.launcher, "prestarts", False):
            return False
        replica = worker % self.policy_replicas
        rename = self._rename(rename)
        renamed = json.dumps(rename, sort_keys=True)
        workdir = self.starter.workdir
        with self._lock:
            if self.starter.closed or (spec, renamed, replica) in self._prestarts or any(
                    key[1] == spec and key[3] == renamed and key[4] == replica for key in self._servers):
                return False
            self._prestarted += 1
            pending = _Prestart(workdir / f"contract-{self._prestarted}.json", rename)
            self._prestarts[(spec, renamed, replica)] = pending

        def start() -> None:
            try:
                pending.service = self.starter.launch(
                    [*self._server_cmd(spec, rename), "--contract-wait", str(pending.contract_path)],
                    f"policy server for {spec!r}", "policy", clock=pending.delivered)
            except BaseException as exc:  # noqa: BLE001 - handed to the worker that takes this server
                pending.error = exc
            finally:
                pending.done.set()

        threading.Thread(target=start, name=f"hud-prestart-{self._prestarted}", daemon=True).start()
        return True

    def _rename(self, rename: dict[str, str] | None) -> dict[str, str]:
        """A test's rename map (its marker's merged with the option's), else the option's."""
        return dict(self.spec.policy_rename if rename is None else rename)

    def _server_cmd(self, spec: str, rename: dict[str, str] | None = None) -> list[str]:
        # Keyed: _launch gives the child the run secret (SECRET_ENV), which the server takes as its
        # API key when given none; workers send the secret (session.HudSession.agent).
        threads = self.server_threads()
        rename = self._rename(rename)
        return ["-m", SERVER_MODULE, "--policy", spec, "--port", "0",
                *(["--threads", str(threads)] if threads else []),
                *(["--rename", json.dumps(rename)] if rename else [])]

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
        if "OMP_NUM_THREADS" in os.environ or self.attach is not None or \
                not isinstance(self.starter.launcher, LocalLauncher):
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
        warm = getattr(self.starter.launcher, "warm", None)
        if warm is None or self.starter.closed:
            return False
        return bool(warm("policy", SERVER_MODULE, "pytest_hud.agent.lerobot:preload"))

    def _prestarted_server(self, spec: str, renamed: str, replica: int, contract: dict[str, Any]) -> Service | None:
        """The prestarted server for (spec, rename, replica), given ``contract`` and announced; None if there is none."""
        with self._lock:
            pending = self._prestarts.pop((spec, renamed, replica), None)
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

    def policy_server_for(self, spec: str, contract: dict[str, Any] | None = None, worker: int = 0,
                          rename: dict[str, str] | None = None) -> dict[str, Any]:
        """This worker's policy server for ``spec``: ``{"url", "node", "host"}`` (started on first request).

        With ``policy_replicas`` > 1, worker ``i`` uses replica ``i mod replicas``; each replica batches
        across the workers that use it. Tests that feed the checkpoint otherwise (``rename``, default
        ``--hud-policy-rename``) get a server of their own.
        """
        replica = worker % self.policy_replicas
        rename = self._rename(rename)
        renamed = json.dumps(rename, sort_keys=True)
        key = ("policy", spec, json.dumps(contract or {}, sort_keys=True), renamed, replica)
        with self.starter.key_lock(key):
            known = self._servers.get(key)
            if known is not None and known[0].poll() is None:
                return known[1]
            service = self.starter.once(key, lambda: self._start_policy_server(spec, rename, replica, contract))
            data = service.announce
            url = data.get("url") or f"ws://{data.get('host', self.spec.host)}:{data['ws']}"
            reply = {"url": url, "node": service.node, "host": data.get("host"), "replica": replica}
            if data.get("key"):
                reply["key"] = data["key"]  # a server this run did not start: its own key, not the secret
            with self._lock:
                self._servers[key] = (service, reply)
            return reply

    def _start_policy_server(self, spec: str, rename: dict[str, str], replica: int,
                             contract: dict[str, Any] | None) -> Service:
        """The prestarted server for (spec, rename, replica) given ``contract``, else one started now."""
        if contract:
            try:
                service = self._prestarted_server(spec, json.dumps(rename, sort_keys=True), replica, contract)
            except LaunchError as exc:
                if isinstance(exc, ExitedWhileStarting) and exc.returncode > 0:
                    raise  # its own error (a bad checkpoint): a new one would fail alike
                service = None  # killed or timed out: start one the usual way, whose error (if any) is reported
            if service is not None:
                return service
        cmd, files = self._server_cmd(spec, rename), None
        if contract:
            files = {"contract.json": json.dumps(contract)}
            cmd += ["--contract", "{dir}/contract.json"]
        return self.starter.launch(cmd, f"policy server for {spec!r}", "policy", files)

    def forget(self) -> None:
        """The run is over: no server is handed out any more (the starter stops them)."""
        with self._lock:
            self._servers.clear()
