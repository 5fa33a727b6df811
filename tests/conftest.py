"""Shared helpers for pytest-hud's own tests: real bridge subprocesses on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_hud.client import BridgeAddress

HERE = Path(__file__).parent
SIMKIT = HERE / "simkit.py"


def start_bridge(tmp_path: Path, target: str, width: int, *extra: str, timeout: float = 60.0):
    """Start ``python -m pytest_hud.sim`` and wait for its announce file; returns (process, address)."""
    announce = tmp_path / f"bridge-{time.monotonic_ns()}.json"
    log = open(tmp_path / f"{announce.stem}.log", "wb")
    env = dict(os.environ, SDL_VIDEODRIVER="dummy")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_hud.sim", target, "--width", str(width), "--announce", str(announce), *extra],
        stdout=log, stderr=log, env=env, start_new_session=True,
    )
    deadline = time.monotonic() + timeout
    while not announce.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"bridge exited: {(tmp_path / (announce.stem + '.log')).read_text()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("bridge did not announce itself")
        time.sleep(0.02)
    return proc, BridgeAddress.from_announce(announce)


@pytest.fixture
def bridge(tmp_path: Path) -> Iterator:
    """Factory fixture: ``bridge(target, width, *args) -> BridgeAddress``; every bridge is stopped after."""
    procs: list[subprocess.Popen] = []

    def make(target: str, width: int = 2, *extra: str) -> BridgeAddress:
        proc, address = start_bridge(tmp_path, target, width, *extra)
        procs.append(proc)
        make.processes = procs
        return address

    make.processes = procs
    yield make
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
