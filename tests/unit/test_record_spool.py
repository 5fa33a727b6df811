"""The private records folder of a run without --hud-results: removed at the end, swept when orphaned."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from pytest_hud.controller.spool import OWNER, PREFIX, RecordSpool, sweep_orphans

MAKE_AND_DIE = """
import os, signal, sys
from pytest_hud.controller.spool import RecordSpool
spool = RecordSpool(sys.argv[1])
spool.path.write_text('{"kind": "episode"}\\n')
print(spool.folder, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_controllers_folder_is_swept_by_the_next_run(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", MAKE_AND_DIE, str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == -signal.SIGKILL
    orphan = Path(done.stdout.strip())
    assert orphan.is_dir() and (orphan / "episodes.jsonl").exists()  # SIGKILL left it behind
    spool = RecordSpool(str(tmp_path))
    assert not orphan.exists()
    assert spool.folder.is_dir() and (spool.folder / OWNER).read_text() == str(os.getpid())
    spool.cleanup()
    assert not spool.folder.exists()


def test_live_owners_and_foreign_folders_are_left_alone(tmp_path: Path) -> None:
    live = RecordSpool(str(tmp_path))  # this process: alive
    half_made = tmp_path / (PREFIX + "half")  # no owner file yet: another run may be making it now
    half_made.mkdir()
    unrelated = tmp_path / "hud-results-elsewhere"
    unrelated.mkdir()
    (unrelated / OWNER).write_text("999999999")
    assert sweep_orphans(tmp_path) == []
    assert live.folder.is_dir() and half_made.is_dir() and unrelated.is_dir()
    live.cleanup()
