"""Where a run's results come from: package versions, the git revision, the policy's content hash."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from . import __version__

__all__ = ["git_revision", "provenance"]

_DISTRIBUTIONS = ("pytest-hud", "pytest", "pytest-xdist", "numpy", "gymnasium", "websockets", "msgpack",
                  "torch", "lerobot")


def provenance(settings: Any, root: Path, args: list[str]) -> dict[str, Any]:
    """The results file's provenance for a run with ``settings`` (a :class:`~pytest_hud.settings.HudSettings`)."""
    from .agent.model import policy_content_hash

    versions = {}
    for dist in _DISTRIBUTIONS:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    try:
        policy_hash = policy_content_hash(settings.policy) if settings.policy else None
    except Exception:  # noqa: BLE001 - provenance is best effort
        policy_hash = None
    return {
        "plugin_version": __version__,
        "policy": settings.policy,
        "policy_hash": policy_hash,
        "sim": settings.sim,
        "width": settings.slots,
        "workers": settings.workers,
        "python": sys.version.split()[0],
        "platform": sys.platform,
        "versions": versions,
        "git": git_revision(root),
        "options": settings.to_dict(),
        "args": list(args),
    }


def git_revision(root: Path) -> dict[str, Any] | None:
    """``{"revision", "dirty"}`` of the git checkout at ``root`` (None outside one)."""
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5)
        return {"revision": rev.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return None
