"""Shared by the policy-server benchmarks: a server subprocess on a free port, and its ``/stats``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def start_policy_server(policy: str, extra: list[str], env: dict[str, str], workdir: Path,
                        cwd: Path | None = None, timeout: float = 180.0) -> tuple[subprocess.Popen, str]:
    """``python -m pytest_hud.serving --policy POLICY --port 0 EXTRA``; (process, ws URL) once
    it has announced itself. Its output goes to a log, shown if it fails to start."""
    stem = workdir / f"policy-server-{time.monotonic_ns()}"
    announce, log = stem.with_suffix(".json"), stem.with_suffix(".log")
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "pytest_hud.serving", "--policy", policy, "--port", "0",
                                 "--announce", str(announce), *extra], cwd=cwd, env=env, stdout=out, stderr=out)
    deadline = time.monotonic() + timeout
    while not announce.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"the policy server did not start:\n{log.read_text()}")
        time.sleep(0.05)
    return proc, json.loads(announce.read_text())["url"]


def policy_server_stats(url: str) -> dict:
    """The server's ``GET /stats``."""
    with urllib.request.urlopen(url.replace("ws://", "http://") + "/stats", timeout=10) as response:
        return json.loads(response.read())
