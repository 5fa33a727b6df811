"""The controller's sim pool: owns every bridge and policy server of a run, and starts and stops them.

The pool lives in the pytest controller (or the single process under ``-n 0``); workers reach it
through its loopback service (:mod:`pytest_hud.controller.pool_service`). :class:`SimPool` holds
three objects and is the face the controller and the service call: the run's
:class:`~pytest_hud.controller.services.ServiceStarter` (how a service is launched, the work dir,
the stop), its :class:`~pytest_hud.controller.bridges.Bridges` (spawn on demand, route, replace)
and its :class:`~pytest_hud.controller.policy_servers.PolicyServers`, which both start through
the starter.

*Where* a bridge or policy server runs is the launcher's business (:mod:`pytest_hud.launch.launcher`): a
local child by default, a process on a Ray node (``--hud-ray``), or an already-running endpoint.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_hud.controller.bridges import Bridges, BridgeSpec
from pytest_hud.controller.inline import KnownSims
from pytest_hud.controller.policy_servers import PolicyServers
from pytest_hud.controller.services import SECRET_ENV, PoolError, ServiceStarter
from pytest_hud.launch.launcher import Launcher

if TYPE_CHECKING:
    from pytest_hud.client.address import BridgeAddress

__all__ = ["PoolError", "BridgeSpec", "SECRET_ENV", "SimPool"]


class SimPool:
    """Owns every bridge and policy server of a run. Thread-safe; spawning blocks only the asking caller."""

    def __init__(self, secret: str, spec: BridgeSpec, workers: int = 1,
                 attach: BridgeAddress | None = None, launcher: Launcher | None = None,
                 policy_replicas: int = 1, known: KnownSims | None = None) -> None:
        self.secret = secret
        self.spec = spec
        self.starter = ServiceStarter(secret, host=spec.host, cwd=spec.cwd, python_path=spec.python_path,
                                      boot_timeout=spec.boot_timeout, launcher=launcher)
        self.bridge_set = Bridges(self.starter, spec, workers, attach, known)
        self.server_set = PolicyServers(self.starter, spec, attach, policy_replicas)

    @property
    def launcher(self) -> Launcher:
        return self.starter.launcher

    @property
    def launches(self) -> list[tuple[str, float, float]]:
        """``(what, started, announced)`` of every service started (monotonic seconds)."""
        return self.starter.launches

    @property
    def workdir(self) -> Path:
        """The 0700 directory of announce files (with the secret) and logs, made on first use."""
        return self.starter.workdir

    @property
    def closed(self) -> bool:
        return self.starter.closed

    @property
    def notes(self) -> dict[str, None]:
        """What the run should be told about its bridges, once each."""
        return self.bridge_set.notes

    def add_python_path(self, paths: Iterable[str]) -> None:
        """Import paths a worker's project needs: every service started from now on gets them."""
        self.starter.add_python_path(paths)

    # ---------------------------------------------------------------- bridges
    def bridge_for(self, target: str, build: dict[str, Any] | None, worker: int = 0,
                   replace_pid: int | None = None, refuse_inline: bool = False) -> BridgeAddress:
        """The address of the bridge this worker should use, starting or replacing it if needed."""
        return self.bridge_set.bridge_for(target, build, worker, replace_pid, refuse_inline)

    def prestart_bridge(self, target: str, build: dict[str, Any] | None, worker: int = 0) -> bool:
        """Start the bridge :meth:`bridge_for` would give ``worker`` now, on a thread of its own."""
        return self.bridge_set.prestart_bridge(target, build, worker)

    def plan_bridges(self, sims: Sequence[Sequence[Any]], first: Iterable[int]) -> None:
        """The run's sims in collection order and those its workers begin with: start their bridges,
        and the next sim's ahead (:meth:`Bridges.plan`)."""
        self.bridge_set.plan(sims, first)

    def finish_bridges(self, target: str, build: dict[str, Any] | str | None) -> None:
        """Every declared episode of this sim is reported: stop its bridges, their notes kept."""
        self.bridge_set.finish(target, build)

    def bridges(self) -> list[dict[str, Any]]:
        """Every bridge this run started, live or retired."""
        return self.bridge_set.bridges()

    def stepping_notes(self, timeout: float = 2.0) -> list[str]:
        """What the live bridges say (retired slots, how their sims would step faster)."""
        return self.bridge_set.stepping_notes(timeout)

    # --------------------------------------------------------- policy servers
    def policy_server_for(self, spec: str, contract: dict[str, Any] | None = None, worker: int = 0,
                          rename: dict[str, str] | None = None) -> dict[str, Any]:
        """This worker's policy server for ``spec`` (fed with ``rename``): ``{"url", "node", "host"}``
        (started on first request)."""
        return self.server_set.policy_server_for(spec, contract, worker, rename)

    def prestart_policy_server(self, spec: str, worker: int = 0, rename: dict[str, str] | None = None) -> bool:
        """Start ``spec``'s policy server for ``worker``'s replica now, before any worker has a contract."""
        return self.server_set.prestart_policy_server(spec, worker, rename)

    def warm_bridge(self) -> bool:
        """Start a standby interpreter that becomes the next bridge this pool starts."""
        return self.bridge_set.warm_bridge()

    def warm_policy_server(self) -> bool:
        """Start a standby interpreter that becomes the next policy server this pool starts."""
        return self.server_set.warm_policy_server()

    def server_threads(self) -> int | None:
        """Torch threads for a policy server that shares this machine's cores with the bridges."""
        return self.server_set.server_threads()

    # ----------------------------------------------------------------- stop
    def stop_all(self, timeout: float = 5.0) -> None:
        """Stop every service this run started (all at once) and remove the work dir with its secrets."""
        self.bridge_set.forget()
        self.bridge_set.known.save()
        self.server_set.forget()
        self.starter.close(timeout)
