"""The pool's loopback JSON-RPC service: what workers call to get their bridge and policy server.

It answers on its own asyncio thread in the controller, authenticated with the run's secret, so
workers can ask for a bridge:

    bridge(target, build, worker) -> {"control", "ws", "secret", "pid", "width", "host"}
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from pytest_hud.controller.pool import PoolError, SimPool
from pytest_hud.wire.rpc import RpcError, RpcServer

__all__ = ["PoolService"]


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
                      replace_pid: int | None = None, python_path: list[str] = (),
                      refuse_inline: bool = False) -> dict[str, Any]:
        self.pool.add_python_path(python_path)
        try:
            address = await asyncio.get_running_loop().run_in_executor(
                None, self.pool.bridge_for, target, build, worker, replace_pid, refuse_inline
            )
        except PoolError as exc:
            raise RpcError(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - every failure reaches the worker as a message
            raise RpcError(f"{type(exc).__name__}: {exc}") from None
        return address.to_dict()

    async def _policy_server(self, conn: Any, spec: str, contract: dict | None = None,
                             worker: int = 0, python_path: list[str] = (),
                             rename: dict[str, str] | None = None) -> dict[str, Any]:
        self.pool.add_python_path(python_path)
        try:
            return await asyncio.get_running_loop().run_in_executor(
                None, self.pool.policy_server_for, spec, contract, worker, rename
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
