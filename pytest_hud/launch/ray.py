"""The Ray backend of the launcher seam (``--hud-ray ADDRESS``): services placed on cluster nodes.

The pytest controller is the Ray driver. For each bridge or policy server the pool asks for, a plain
(sync) actor, :class:`ServiceActor`, is placed by resources (``--hud-bridge-resources``,
``--hud-policy-resources``), starts the service as its own child process on its node, bound to the
node's address, and returns the announce (node IP, ports, secret). The actor owns the process; the
data path stays direct TCP/WebSocket between workers and the service, never through Ray.

What ends a placed service:

- the run stops it: the lease is given up (``stop``), then the actor is killed;
- the actor dies (``ray.kill``, its node removed, the driver gone: Ray's owner-death): the service's
  parent watch sees its parent go;
- the raylet of its node crashes (actor and service live on, re-parented to PID 1): the driver
  learns the actor died, stops renewing and closes the lease, and the service exits; the actor
  exits a few seconds after its child (:meth:`ServiceActor.watch`);
- the controller vanishes without a word (SIGKILL, host lost, network split): the lease connection
  closes or falls silent, and the service exits within ``--hud-lease`` seconds.

Ray is imported only when a run passes ``--hud-ray`` (this module is never imported otherwise).
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_hud.launch.launcher import LaunchError, fill, log_tail
from pytest_hud.launch.lease import LeaseHolder, LeaseLost

__all__ = ["RayLauncher", "RayService", "ServiceActor"]

#: How long an actor outlives its exited child before ending its own process (the driver kills it
#: sooner; this covers a node whose raylet died, where nobody can).
ACTOR_GRACE_S = 5.0


def check_reachable(address: str, timeout: float = 5.0) -> str | None:
    """The host of a ``HOST:PORT`` or ``ray://HOST:PORT`` address, once something answers there.

    ``ray.init`` retries a dead address for minutes; this fails in seconds with the fix. ``auto``
    (and other addresses without a port) are left to Ray, which answers those quickly.
    """
    target = address[len("ray://"):] if address.startswith("ray://") else address
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return None
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except OSError as exc:
        raise LaunchError(f"--hud-ray {address}: nothing answers at {host}:{port} ({exc}). Is the cluster up? "
                          "'ray status' on its head node prints the address to pass") from None
    return host.strip("[]")


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def actor_options(resources: Mapping[str, float]) -> dict[str, Any]:
    """Ray actor options reserving ``resources`` (CPU and GPU are Ray's num_cpus/num_gpus)."""
    rest = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
    return {"num_cpus": resources.get("CPU", 0.0), "num_gpus": resources.get("GPU", 0.0),
            "resources": rest, "max_restarts": 0, "max_task_retries": 0}


class ServiceActor:
    """Runs on a cluster node; starts one service process there and owns it (a plain sync actor)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.dir: str | None = None

    def start(self, cmd: list[str], env: Mapping[str, str], files: Mapping[str, str], timeout: float,
              lease: float, cwd: str | None) -> dict[str, Any]:
        import ray

        node_ip = ray.util.get_node_ip_address()
        node_id = ray.get_runtime_context().get_node_id()
        self.dir = tempfile.mkdtemp(prefix="pytest-hud-")  # 0700: the announce holds the secret
        for name, text in files.items():
            Path(self.dir, name).write_text(text)
        announce, log = Path(self.dir, "announce.json"), Path(self.dir, "service.log")
        full = [sys.executable, *fill(list(cmd), self.dir), "--announce", str(announce), "--host", node_ip,
                "--parent-pid", str(os.getpid()), "--lease", str(lease)]
        child_env = dict(os.environ)
        child_env.update(env)
        paths = [p for p in child_env.get("PYTHONPATH", "").split(os.pathsep) if p and os.path.isdir(p)]
        child_env["PYTHONPATH"] = os.pathsep.join(paths)
        where = cwd if cwd and os.path.isdir(cwd) else self.dir
        with open(log, "wb") as log_fh:
            self.process = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=log_fh, stderr=log_fh,
                                            cwd=where, env=child_env)
        deadline = time.monotonic() + timeout
        while not announce.exists():
            if self.process.poll() is not None:
                raise RuntimeError(f"exited with code {self.process.returncode} while starting on node "
                                   f"{node_ip}:\n{log_tail(log)}")
            if time.monotonic() > deadline:
                self.process.kill()
                raise RuntimeError(f"did not announce itself within {timeout:.0f} s on node {node_ip} "
                                   f"(--hud-boot-timeout); its log:\n{log_tail(log)}")
            time.sleep(0.02)
        data = json.loads(announce.read_text())
        data.update(host=node_ip, node=node_id, node_ip=node_ip, actor_pid=os.getpid(), log=str(log))
        return data

    def watch(self) -> int:
        """Block until the service exits; return its code. The actor's process ends soon after."""
        assert self.process is not None
        code = self.process.wait()
        # Normally the driver kills this actor first; where the raylet died nobody can, so leave.
        threading.Timer(ACTOR_GRACE_S, os._exit, (0,)).start()
        return code


class RayService:
    """A service placed by :class:`RayLauncher`: its actor, its announce and the lease held on it."""

    def __init__(self, launcher: RayLauncher, actor: Any, announce: dict[str, Any], holder: LeaseHolder) -> None:
        self.launcher = launcher
        self.actor = actor
        self.announce = announce
        self.log = str(announce.get("log", ""))
        self.pid = announce.get("pid")
        self.holder: LeaseHolder | None = holder
        self.watch_ref = actor.watch.remote()
        self.lost: str | None = None  # why we consider it gone
        self.code: int | None = None

    @property
    def node(self) -> str | None:
        return self.announce.get("node")

    def poll(self) -> int | None:
        if self.code is None:
            self.launcher.check(self)
        return self.code

    def mark_lost(self, why: str, code: int = -1) -> None:
        if self.code is None:
            self.lost, self.code = why, code
        holder, self.holder = self.holder, None
        if holder is not None:
            holder.close(stop=True)  # the service exits now, not at lease expiry

    def stop(self) -> None:
        self.mark_lost("stopped by the run", code=0)
        try:
            self.launcher.ray.kill(self.actor, no_restart=True)
        except Exception:  # noqa: BLE001 - already gone
            pass


class RayLauncher:
    """Places services with Ray and keeps their leases renewed from a heartbeat thread."""

    remote = True

    def __init__(self, address: str, *, bridge_resources: Mapping[str, float],
                 policy_resources: Mapping[str, float], lease: float = 10.0, cwd: str | None = None,
                 python_path: list[str] | None = None) -> None:
        host = check_reachable(address)
        if host is not None and is_loopback(host):
            # A cluster on this host's loopback: without this, ray.init dials the machine's external
            # address and hangs.
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        try:
            import ray
        except ImportError:
            raise LaunchError("--hud-ray needs Ray: pip install 'pytest-hud[ray]'") from None
        self.ray = ray
        self.address = address
        self.resources = {"bridge": dict(bridge_resources), "policy": dict(policy_resources)}
        self.lease = float(lease)
        self.cwd = cwd
        self.python_path = list(python_path or [])
        t0 = time.monotonic()
        try:
            if not ray.is_initialized():
                ray.init(address=address, namespace="pytest-hud", log_to_driver=False,
                         logging_level="ERROR")
        except Exception as exc:  # noqa: BLE001 - ConnectionError, ValueError, ...: all mean the same
            raise LaunchError(f"cannot join the Ray cluster at {address!r} (--hud-ray): {type(exc).__name__}: {exc}. "
                              "Start one with 'ray start --head' and pass its address, or 'auto'") from None
        self.connect_s = time.monotonic() - t0
        self._actor_cls = ray.remote(ServiceActor)
        self._services: list[RayService] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._heartbeat, name="hud-ray-lease", daemon=True)
        self._thread.start()

    def describe(self) -> str:
        nodes = [n for n in self.ray.nodes() if n.get("Alive")]
        return (f"bridges and policy servers placed on the Ray cluster at {self.address} ({len(nodes)} nodes; "
                f"bridge {self.resources['bridge']}, policy {self.resources['policy']})")

    def _check_fits(self, role: str, what: str) -> None:
        wanted = self.resources[role]
        nodes = [n for n in self.ray.nodes() if n.get("Alive")]
        if any(all(n.get("Resources", {}).get(k, 0.0) >= v for k, v in wanted.items() if v) for n in nodes):
            return
        have = "; ".join(f"{n.get('NodeManagerAddress')}: {json.dumps(n.get('Resources', {}))}" for n in nodes)
        option = "--hud-bridge-resources" if role == "bridge" else "--hud-policy-resources"
        raise LaunchError(
            f"{what}: no live node of the Ray cluster offers {json.dumps(wanted)} ({option}); "
            f"nodes: {have or 'none'}. Start a node with those resources "
            f"(ray start --address=... --resources='{{\"sim\": 4}}') or change {option}")

    def launch(self, cmd: list[str], what: str, *, role: str, env: Mapping[str, str], timeout: float,
               files: Mapping[str, str] | None = None) -> RayService:
        ray = self.ray
        self._check_fits(role, what)
        options = actor_options(self.resources[role])
        actor = self._actor_cls.options(**options).remote()
        paths = [p for p in self.python_path if p] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env = dict(env, PYTHONPATH=os.pathsep.join(dict.fromkeys(paths)))
        ref = actor.start.remote(list(cmd), env, dict(files or {}), timeout, self.lease, self.cwd)
        try:
            # Placement waits for free resources (another bridge may be leaving): allow a margin.
            announce = ray.get(ref, timeout=timeout + 30.0)
        except ray.exceptions.GetTimeoutError:
            ray.kill(actor, no_restart=True)
            raise LaunchError(f"{what} was not placed within {timeout + 30:.0f} s: the Ray cluster has no free "
                              f"{json.dumps(self.resources[role])}; free some or add a node") from None
        except ray.exceptions.RayTaskError as exc:
            ray.kill(actor, no_restart=True)
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            raise LaunchError(f"{what} {cause}") from None
        except ray.exceptions.RayActorError as exc:
            raise LaunchError(f"{what}: its Ray actor died while starting it: {exc}") from None
        try:
            holder = LeaseHolder(announce["host"], int(announce["lease"]), env["PYTEST_HUD_SECRET"])
        except (KeyError, LeaseLost) as exc:
            ray.kill(actor, no_restart=True)
            raise LaunchError(f"{what} on node {announce.get('host')}: cannot hold its lease: {exc}") from None
        service = RayService(self, actor, announce, holder)
        with self._lock:
            self._services.append(service)
        return service

    def check(self, service: RayService) -> None:
        """Mark ``service`` lost if its process exited or its actor died (its node left)."""
        if service.code is not None:
            return
        ready, _ = self.ray.wait([service.watch_ref], timeout=0)
        if not ready:
            return
        try:
            code = self.ray.get(service.watch_ref)
            service.mark_lost(f"exited with code {code} on node {service.announce.get('host')}", code=code or -1)
        except Exception as exc:  # noqa: BLE001 - RayActorError and friends: the node or actor died
            service.mark_lost(f"its Ray actor on node {service.announce.get('host')} died "
                              f"({type(exc).__name__})")

    def _heartbeat(self) -> None:
        period = max(0.05, self.lease / 4)
        while not self._stop.wait(period):
            with self._lock:
                services = [s for s in self._services if s.code is None]
            for service in services:
                try:
                    self.check(service)
                except Exception:  # noqa: BLE001 - the driver is shutting down
                    pass
                holder = service.holder
                if holder is None or service.code is not None:
                    continue
                try:
                    holder.renew()
                except LeaseLost as exc:
                    service.mark_lost(str(exc))

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        with self._lock:
            services = list(self._services)
        for service in services:
            service.stop()
        self._thread.join(timeout)
        try:
            self.ray.shutdown()
        except Exception:  # noqa: BLE001
            pass
