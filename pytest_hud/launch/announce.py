"""How child processes (bridges, policy servers) announce themselves and notice their parent died.

The announce file is a dedicated channel (sim libraries print on stdout): one JSON object, written
atomically with mode 0600 because it holds the run's secret.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["write_announce", "parent_alive"]


def write_announce(path: str | os.PathLike[str], payload: dict[str, Any]) -> None:
    """Write atomically with mode 0600 so a reader never sees a partial file or a leaked secret."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(payload, fh)
    os.replace(tmp, target)


def parent_alive(pid: int) -> bool:
    """False once ``pid`` (our parent) is gone: we were re-parented, or it no longer exists."""
    if os.getppid() != pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
