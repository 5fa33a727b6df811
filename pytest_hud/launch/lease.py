"""The lease: a bridge or policy server on another machine lives only while its controller says so.

A local child notices its parent's death (:func:`~pytest_hud.launch.announce.parent_alive`); a process
started on a cluster node cannot: its parent is a Ray actor, and when that node's raylet crashes the
actor and its children live on, re-parented to PID 1. So a remotely started service also holds a
lease. It listens on one more TCP port (announced as ``"lease"``); its controller connects, sends the
run's secret on the first line and then one line per heartbeat. The service ends itself when

- no line came for ``seconds`` (the controller hung, the network split, the controller stopped
  renewing because it gave this service up), or
- the authenticated connection closed (the controller exited or was killed: the kernel closes its
  sockets), or the controller sent ``stop``.

Before the controller's first connection the clock runs from the start, so a service whose
controller never arrives also goes. Wrong secrets are dropped without a reply.

    >>> lease = Lease("127.0.0.1", secret="s", seconds=10.0)   # in the service
    >>> lease.port, lease.expired()
    >>> holder = LeaseHolder("127.0.0.1", lease.port, "s")     # in the controller
    >>> holder.renew()
"""

from __future__ import annotations

import hmac
import socket
import threading
import time

__all__ = ["Lease", "LeaseHolder", "LeaseLost"]


class LeaseLost(ConnectionError):
    """The service behind a lease is gone (its connection closed or refused)."""


class Lease:
    """The service side: expires ``seconds`` after the last renewal, or at once when the holder leaves."""

    def __init__(self, host: str, secret: str, seconds: float, port: int = 0) -> None:
        if seconds <= 0:
            raise ValueError(f"a lease must last a positive number of seconds, got {seconds}")
        self.secret = secret.encode()
        self.seconds = float(seconds)
        self._last = time.monotonic()
        self._ended: str | None = None
        self._lock = threading.Lock()
        self._listener = socket.create_server((host, port))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, name="hud-lease", daemon=True).start()

    def expired(self) -> str | None:
        """Why the lease ended (a sentence), or None while it holds."""
        with self._lock:
            if self._ended is None and time.monotonic() - self._last > self.seconds:
                self._ended = f"no word from the controller for {self.seconds:g} s (lease expired)"
            return self._ended

    def _end(self, why: str) -> None:
        with self._lock:
            self._ended = self._ended or why

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="hud-lease-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(self.seconds)
            reader = conn.makefile("rb")
            try:
                first = reader.readline(256).rstrip(b"\n")
            except OSError:
                return
            if not hmac.compare_digest(first, self.secret):
                return  # not our controller: no effect on the lease
            self._renew()
            while True:
                try:
                    line = reader.readline(64)
                except OSError:  # silence: expired() decides
                    return
                if not line:
                    self._end("the controller closed the lease connection (it exited or gave this service up)")
                    return
                if line.strip() == b"stop":
                    self._end("the controller asked this service to stop")
                    return
                self._renew()

    def _renew(self) -> None:
        with self._lock:
            self._last = time.monotonic()

    def close(self) -> None:
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (close alone does not)
        except OSError:
            pass
        self._listener.close()


class LeaseHolder:
    """The controller side of one lease: :meth:`renew` every heartbeat, :meth:`close` to give it up."""

    def __init__(self, host: str, port: int, secret: str, timeout: float = 5.0) -> None:
        try:
            self._sock = socket.create_connection((host, port), timeout=timeout)
            self._sock.sendall(secret.encode() + b"\n")
        except OSError as exc:
            raise LeaseLost(f"cannot reach the lease at {host}:{port}: {exc}") from None
        self._lock = threading.Lock()

    def renew(self) -> None:
        with self._lock:
            try:
                self._sock.sendall(b".\n")
            except OSError as exc:
                raise LeaseLost(f"the lease connection broke: {exc}") from None

    def close(self, stop: bool = True) -> None:
        with self._lock:
            try:
                if stop:
                    self._sock.sendall(b"stop\n")
            except OSError:
                pass
            self._sock.close()
