"""Where a run's records go when no results file was asked for: a folder of its own under $TMPDIR.

The folder holds the process id of the controller that made it. A controller killed without a
chance to clean up (SIGKILL, the OOM killer) leaves its folder behind; the next run sweeps every
folder whose owner is gone, so such leftovers never pile up.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

PREFIX = "hud-records-"
OWNER = "owner.pid"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def sweep_orphans(root: Path) -> list[Path]:
    """Remove the record folders under ``root`` whose controller no longer runs; return them."""
    removed = []
    for folder in root.glob(PREFIX + "*"):
        try:
            if not folder.is_dir() or folder.stat().st_uid != os.getuid():
                continue
            pid = int((folder / OWNER).read_text().strip())
        except (OSError, ValueError):
            continue  # not ours, or being made right now: leave it
        if not _alive(pid):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


class RecordSpool:
    """A run's private folder for its records file, removed by :meth:`cleanup` (or by the next run)."""

    def __init__(self, root: str | None = None) -> None:
        base = Path(root or tempfile.gettempdir())
        sweep_orphans(base)
        self.folder = Path(tempfile.mkdtemp(prefix=PREFIX, dir=base))
        (self.folder / OWNER).write_text(str(os.getpid()))
        self.path = self.folder / "episodes.jsonl"

    def cleanup(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
