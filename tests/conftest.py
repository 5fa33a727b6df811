"""Shared helpers for pytest-hud's own tests: real bridge subprocesses on loopback."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_hud.client.bridge import BridgeAddress

# pytester's fixture restores ``sys.modules`` after each test that uses it, dropping every module
# first imported during that test. LeRobot's dataset code imports pandas' arrow extension types
# lazily (on its first parquet write or read), and that import registers ``pandas.period`` with
# pyarrow, whose registry lives in the (never unloaded) C++ library. A pytester test that loaded a
# dataset therefore left pandas forgotten, and the next dataset written in that worker re-imported
# the module and failed with ``ArrowKeyError: A type extension with name pandas.period already
# defined``: a failure that came and went with xdist's test order. Imported here, before any test,
# the module is in every snapshot and never re-executed. (Not a tests/e2e/lerobot/conftest.py: two
# conftest modules outside packages would share the module name ``conftest``.)
if importlib.util.find_spec("pyarrow") is not None and importlib.util.find_spec("pandas") is not None:
    try:
        import pandas.core.arrays.arrow.extension_types  # noqa: F401
    except ImportError:  # a pandas laid out otherwise
        pass

HERE = Path(__file__).parent
SIMKIT = HERE / "simkit.py"


def launch(cmd: list[str], tmp_path: Path, what: str, timeout: float = 60.0, **popen) -> tuple[subprocess.Popen, Path]:
    """Start a child that writes an announce file (its last argument pair); wait for the file."""
    announce = Path(cmd[cmd.index("--announce") + 1])
    log_path = tmp_path / f"{announce.stem}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log, start_new_session=True, **popen)
    deadline = time.monotonic() + timeout
    while not announce.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited: {log_path.read_text()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"{what} did not announce itself")
        time.sleep(0.02)
    return proc, announce


def start_bridge(tmp_path: Path, target: str, width: int, *extra: str, timeout: float = 60.0):
    """Start ``python -m pytest_hud.bridge`` and wait for its announce file; returns (process, address)."""
    announce = tmp_path / f"bridge-{time.monotonic_ns()}.json"
    proc, _ = launch([sys.executable, "-m", "pytest_hud.bridge", target, "--width", str(width), *extra,
                      "--announce", str(announce)], tmp_path, "bridge", timeout,
                     env=dict(os.environ, SDL_VIDEODRIVER="dummy"))
    return proc, BridgeAddress.from_announce(announce)


def run_threads(targets, timeout: float = 30.0) -> list[BaseException]:
    """Run callables concurrently (released together); returns the exceptions they raised."""
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(targets))

    def wrap(fn):
        def go():
            try:
                barrier.wait(10)
                fn()
            except BaseException as exc:  # noqa: BLE001 - reported to the caller
                errors.append(exc)
        return go

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a thread hung"
    return errors


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
        stop(proc)


def standbys(timeout: float = 10.0) -> list[psutil.Process]:
    """The standby interpreters this process started. A child just forked shows its parent's command
    line until it execs, so an empty answer is looked at again, up to ``timeout`` seconds."""
    import psutil

    deadline = time.monotonic() + timeout
    while True:
        found = []
        for p in psutil.Process().children(recursive=True):
            try:
                if "pytest_hud.launch.standby" in " ".join(p.cmdline()):
                    found.append(p)
            except psutil.NoSuchProcess:
                pass
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def stop(proc: subprocess.Popen) -> None:
    """Terminate a test's child process, killing it if it does not exit within 5 s."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def first_obs(address, seed, slot=None):
    """The first observation a claim with ``seed`` gets from the bridge at ``address`` (the slot released after)."""
    import numpy as np

    from pytest_hud.client.bridge import ControlClient, SlotClient

    with ControlClient(address) as control:
        claim = control.claim(seed=seed)
        if slot is not None:
            assert claim.slot == slot
        with SlotClient(address, claim.token) as ws:
            obs = np.array(ws.first_observation["state"])
        control.release(claim.token)
    return obs
