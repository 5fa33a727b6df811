"""pytest-hud's modules are imported as plain Python, not through pytest's assertion rewriter.

pytest rewrites every module of a plugin's distribution. Left so, each module the controller or a
worker imports later is parsed again (every run where bytecode is not written), often on a thread,
and on CPython 3.11.0-3.11.7 / 3.12.0-3.12.1 two parses at once can fail a run with
``SystemError: AST constructor recursion depth mismatch`` (CPython gh-106905).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[2]

CONFTEST = '''
import json, os, sys

def rewritten():
    return sorted(name for name, module in list(sys.modules.items())
                  if name.startswith("pytest_hud") and
                  type(getattr(module, "__loader__", None)).__name__ == "AssertionRewritingHook")

def pytest_sessionfinish(session):
    where = session.config.workerinput["workerid"] if hasattr(session.config, "workerinput") else "controller"
    with open(os.path.join(os.environ["PROBE_DIR"], where + ".json"), "w") as fh:
        loaded = sorted(m for m in sys.modules if m.startswith("pytest_hud"))
        json.dump({"rewritten": rewritten(), "loaded": loaded}, fh)
'''

TESTS = '''
import threading

def test_a_module_imported_on_a_thread():
    def load():
        import pytest_hud.stats.levels  # noqa: F401 - imported here for the first time
    thread = threading.Thread(target=load)
    thread.start()
    thread.join()
'''


def test_modules_imported_after_the_plugin_loads_are_not_rewritten(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_probe.py").write_text(TESTS)
    probes = tmp_path / "probes"
    probes.mkdir()
    # From the checkout's root, as CI and a source checkout run pytest: its egg-info is a
    # distribution with pytest-hud's entry point, the one pytest marks for rewriting.
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-n", "2",
                          "--hud-width=2", str(tmp_path / "test_probe.py")],
                         cwd=REPO, capture_output=True, text=True, timeout=150,
                         env={**os.environ, "PROBE_DIR": str(probes), "PYTHONDONTWRITEBYTECODE": "1"})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    found = {p.stem: json.loads(p.read_text()) for p in probes.glob("*.json")}
    assert set(found) == {"controller", "gw0", "gw1"}, found.keys()
    for where, probe in found.items():
        # pytest did mark the package here: the plugin's own module went through the rewriter
        # (it is imported before any hook of it runs), so the check below is not vacuous.
        assert "pytest_hud.plugin" in probe["rewritten"], (where, probe["rewritten"])
        late = {"pytest_hud.controller.hooks", "pytest_hud.worker.session", "pytest_hud.stats.levels"}
        assert late & set(probe["loaded"]), (where, probe["loaded"])
        assert not late & set(probe["rewritten"]), (where, probe["rewritten"])
        # only what the plugin's module imports at its own import is rewritten
        assert len(probe["rewritten"]) < 15, (where, probe["rewritten"])
