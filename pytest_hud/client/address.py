"""Where a bridge listens (:class:`BridgeAddress`) and the error a bridge's refusals become
(:class:`BridgeError`): what the controller, a worker that steps its sim itself and a script need
without the WebSocket stack or numpy (:mod:`.bridge` holds the clients)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["BridgeAddress", "BridgeError"]


class BridgeError(RuntimeError):
    """The bridge refused something, failed the slot, or went away. The message says which."""


@dataclass(frozen=True)
class BridgeAddress:
    """Where a bridge listens, and the secret its control channel wants."""

    control: int
    ws: int
    secret: str
    host: str = "127.0.0.1"
    pid: int | None = None
    width: int | None = None
    node: str | None = None  # the cluster node it runs on (Ray node id), when placed remotely
    ws_unix: str | None = None  # the slot WebSocket on a Unix socket, used when it is on this host
    #: set by the pool when a worker should run this bridge's sim itself: why (``--hud-inline``)
    inline: str | None = None
    #: ``inline`` because an earlier run found the sim camera-less: no bridge runs, the worker checks it
    inline_known: bool = False

    @property
    def ws_url(self) -> str:
        return f"ws://{self.host}:{self.ws}"

    @classmethod
    def from_announce(cls, path: str | os.PathLike[str]) -> BridgeAddress:
        """Read a bridge's announce file (``{"control", "ws", "pid", "width", "secret"}``)."""
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise BridgeError(f"announce file {str(path)!r} does not exist; is the bridge running?") from None
        except ValueError as exc:
            raise BridgeError(f"announce file {str(path)!r} is not JSON: {exc}") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BridgeAddress:
        try:
            return cls(
                control=int(data["control"]),
                ws=int(data["ws"]),
                secret=str(data["secret"]),
                host=str(data.get("host", "127.0.0.1")),
                pid=data.get("pid"),
                width=data.get("width"),
                node=data.get("node"),
                ws_unix=data.get("ws_unix"),
                inline=data.get("inline"),
                inline_known=bool(data.get("inline_known", False)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise BridgeError(f"announce data lacks {exc}; expected control, ws and secret") from None

    def to_dict(self) -> dict[str, Any]:
        return {"control": self.control, "ws": self.ws, "secret": self.secret, "host": self.host,
                "pid": self.pid, "width": self.width, "node": self.node, "ws_unix": self.ws_unix,
                "inline": self.inline, "inline_known": self.inline_known}
