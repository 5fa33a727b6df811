"""The bridge's command line: ``python -m pytest_hud.bridge``, and its former name, which still works."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(120)


def run(module: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=90)


def test_the_bridge_names_its_own_command_in_its_usage():
    out = run("pytest_hud.bridge", "--help")
    assert out.returncode == 0 and out.stdout.startswith("usage: python -m pytest_hud.bridge ")
    assert "deprecated" not in out.stderr


def test_the_former_command_says_it_is_deprecated_and_runs_the_bridge_with_the_same_arguments():
    out = run("pytest_hud.sim", "NoSuchEnv-v0")
    assert out.returncode == 2
    first, *rest = out.stderr.splitlines()
    assert first == ("pytest-hud: `python -m pytest_hud.sim` is deprecated; "
                     "run `python -m pytest_hud.bridge` (same arguments)")
    assert "unknown sim target 'NoSuchEnv-v0'" in "\n".join(rest)  # the bridge's own check ran
