"""The plugin stays out of runs that don't use it, touches nothing before its inputs are valid, and
reports every episode it runs (one per test, inside the test)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_plugin import POLICIES, SIMS

pytestmark = pytest.mark.timeout(240)

REPO = Path(__file__).resolve().parents[2]

# Probes run inside the pytest runs under test: they write what the process holds to a file.
PROBE = '''
import json, os, threading
import psutil

def snapshot(where):
    me = psutil.Process()
    listening = [c.laddr.port for c in me.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    children = [" ".join(p.cmdline()) for p in me.children(recursive=True)]
    import sys
    heavy = ("pytest_hud.controller.hooks", "pytest_hud.worker.session", "pytest_hud.client.bridge", "pytest_hud.controller.inputs", "numpy")
    return {"where": where, "threads": sorted(t.name for t in threading.enumerate()),
            "hud_modules": [m for m in heavy if m in sys.modules],
            "listening": listening, "hud_children": [c for c in children if "pytest_hud" in c],
            "sigterm": str(__import__("signal").getsignal(__import__("signal").SIGTERM))}

def dump(name, data):
    with open(os.path.join(os.environ["PROBE_DIR"], name), "w") as fh:
        json.dump(data, fh)
'''

PLAIN_CONFTEST = '''
import os
import pytest
from probe import dump, snapshot

@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call":
        dump(f"report-{item.name}.json", {"props": repr(report.user_properties),
                                          "hud_episode": hasattr(report, "hud_episode"),
                                          **snapshot("worker")})
    return report

def pytest_sessionfinish(session):
    if not hasattr(session.config, "workerinput"):
        dump("controller.json", snapshot("controller"))
'''

PLAIN_TESTS = '''
def test_one(record_property):
    record_property("pair", (1, 2))

def test_two():
    assert True
'''


def run(pytester: pytest.Pytester, *args: str, tmpdir: Path | None = None, **env: str) -> pytest.RunResult:
    """A pytest subprocess with its own TMPDIR (to see every temporary directory it makes)."""
    tmp = tmpdir or pytester.path / "tmp"
    tmp.mkdir(exist_ok=True)
    saved = {k: os.environ.get(k) for k in ("TMPDIR", *env)}
    os.environ.update(TMPDIR=str(tmp), **env)
    try:
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", *args, timeout=180)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["in-process", "xdist"])
def test_a_plain_project_sees_no_hud_thread_socket_child_or_property_rewrite(pytester, workers):
    pytester.makepyfile(probe=PROBE, conftest=PLAIN_CONFTEST, test_plain=PLAIN_TESTS)
    probes = pytester.path / "probes"
    probes.mkdir()
    result = run(pytester, *workers, PROBE_DIR=str(probes))
    result.assert_outcomes(passed=2)
    assert "pytest-hud summary" not in result.stdout.str() and "\nhud: " not in result.stdout.str()
    report = __import__("json").loads((probes / "report-test_one.json").read_text())
    assert report["props"] == "[('pair', (1, 2))]"  # untouched: not converted to builtin lists
    assert not report["hud_episode"]
    for snap in [report, __import__("json").loads((probes / "controller.json").read_text())]:
        assert not [t for t in snap["threads"] if "hud" in t], snap
        assert snap["listening"] == [], snap
        assert snap["hud_children"] == [], snap
        assert "interrupt" not in snap["sigterm"], snap  # no SIGTERM handler of ours
        assert snap["hud_modules"] == [], snap  # nor the imports of a run that uses pytest-hud
    assert list((pytester.path / "tmp").iterdir()) == []  # no pool or rendezvous directory


LAZY = '''
import pytest

@pytest.mark.hud(sim="sims:cartpole", policy="policies:balance")
@pytest.mark.parametrize("seed", range(4))
def test_balance(shared_sim, robot_agent, seed):
    assert robot_agent.run(shared_sim.episode(seed=seed)).success

def test_plain():
    assert True
'''


NO_AUTOLOAD = ["-p", "xdist.plugin", "-p", "pytest_hud.plugin", "-n", "2"]


@pytest.mark.parametrize("workers", [["-p", "no:xdist"], ["-n", "2"], NO_AUTOLOAD],
                         ids=["in-process", "xdist", "xdist-without-autoload"])
def test_a_project_without_hud_settings_activates_when_a_test_uses_the_fixtures(pytester, workers):
    """``xdist-without-autoload``: plugins named with -p under PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 (the
    way to skip a venv's other plugins) register under their module names, not "xdist"/"hud"."""
    pytester.makepyfile(sims=SIMS, policies=POLICIES, test_lazy=LAZY)
    env = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"} if workers is NO_AUTOLOAD else {}
    result = run(pytester, *workers, "-k", "balance or plain", **env)
    result.assert_outcomes(passed=5)
    result.stdout.fnmatch_lines(["hud: sim=(per test) width=* policy=(per test) (*",  # printed on activation
                                 "*pytest-hud summary*", "*test_lazy.py::test_balance*4*4*100.0%*",
                                 "coverage: 4/4 declared episodes reported*"])
    assert list((pytester.path / "tmp").iterdir()) == []  # the pool's and rendezvous' dirs are gone


def test_collect_only_on_the_evals_starts_nothing_and_writes_nothing(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp))
    proc = subprocess.run([sys.executable, "-m", "pytest", str(REPO / "evals"), "--collect-only", "-q",
                           "-p", "no:cacheprovider"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "test_cartpole.py::test_balance" in proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tmp"]  # no hud-results.jsonl
    assert list(tmp.iterdir()) == []  # no pool directory: no bridge was started


def _tree(root: Path) -> dict[Path, int]:
    """Every path under root with its mtime, less pytester's own (its runpytest-N dirs, stdout, stderr)
    and TMPDIR (pytest's capture makes and unlinks files there; it is checked to be empty instead)."""
    ours = lambda p: not ({"__pycache__", "stdout", "stderr", "tmp"} & set(p.parts) or any(  # noqa: E731
        part.startswith("runpytest") for part in p.parts))
    return {p: p.stat().st_mtime_ns for p in root.rglob("*") if ours(p.relative_to(root))}


@pytest.mark.parametrize("gate", ["missing.yaml", "typo.yaml"])
def test_a_usage_error_leaves_the_filesystem_exactly_as_it_was(pytester, gate):
    pytester.makepyfile(sims=SIMS, policies=POLICIES, test_lazy=LAZY)
    pytester.path.joinpath("typo.yaml").write_text("alpah: 0.05\n")
    previous = pytester.path / "r.jsonl"
    previous.write_text('{"record": "run", "schema": "pytest-hud/results/1"}\n')
    (pytester.path / "tmp").mkdir()
    before = _tree(pytester.path)
    result = run(pytester, "-p", "no:xdist", "--hud-results=r.jsonl", f"--hud-gate={gate}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--hud-gate*"])
    assert _tree(pytester.path) == before
    assert previous.read_text() == '{"record": "run", "schema": "pytest-hud/results/1"}\n'
    assert list((pytester.path / "tmp").iterdir()) == []


TWO_EPISODES = '''
import pytest

pytestmark = pytest.mark.hud(sim="sims:cartpole", policy="policies:balance")

def test_two(shared_sim, robot_agent):
    robot_agent.run(shared_sim.episode(seed=1))
    robot_agent.run(shared_sim.episode(seed=2))

@pytest.fixture
def warmed(shared_sim, robot_agent):
    robot_agent.run(shared_sim.episode(seed=3))

def test_after_fixture(warmed, shared_sim, robot_agent):
    assert robot_agent.run(shared_sim.episode(seed=4)).success

def test_one(shared_sim, robot_agent):
    assert robot_agent.run(shared_sim.episode(seed=5)).success
'''


def test_a_second_episode_or_one_outside_the_test_is_refused_never_dropped(pytester):
    pytester.makepyfile(sims=SIMS, policies=POLICIES, test_two=TWO_EPISODES)
    result = run(pytester, "-p", "no:xdist", "--hud-results=r.jsonl")
    result.assert_outcomes(passed=1, errors=2)
    result.stdout.fnmatch_lines([
        "*test_two.py::test_two already ran an episode (seed=1): one test is one episode*parametrize*",
        "*an episode was claimed outside a test function (in a fixture or a hook?)*",
    ])
    from pytest_hud.core.results import load_results

    records = {r.nodeid.split("::")[-1]: r for r in load_results(pytester.path / "r.jsonl").episodes}
    assert records["test_one"].outcome == "passed" and records["test_one"].seed == 5
    assert records["test_two"].outcome == "error" and "already ran an episode" in records["test_two"].error
    assert records["test_after_fixture"].outcome == "error"
