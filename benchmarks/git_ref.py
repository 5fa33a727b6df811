"""Shared by the before/after benchmarks: the ``pytest_hud`` package of a git ref, unpacked."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def extract_package(ref: str, into: Path) -> Path:
    """Unpack ``pytest_hud`` as it is at ``ref`` into ``into`` (put ``into`` on PYTHONPATH to run it)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "pytest_hud"], check=True,
                             capture_output=True).stdout
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into
