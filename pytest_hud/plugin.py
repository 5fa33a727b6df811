"""pytest-hud: every episode a test, one shared vectorized sim, success rates that CI can act on.

Roles (DESIGN §3):

- the **controller** (the xdist controller, or the only process under ``-n 0``) owns the sim pool
  and the results: :class:`HudController`, created in ``pytest_configure`` and stopped in
  ``pytest_unconfigure``;
- each **worker** (or the same process under ``-n 0``) runs episodes through a
  :class:`~pytest_hud.fixtures.HudSession` that asks the controller's pool for bridges.

Episodes reach the controller as ordinary test reports carrying a ``hud_episode`` dict of builtin
types; a crash, timeout or sim error is reported as an *error*, never as a failed episode.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from . import __version__
from .fixtures import EPISODES_KEY, HudSession, hud_settings, robot_agent, shared_sim  # noqa: F401
from .results import EpisodeRecord, ResultsWriter, aggregate, to_builtin

__all__ = ["HudController", "worker_session"]

CONTROLLER_KEY = pytest.StashKey["HudController"]()
SESSION_KEY = pytest.StashKey[HudSession]()
DESELECTED_KEY = pytest.StashKey[list]()
EPISODE_FIXTURES = frozenset({"shared_sim", "robot_agent"})

# name: (type, default, help)
OPTIONS: dict[str, tuple[type, Any, str]] = {
    "width": (int, None, "Slots per bridge (default: the number of xdist workers, 1 without xdist)"),
    "sim": (str, None, "Default sim target: a gymnasium id, 'module:factory' or 'path.py:factory'"),
    "policy": (str, None, "Policy: 'module:factory', a LeRobot checkpoint directory or a ws:// URL"),
    "results": (str, None, "Write the results file (JSON Lines, pytest-hud/results/1) here"),
    "sim_url": (str, None, "Attach to a bridge someone else started: the path of its announce file"),
    "boot_timeout": (float, 120.0, "Seconds a bridge may take to start"),
    "first_action_timeout": (float, 300.0, "Seconds for an episode's first action (model warm-up)"),
    "step_timeout": (float, 30.0, "Seconds for each later action"),
    "max_steps": (int, None, "Stop and grade an episode after this many steps"),
    "n_action_steps": (int, None, "Actions executed from each predicted chunk before re-planning"),
    "policy_server": (bool, False, "Serve the policy from one batched policy server per run (workers load no model)"),
    "vectorization": (str, "sync", "How bridges vectorize single envs: sync or async"),
    "baseline": (str, None, "Gate against this results file from an earlier run (the last good checkpoint)"),
    "gate": (str, None, "YAML gate file: alpha, max_drop, min_coverage, per-task min_success floors"),
    "alpha": (float, None, "Family-wise false-alarm rate of the gate across tasks (default 0.05)"),
    "max_drop": (float, None, "Tolerated drop in success rate; smaller drops never fail (default 0)"),
    "min_coverage": (float, None, "Fraction of declared episodes that must finish without error (default 0.9)"),
    "sequential": (bool, False, "Stop running a task's episodes once the gate has decided it (anytime-valid)"),
    "resume": (str, None, "Reuse finished episodes of this results file instead of running them again"),
    "video": (str, "failed", "MP4 videos of episodes with cameras: none, failed or all"),
    "video_dir": (str, None, "Directory for videos (default: hud-videos beside --html, --hud-html or --hud-results)"),
    "trace_dir": (str, None, "Write one trace file (.npz: actions, states, rewards, timings) per episode here"),
    "html": (str, None, "Write a standalone HTML summary page here (works without pytest-html)"),
    "progress_interval": (float, 10.0, "Seconds between live per-task progress lines (0 turns them off)"),
    "record": (str, None, "Record every graded episode into a LeRobot v3 dataset in this new directory"),
}


# ---------------------------------------------------------------- options
def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hud", "pytest-hud robot-policy evaluation")
    for name, (typ, default, help_) in OPTIONS.items():
        flag = "--hud-" + name.replace("_", "-")
        extra = f". Ini: hud_{name}" + (f" (default {default})" if default not in (None, False) else "")
        if typ is bool:
            group.addoption(flag, dest=f"hud_{name}", action="store_true", default=None, help=help_ + extra)
            parser.addini(f"hud_{name}", help_, type="bool", default=None)
        else:
            group.addoption(flag, dest=f"hud_{name}", default=None, type=typ, help=help_ + extra)
            parser.addini(f"hud_{name}", help_, default=None)


def get_option(config: pytest.Config, name: str) -> Any:
    """Command line, else ini, else the default; ini strings are converted to the option's type."""
    typ, default, _ = OPTIONS[name]
    value = config.getoption(f"hud_{name}", None)
    if value is None:
        value = config.getini(f"hud_{name}")
        if value in (None, "", []):
            return default
        if typ is bool:
            return bool(value)
        try:
            value = typ(value)
        except ValueError:
            raise pytest.UsageError(f"ini key hud_{name} = {value!r} is not a valid {typ.__name__}") from None
    return value


def _settings(config: pytest.Config) -> dict[str, Any]:
    settings = {name: get_option(config, name) for name in OPTIONS}
    # --hud-policy on the command line beats the marker: evaluate another checkpoint on a suite as-is.
    settings["policy_cli"] = config.getoption("hud_policy", None)
    return settings


def _num_workers(config: pytest.Config) -> int:
    if config.pluginmanager.hasplugin("xdist") and getattr(config.option, "dist", "no") != "no":
        return max(1, len(getattr(config.option, "tx", None) or []) or int(config.option.numprocesses or 1))
    return 1


def _validate(config: pytest.Config, settings: dict[str, Any]) -> RunInputs:
    """Check every setting and load every input file; raises ``pytest.UsageError``. No side effects."""
    from .sim.target import TargetError, describe_target

    if settings["width"] is not None and settings["width"] < 1:
        raise pytest.UsageError(f"--hud-width must be at least 1, got {settings['width']}")
    for key in ("boot_timeout", "first_action_timeout", "step_timeout"):
        if settings[key] is not None and settings[key] <= 0:
            raise pytest.UsageError(f"--hud-{key.replace('_', '-')} must be positive, got {settings[key]}")
    if settings["max_steps"] is not None and settings["max_steps"] < 1:
        raise pytest.UsageError(f"--hud-max-steps must be at least 1, got {settings['max_steps']}")
    if settings["video"] not in ("none", "failed", "all"):
        raise pytest.UsageError(f"--hud-video must be none, failed or all, got {settings['video']!r}")
    if settings["video"] != "none":
        from .report.video import video_available

        if not video_available():
            explicit = config.getoption("hud_video", None) or config.getini("hud_video")
            if explicit:
                raise pytest.UsageError(
                    f"--hud-video {settings['video']} needs PyAV: pip install 'pytest-hud[video]' "
                    "(or pass --hud-video none)")
            settings["video"] = "none"  # the default asks for videos only where they can be made
    if settings["record"]:
        from .record import check_record_dir, recording_available

        if not recording_available():
            raise pytest.UsageError("--hud-record writes LeRobot datasets: pip install 'pytest-hud[lerobot]'")
        settings["record"] = str((config.invocation_params.dir / settings["record"]).resolve())
        try:
            check_record_dir(settings["record"])
        except FileExistsError as exc:
            raise pytest.UsageError(f"--hud-record: {exc}") from None
    if settings["vectorization"] not in ("sync", "async"):
        raise pytest.UsageError(f"--hud-vectorization must be sync or async, got {settings['vectorization']!r}")
    if settings["sim"]:
        try:
            describe_target(settings["sim"])
        except (TargetError, ImportError) as exc:
            raise pytest.UsageError(f"--hud-sim: {exc}") from None
    if settings["policy"]:
        from .agent.model import PolicyError, policy_kind

        try:
            policy_kind(settings["policy"])
        except PolicyError as exc:
            raise pytest.UsageError(f"--hud-policy: {exc}") from None
    if settings["sim_url"] and not Path(settings["sim_url"]).is_file():
        raise pytest.UsageError(
            f"--hud-sim-url {settings['sim_url']!r}: no such announce file; start a bridge with "
            "`python -m pytest_hud.sim TARGET --width N --announce PATH` and pass that PATH"
        )
    _resolve_artefact_dirs(config, settings)
    return _load_inputs(config, settings)


def _resolve_artefact_dirs(config: pytest.Config, settings: dict[str, Any]) -> dict[str, Any]:
    """Absolute paths for workers (they may run elsewhere in the tree): videos go beside the report."""
    here = config.invocation_params.dir
    s = settings
    if s["video"] != "none" and not s["video_dir"]:
        anchor = (getattr(config.option, "htmlpath", None) or s["html"] or s["results"])
        base = (here / anchor).parent if anchor else here
        s["video_dir"] = str(base / "hud-videos")
    for key in ("video_dir", "trace_dir", "html"):
        if s[key]:
            s[key] = str((here / s[key]).resolve())
    return s


class RunInputs:
    """Everything a run reads before it writes: the gate's settings, the baseline, resumable episodes.

    Loaded completely during validation, so a results file that is also the baseline (or the resume
    file) is read before the run truncates or appends to it, and a bad input fails before any file,
    thread, port or temporary directory exists.
    """

    def __init__(self, gate_config: Any, baseline: Any, resumable: dict[tuple[str, str], EpisodeRecord]) -> None:
        self.gate_config = gate_config
        self.baseline = baseline
        self.resumable = resumable


def _load_inputs(config: pytest.Config, settings: dict[str, Any]) -> RunInputs:
    from .results import load_results

    loaded = {}
    for key in ("baseline", "resume"):
        if settings[key]:
            try:
                loaded[key] = load_results(settings[key])
            except ValueError as exc:
                raise pytest.UsageError(f"--hud-{key}: {exc}") from None
    resumable = {}
    if "resume" in loaded:  # finished episodes (passed or failed; errors run again) by (task, episode)
        resumable = {(r.task, str(r.episode)): r for r in loaded["resume"].latest_episodes()
                     if r.outcome in ("passed", "failed")}
    return RunInputs(_gate_config(config, settings), loaded.get("baseline"), resumable)


# ------------------------------------------------------------- lifecycle
# The plugin stays out of runs that don't use it (as junitxml does without --junitxml): the
# controller, its pool service, its threads and every runtest hook exist only once the run uses
# pytest-hud, that is when a hud option or ini key is set (decided here), or else when a collected
# test uses ``shared_sim``/``robot_agent`` or the ``hud`` marker (decided after collection).
@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "hud(sim=None, policy=None, max_steps=None, build=None, min_success=None): "
        "per-test pytest-hud settings (closest marker wins)",
    )
    if hasattr(config, "workerinput"):
        hud = config.workerinput.get("hud")
        if hud and hud.get("pool_port"):
            _start_worker(config, hud)
        elif hud:
            config.pluginmanager.register(LazyWorker(config, hud), "hud-lazy")
        return
    settings = _settings(config)
    inputs = _validate(config, settings)
    if _explicitly_used(config):
        _activate(config, settings, inputs)
    elif _distributed(config):
        config.pluginmanager.register(LazyXdist(config, settings, inputs), "hud-lazy")
    else:
        config.pluginmanager.register(LazyLocal(config, settings, inputs), "hud-lazy")


def _explicitly_used(config: pytest.Config) -> bool:
    """A hud option on the command line or a hud ini key in the config file."""
    for name in OPTIONS:
        if config.getoption(f"hud_{name}", None) is not None:
            return True
        if config.getini(f"hud_{name}") not in (None, "", []):
            return True
    return False


def _uses_hud(items: list[pytest.Item]) -> bool:
    return any(is_episode_item(item) or item.get_closest_marker("hud") is not None for item in items)


def _activate(config: pytest.Config, settings: dict[str, Any], inputs: RunInputs,
              xdist_hooks: bool = True, secret: str | None = None) -> HudController:
    """Create the controller (and, without xdist, this process's worker session); register hooks."""
    controller = HudController(config, settings, inputs, secret=secret)
    config.stash[CONTROLLER_KEY] = controller
    config.pluginmanager.register(controller, "hud-controller")
    config.pluginmanager.register(JunitErrors(config), "hud-junit-errors")
    if xdist_hooks and config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(XdistHooks(controller), "hud-xdist")
    if config.pluginmanager.hasplugin("html") and getattr(config.option, "htmlpath", None):
        from .report.pytest_html import HtmlReportHooks

        config.pluginmanager.register(HtmlReportHooks(config, controller.html_summary), "hud-html")
    if not _distributed(config):
        _start_worker(config, controller.workerinput(), worker=0)
    return controller


def _start_worker(config: pytest.Config, hud: dict[str, Any], worker: int | None = None) -> HudSession:
    if worker is None:
        worker = int(str(config.workerinput.get("workerid", "gw0")).lstrip("gw") or 0)
    session = HudSession(hud.get("pool_host"), hud.get("pool_port"), hud["secret"], worker, hud["settings"],
                         rendezvous=hud.get("rendezvous"))
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(WorkerHooks(config, session), "hud-worker")
    return session


def _distributed(config: pytest.Config) -> bool:
    return config.pluginmanager.hasplugin("xdist") and getattr(config.option, "dist", "no") != "no"


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is not None:
        session.close()
        del config.stash[SESSION_KEY]
    controller = config.stash.get(CONTROLLER_KEY, None)
    if controller is not None:
        controller.stop()
        config.pluginmanager.unregister(controller)
        del config.stash[CONTROLLER_KEY]
    lazy = config.pluginmanager.get_plugin("hud-lazy")
    if isinstance(lazy, LazyXdist):
        lazy.close()


def worker_session(config: pytest.Config) -> HudSession | None:
    """The :class:`HudSession` of this process (None on an xdist controller or when inactive)."""
    return config.stash.get(SESSION_KEY, None)


def _note_deselected(config: pytest.Config, items: list[pytest.Item]) -> None:
    config.stash.setdefault(DESELECTED_KEY, []).extend(i for i in items if is_episode_item(i))


class LazyLocal:
    """Without xdist and without hud settings: activate after collection if a test uses pytest-hud."""

    def __init__(self, config: pytest.Config, settings: dict[str, Any], inputs: RunInputs) -> None:
        self.config, self.settings, self.inputs = config, settings, inputs

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        _note_deselected(self.config, items)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if _uses_hud(session.items) and self.config.stash.get(CONTROLLER_KEY, None) is None:
            _activate(self.config, self.settings, self.inputs)
            declare_episodes(session, worker_session(self.config))


class LazyXdist:
    """On an xdist controller without hud settings: start the controller when a worker asks.

    Workers get a rendezvous path instead of the pool's address. A worker that collects a test
    using pytest-hud leaves a ``want`` file there before xdist reports its collection; on that
    report the controller starts and writes the pool's address there (0600, atomically). Until
    then nothing exists: no directory, no thread, no port.
    """

    def __init__(self, config: pytest.Config, settings: dict[str, Any], inputs: RunInputs) -> None:
        import tempfile

        self.config, self.settings, self.inputs = config, settings, inputs
        self.secret = secrets.token_hex(16)
        self.rendezvous = Path(tempfile.gettempdir()) / f"pytest-hud-rendezvous-{secrets.token_hex(8)}"
        self.controller: HudController | None = None

    def pytest_configure_node(self, node: Any) -> None:
        if self.controller is not None:  # a replacement worker after activation
            node.workerinput["hud"] = self.controller.workerinput()
        else:
            node.workerinput["hud"] = {"secret": self.secret, "rendezvous": str(self.rendezvous),
                                       "settings": worker_settings(self.config, self.settings)}

    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        if self.controller is not None or not _trusted_dir(self.rendezvous):
            return
        if not any(p.name.startswith("want-") for p in self.rendezvous.iterdir()):
            return
        self.controller = _activate(self.config, self.settings, self.inputs, xdist_hooks=False,
                                    secret=self.secret)
        tmp = self.rendezvous / "pool.json.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump({"host": self.controller.service_host, "port": self.controller.service.port}, fh)
        os.replace(tmp, self.rendezvous / "pool.json")

    def close(self) -> None:
        import shutil

        shutil.rmtree(self.rendezvous, ignore_errors=True)


class LazyWorker:
    """On an xdist worker of a lazily activated run: ask the controller for pytest-hud if needed."""

    def __init__(self, config: pytest.Config, hud: dict[str, Any]) -> None:
        self.config, self.hud = config, hud

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        _note_deselected(self.config, items)

    @pytest.hookimpl(tryfirst=True)  # before xdist tells the controller that collection finished
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if not _uses_hud(session.items):
            return
        rendezvous = Path(self.hud["rendezvous"])
        rendezvous.mkdir(mode=0o700, exist_ok=True)
        worker = str(self.config.workerinput.get("workerid", "gw0"))
        (rendezvous / f"want-{worker}").touch(0o600)
        hud = _start_worker(self.config, self.hud)
        # The pool's address appears once the controller has seen this collection: declare later,
        # with the first call to the pool (declaring now would wait for an answer not yet possible).
        hud.pending_declare = declaration(session, hud)


def _trusted_dir(path: Path) -> bool:
    """An existing directory of ours that nobody else can write to."""
    try:
        st = path.stat()
    except OSError:
        return False
    return path.is_dir() and st.st_uid == os.getuid() and not st.st_mode & 0o077


def worker_settings(config: pytest.Config, settings: dict[str, Any]) -> dict[str, Any]:
    """The settings every worker gets (builtin types: they cross the xdist channel)."""
    workers = _num_workers(config)
    return dict(settings, width=settings["width"] or workers,
                distributed=_distributed(config))


# ---------------------------------------------------------- worker side
def is_episode_item(item: pytest.Item) -> bool:
    return bool(EPISODE_FIXTURES & set(getattr(item, "fixturenames", ())))


def episode_identity(item: pytest.Item) -> dict[str, Any]:
    """Task (test function + non-episode parameters), episode id and seed of a test item."""
    callspec = getattr(item, "callspec", None)
    params = dict(callspec.params) if callspec is not None else {}
    key = "episode" if "episode" in params else "seed" if "seed" in params else None
    base = item.nodeid.split("[", 1)[0]
    others = {k: v for k, v in params.items() if k != key}
    task = base + (f"[{','.join(f'{k}={_short(v)}' for k, v in sorted(others.items()))}]" if others else "")
    if key is not None:
        episode = str(params[key])
    else:
        episode = callspec.id if callspec is not None else "0"
    seed = params.get("seed")
    seed = int(seed) if isinstance(seed, int) or (hasattr(seed, "__index__") and not isinstance(seed, bool)) else None
    return {"task": task, "episode": episode, "seed": seed, "nodeid": item.nodeid}


def _short(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 40 else text[:37] + "..."


def declaration(session: pytest.Session, hud: HudSession) -> dict[str, Any] | None:
    """This run's episodes (after -k/-m deselection) and the deselected tasks, for the controller."""
    if session.config.option.collectonly:
        return None  # nothing will run: declare nothing, so nothing is written
    declared = []
    for item in session.items:
        if is_episode_item(item):
            ident = episode_identity(item)
            floor = hud_settings(item).get("min_success")
            if floor is not None:
                ident["min_success"] = float(floor)
            declared.append(ident)
    deselected = sorted({episode_identity(i)["task"] for i in session.config.stash.get(DESELECTED_KEY, [])})
    if not declared and not deselected:
        return None
    return {"episodes": declared, "worker": hud.worker, "deselected": deselected}


def declare_episodes(session: pytest.Session, hud: HudSession | None) -> None:
    """Declare this run's episodes so coverage has a true denominator."""
    if hud is None:
        return
    data = declaration(session, hud)
    if data is not None:
        hud.pool_call("declare", **data)


def run_identity(item: pytest.Item, hud: HudSession) -> dict[str, Any]:
    """What an episode's result depends on besides its seed: resume reuses only exact matches."""
    from .agent.model import policy_content_hash

    marks = hud_settings(item)
    policy = hud.settings.get("policy_cli") or marks.get("policy") or hud.settings.get("policy")
    cache = hud.policy_hashes
    if policy not in cache:
        try:
            cache[policy] = policy_content_hash(policy) if policy else None
        except Exception:  # noqa: BLE001 - an unhashable policy is simply never reused
            cache[policy] = None
    return {"plugin_version": __version__, "policy": policy, "policy_hash": cache[policy],
            "sim": marks.get("sim") or hud.settings.get("sim"), "build": marks.get("build") or {},
            "max_steps": marks.get("max_steps", hud.settings.get("max_steps"))}


class WorkerHooks:
    """The runtest hooks of a process that runs episodes (an xdist worker, or the only process)."""

    def __init__(self, config: pytest.Config, hud: HudSession) -> None:
        self.config, self.hud = config, hud

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        _note_deselected(self.config, items)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        declare_episodes(session, self.hud)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        hud = self.hud
        if is_episode_item(item) and hud.settings.get("resume"):
            ident = episode_identity(item)
            record = hud.pool_call("resume_lookup", task=ident["task"], episode=ident["episode"],
                                   identity=run_identity(item, hud))
            if record:
                _replay(item, record)
                return True  # reported from the earlier run: pytest's own protocol does not run it
        return None

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """On workers: finish videos and dataset parts before xdist tells the controller we are done."""
        if hasattr(session.config, "workerinput"):
            self.hud.close_recorders()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item):
        # Episodes belong to the test whose call phase runs them; outside it they are refused.
        if is_episode_item(item):
            ident = episode_identity(item)
            self.hud.label_recorders(ident["task"], ident["episode"])
        self.hud.current_item = item
        try:
            return (yield)
        finally:
            self.hud.current_item = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        hud = self.hud
        if not hud.settings.get("sequential") or not is_episode_item(item):
            return
        task = episode_identity(item)["task"]
        decision = hud.pool_call("sequential", task=task)
        if decision and decision != "undecided":
            pytest.skip(f"sequential gate already decided {task}: {decision}")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        # Users may record numpy scalars: make every property crossable by the xdist channel.
        report.user_properties = [(str(k), to_builtin(v)) for k, v in report.user_properties]
        hud = self.hud
        if not is_episode_item(item):
            return report
        if report.when == "call" or (report.when == "setup" and not report.passed):
            artefacts = hud.flush_recorders() if report.when == "call" else {}
            record = _episode_record(item, call, report, hud)
            if artefacts and not record.get("artefacts"):
                record["artefacts"] = artefacts  # an errored episode has no result to carry them
            report.hud_episode = record
            props = ("task", "episode", "seed", "outcome", "success", "score", "total_reward", "steps",
                     "duration_s", "slot")
            props = [(k, record[k]) for k in props if record.get(k) is not None]
            report.user_properties.extend(props)
            item.user_properties.extend(props)  # JUnit XML reads properties from the teardown report
        return report

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report: pytest.TestReport, config: pytest.Config):
        return episode_teststatus(report)


def _replay(item: pytest.Item, record: dict[str, Any]) -> None:
    """Report a reused episode with its recorded outcome, without running it."""
    from _pytest.reports import TestReport

    ihook = item.ihook
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    record = dict(record, reused=True, nodeid=item.nodeid)
    for when in ("setup", "call", "teardown"):
        failed = when == "call" and record["outcome"] == "failed"
        report = TestReport(
            item.nodeid, item.location, {}, "failed" if failed else "passed",
            "reused from an earlier run (--hud-resume): the episode failed there" if failed else None,
            when, [], 0.0,
            user_properties=[("reused", True)] if when == "call" else [],
        )
        if when == "call":
            report.hud_episode = record
        ihook.pytest_runtest_logreport(report=report)
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)


def _is_failure(excinfo: Any) -> bool:
    """An assertion (or ``pytest.fail``) is a failed episode; anything else is an error."""
    return excinfo.errisinstance((AssertionError, pytest.fail.Exception))


def _is_episode_error(report: pytest.TestReport) -> bool:
    data = getattr(report, "hud_episode", None)
    return bool(data) and data.get("outcome") == "error" and report.failed


def episode_teststatus(report: pytest.TestReport):
    """A crash, timeout or sim error is an *error* (E), not a failed episode (F)."""
    if _is_episode_error(report) and report.when not in ("setup", "teardown"):  # call, or xdist's crash
        return "error", "E", "ERROR"
    return None


def _skip_reason(report: pytest.TestReport) -> str | None:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr or "")
    text = str(text).strip()
    return (text[len("Skipped: "):] if text.startswith("Skipped: ") else text)[:500] or None


def _episode_record(item: pytest.Item, call: pytest.CallInfo, report: pytest.TestReport,
                    hud: HudSession) -> dict[str, Any]:
    ident = episode_identity(item)
    episodes = item.stash.get(EPISODES_KEY, [])
    result = next((ep.result for ep in reversed(episodes) if ep.result is not None), None)
    grade = next((ep.grade_data for ep in reversed(episodes) if ep.grade_data is not None), None)
    # The bridge's own verdict (a timeout, a disconnect, a sim exception) makes it an error,
    # whatever the test asserted afterwards or whoever interrupted it.
    bridge_error = (result.error if result is not None else None) or (grade or {}).get("error")
    if report.skipped:
        outcome = "skipped"
    elif report.passed and not bridge_error:
        outcome = "passed"
    elif (call.excinfo is not None and report.when == "call" and _is_failure(call.excinfo)
          and not bridge_error and not str(call.excinfo.value).startswith("Timeout")):
        outcome = "failed"
    else:
        outcome = "error"
    error = None
    if outcome == "skipped":
        skip_reason = _skip_reason(report)
    else:
        skip_reason = None
    if outcome == "error":
        if bridge_error:
            error = str(bridge_error)[:2000]
        elif call.excinfo is not None:
            error = f"{call.excinfo.typename}: {call.excinfo.value}"[:2000]
    record: dict[str, Any] = {
        **ident,
        "identity": run_identity(item, hud),
        "outcome": outcome,
        "success": {"passed": True, "failed": False}.get(outcome),
        "worker": f"gw{hud.worker}" if hasattr(item.config, "workerinput") else "main",
        "duration_s": float(report.duration),
        "error": error,
        "skip_reason": skip_reason,
    }
    if result is not None:
        record.update(
            score=result.score, total_reward=result.total_reward, steps=result.steps,
            duration_s=result.duration_s, slot=result.slot, artefacts=dict(result.artefacts),
            extra={"env_success": result.success, "success_at_reset": result.success_at_reset,
                   "inference_s": result.inference_s, "terminated": result.terminated,
                   "truncated": result.truncated},
        )
        if ident["seed"] is None and result.seed is not None:
            record["seed"] = result.seed
    elif grade is not None:
        record.update(score=grade.get("score"), total_reward=grade.get("total_reward"),
                      steps=grade.get("steps"), slot=grade.get("slot"),
                      extra={"env_success": grade.get("success")})
    return to_builtin(record)


# ------------------------------------------------------------ controller
class HudController:
    """Controller-side state: the pool, declared episodes, records, the results file."""

    def __init__(self, config: pytest.Config, settings: dict[str, Any], inputs: RunInputs,
                 secret: str | None = None) -> None:
        from .client import BridgeAddress
        from .pool import BridgeSpec, PoolService, SimPool

        self.config = config
        self.settings = settings
        self.workers = _num_workers(config)
        self.width = settings["width"] or self.workers
        self.secret = secret or secrets.token_hex(16)
        self.run_id = secrets.token_hex(8)
        self.started = time.monotonic()
        self.declared: dict[str, dict[str, Any]] = {}
        self.deselected: set[str] = set()
        self.records: dict[str, EpisodeRecord] = {}
        self.gate_config = inputs.gate_config
        self.baseline = inputs.baseline
        self.baseline_successes: dict[str, dict[str, bool]] = {}  # task -> episode -> success
        if self.baseline is not None:
            from .gate import outcomes_from_results

            self.baseline_successes = {t: o.successes for t, o in outcomes_from_results(self.baseline).items()}
        self._resumable = inputs.resumable
        self.floors: dict[str, float] = {}
        self.verdicts: list[Any] | None = None
        self.other_failures = 0
        self._sequential_tests: dict[str, Any] = {}
        self._last_progress = time.monotonic()
        self.recording: dict[str, Any] | None = None

        # Everything above only read; from here on the run has side effects (all inputs are valid).
        self._lock = threading.Lock()
        rootdir = str(config.rootpath)
        invocation = str(config.invocation_params.dir)
        attach = BridgeAddress.from_announce(settings["sim_url"]) if settings["sim_url"] else None
        spec = BridgeSpec(
            width=self.width,
            boot_timeout=settings["boot_timeout"],
            first_action_timeout=settings["first_action_timeout"],
            step_timeout=settings["step_timeout"],
            vectorization=settings["vectorization"],
            cwd=invocation,
            python_path=[invocation, rootdir] + [p for p in sys.path if p and p.startswith(rootdir)],
        )
        self.pool = SimPool(self.secret, spec, workers=self.workers, attach=attach)
        self.service_host = "127.0.0.1"
        self.service = PoolService(self.pool, self.secret, self.service_host,
                                   extra_methods={"declare": self._declare, "sequential": self._sequential,
                                                  "resume_lookup": self._resume_lookup})
        self.provenance = self._provenance()
        self._old_sigterm = _sigterm_as_interrupt()
        self.results_path: Path | None = None
        if settings["results"]:
            path = Path(settings["results"])
            self.results_path = path if path.is_absolute() else config.invocation_params.dir / path
        self.writer: ResultsWriter | None = None  # opened with the first record: a run of nothing writes nothing

    # ------------------------------------------------------------ plumbing
    def _write(self) -> ResultsWriter | None:
        """The results file's writer, opened on first use (appending when resuming into the same file)."""
        if self.writer is None and self.results_path is not None:
            resume = self.settings["resume"]
            resuming_here = bool(resume) and Path(resume).resolve() == self.results_path.resolve()
            self.writer = ResultsWriter(self.results_path, self.provenance, self.run_id, append=resuming_here)
        return self.writer

    def html_summary(self):
        return self.tasks(), self.verdict_dicts(), self.coverage()

    def workerinput(self) -> dict[str, Any]:
        return {"pool_host": self.service_host, "pool_port": self.service.port, "secret": self.secret,
                "settings": worker_settings(self.config, self.settings)}

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report: pytest.TestReport, config: pytest.Config):
        return episode_teststatus(report)

    def _declare(self, episodes: list[dict[str, Any]], worker: int = 0, deselected: list[str] = ()) -> int:
        with self._lock:
            self.deselected.update(deselected)
            for ep in episodes:
                self.declared.setdefault(ep["nodeid"], ep)
                if ep.get("min_success") is not None:
                    self.floors[ep["task"]] = float(ep["min_success"])
            return len(self.declared)

    def _resume_lookup(self, task: str, episode: str, identity: dict[str, Any]) -> dict[str, Any] | None:
        record = self._resumable.get((task, str(episode)))
        if record is None or to_builtin(record.identity) != to_builtin(identity):
            return None
        return record.to_dict()

    # ------------------------------------------------------------ sequential
    def _sequential(self, task: str) -> str:
        with self._lock:
            test = self._sequential_tests.get(task)
            return test.decide() if test is not None else "undecided"

    def _feed_sequential(self, record: EpisodeRecord) -> None:
        """Paired, in declared order: each finished episode updates its task's anytime-valid test."""
        base = self.baseline_successes.get(record.task)
        if not self.settings["sequential"] or base is None or record.outcome == "skipped" or (record.reused and not self.settings["sequential"]):
            return
        test = self._sequential_tests.get(record.task)
        if test is None:
            from .stats import SequentialTest

            order = [d["episode"] for d in self.declared.values() if d["task"] == record.task and d["episode"] in base]
            tasks = {d["task"] for d in self.declared.values()} & set(self.baseline_successes)
            cfg = self.gate_config
            # Bonferroni across the compared tasks keeps the family-wise rate <= alpha.
            test = SequentialTest(alpha=cfg.alpha / max(1, len(tasks)), max_drop=cfg.max_drop,
                                  detect_drop=cfg.detect_drop, paired=True, order=order)
            self._sequential_tests[record.task] = test
        if record.episode in base:
            current = None if record.outcome == "error" else bool(record.success)
            test.record(record.episode, current, base[record.episode])

    def _provenance(self) -> dict[str, Any]:
        from importlib import metadata

        from .agent.model import policy_content_hash

        versions = {}
        for dist in ("pytest-hud", "pytest", "pytest-xdist", "numpy", "gymnasium", "websockets", "msgpack",
                     "torch", "lerobot"):
            try:
                versions[dist] = metadata.version(dist)
            except metadata.PackageNotFoundError:
                pass
        policy = self.settings["policy"]
        try:
            policy_hash = policy_content_hash(policy) if policy else None
        except Exception:  # noqa: BLE001 - provenance is best effort
            policy_hash = None
        return {
            "plugin_version": __version__,
            "policy": policy,
            "policy_hash": policy_hash,
            "sim": self.settings["sim"],
            "width": self.width,
            "workers": self.workers,
            "python": sys.version.split()[0],
            "platform": sys.platform,
            "versions": versions,
            "git": _git_revision(self.config.rootpath),
            "options": {k: v for k, v in self.settings.items()},
            "args": list(self.config.invocation_params.args),
        }

    # ------------------------------------------------------------- reports
    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        data = getattr(report, "hud_episode", None)
        if data:
            worker = getattr(getattr(report, "node", None), "gateway", None)
            record = EpisodeRecord.from_dict(data)
            if worker is not None:
                record.worker = worker.id
            self._add(record)
            return
        if report.failed and report.nodeid not in self.declared:
            self.other_failures += 1  # an ordinary test failed: the gate does not excuse that
        if report.failed and report.when not in ("setup", "call", "teardown"):
            # xdist's report for an item whose worker crashed mid-test ("???")
            ident = self.declared.get(report.nodeid)
            if ident is not None:
                message = str(report.longrepr).strip().splitlines()
                self._add(EpisodeRecord(
                    task=ident["task"], episode=ident["episode"], nodeid=report.nodeid, outcome="error",
                    seed=ident.get("seed"), error=(message[0] if message else "worker crashed")[:2000],
                ))
                report.hud_episode = self.records[report.nodeid].to_dict()  # counted as an error

    def _add(self, record: EpisodeRecord) -> None:
        if not record.reused:
            record.finished_at = time.time()
        with self._lock:
            self.records[record.nodeid] = record
            writer = self._write()
            if writer is not None:
                writer.episode(record)
            self._feed_sequential(record)
        self._progress()

    def _progress(self) -> None:
        """Every few seconds, one line with each task's running success rate (controller side)."""
        interval = self.settings["progress_interval"] or 0
        now = time.monotonic()
        if interval <= 0 or now - self._last_progress < interval:
            return
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        if tr is None:
            return
        self._last_progress = now
        declared = self.declared_by_task()
        parts = []
        for task, s in self.tasks().items():
            rate = "-" if s.success_rate is None else f"{100 * s.success_rate:.0f}%"
            done = s.n + s.errors + s.skipped
            parts.append(f"{task.rsplit('::', 1)[-1]} {rate} ({done}/{declared.get(task, done)}"
                         + (f", {s.errors} err" if s.errors else "") + ")")
        # Start a fresh line (under xdist the dots row has no file path, so write_line alone would
        # not) so pytest's own progress dots and percentages stay intact around ours.
        if getattr(tr._tw, "width_of_current_line", 0):
            tr._tw.line()
        tr.write_line("hud progress: " + "; ".join(parts), cyan=True)

    # ------------------------------------------------------------- summary
    def declared_by_task(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for ident in self.declared.values():
            counts[ident["task"]] = counts.get(ident["task"], 0) + 1
        return counts

    def tasks(self):
        return aggregate(self.records.values(), self.declared_by_task(), time.monotonic() - self.started)

    def coverage(self) -> dict[str, Any]:
        declared = set(self.declared)
        reported = set(self.records)
        missing = sorted(declared - reported)
        errors = [r for r in self.records.values() if r.outcome == "error"]
        return {
            "declared": len(declared),
            "reported": len(reported & declared) if declared else len(reported),
            "graded": sum(1 for r in self.records.values() if r.outcome in ("passed", "failed")),
            "errors": len(errors),
            "skipped": sum(1 for r in self.records.values() if r.outcome == "skipped"),
            "missing": missing,
        }

    @property
    def gated(self) -> bool:
        return bool(self.baseline is not None or self.settings["gate"] or self.floors)

    def evaluate_gate(self) -> list[Any] | None:
        """Verdicts per task (None when no baseline, gate file or floor is configured)."""
        if not self.gated:
            return None
        from dataclasses import replace

        from .gate import Verdict, evaluate_gate, outcomes_from_records, outcomes_from_results

        current = outcomes_from_records(self.records.values(), self.declared_by_task())
        base = None
        if self.baseline is not None:
            base = outcomes_from_results(self.baseline)
        floors = {**self.gate_config.floors, **self.floors}  # marker floors are exact task ids: they win
        verdicts = evaluate_gate(current, base, replace(self.gate_config, floors=floors),
                                 deselected=self.deselected - set(current))
        for i, v in enumerate(verdicts):
            test = self._sequential_tests.get(v.task)
            decision = test.decide() if test is not None else "undecided"
            if decision != "undecided" and v.verdict not in ("insufficient coverage", "skipped"):
                verdicts[i] = Verdict(
                    task=v.task, verdict="regression" if decision == "regression" else "pass",
                    test="sequential", current_rate=v.current_rate, baseline_rate=v.baseline_rate,
                    n_current=v.n_current, n_baseline=v.n_baseline, n_pairs=test.n_pairs,
                    discordant=(test.worse, test.better), drop=v.drop, floor=v.floor,
                    reason=f"sequential test decided after {test.n_pairs} paired episodes "
                           f"({test.worse} worse, {test.better} better)",
                    errors=v.errors, declared=v.declared, coverage=None,
                )
        return verdicts

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        from .gate import gate_passed

        if session.config.option.collectonly:
            return  # nothing ran: no verdicts, no files
        in_process = worker_session(self.config)
        if in_process is not None:
            in_process.close_recorders()  # -n 0: this process recorded; finish before merging
        if self.settings["record"]:
            self._merge_recording()
        self.verdicts = self.evaluate_gate()
        if self.verdicts is not None:
            passed = gate_passed(self.verdicts) and not self.other_failures
            if exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
                # Failed episodes are data: the gate, not single episodes, decides the run.
                session.exitstatus = pytest.ExitCode.OK if passed else pytest.ExitCode.TESTS_FAILED
            self._junit_gate_cases()
        gate = [v.to_dict() for v in self.verdicts] if self.verdicts is not None else None
        if self.records or self.declared:
            self._step_summary()
            writer = self._write()
            if writer is not None:
                writer.summary(self.tasks(), self.coverage(), self.observed_provenance(), gate)
            if self.settings["html"]:
                from .report.html import write_standalone_page

                write_standalone_page(self.settings["html"], self.tasks(), list(self.records.values()),
                                      verdicts=self.verdict_dicts(), coverage=self.coverage(),
                                      title="pytest-hud report")

    def _merge_recording(self) -> None:
        """Merge every worker's dataset part into one LeRobot dataset (per feature set)."""
        import warnings

        from .record import RecordingWarning, merge_parts

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RecordingWarning)
            try:
                paths = merge_parts(self.settings["record"])
            except Exception as exc:  # noqa: BLE001 - a failed merge must not hide the results
                self.recording = {"error": f"{type(exc).__name__}: {exc}", "datasets": []}
                return
        datasets = []
        for path in paths:
            try:
                info = json.loads((Path(path) / "meta" / "info.json").read_text())
            except (OSError, ValueError):
                info = {}
            datasets.append({"path": str(path), "episodes": info.get("total_episodes"),
                             "frames": info.get("total_frames")})
        self.recording = {"datasets": datasets, "warnings": [str(w.message) for w in caught]}

    def observed_provenance(self) -> dict[str, Any]:
        """Provenance plus every (policy, content hash) and (sim, build) the episodes actually used."""
        policies: dict[tuple, dict[str, Any]] = {}
        sims: dict[str, dict[str, Any]] = {}
        for rec in self.records.values():
            ident = rec.identity or {}
            if ident.get("policy"):
                policies[(ident["policy"], ident.get("policy_hash"))] = {
                    "policy": ident["policy"], "policy_hash": ident.get("policy_hash")}
            if ident.get("sim"):
                key = f"{ident['sim']} {ident.get('build') or ''}"
                sims[key] = {"sim": ident["sim"], "build": ident.get("build") or {}}
        return dict(self.provenance, policies=list(policies.values()), sims=list(sims.values()))

    def verdict_dicts(self) -> dict[str, dict[str, Any]] | None:
        return None if self.verdicts is None else {v.task: v.to_dict() for v in self.verdicts}

    def _junit_gate_cases(self) -> None:
        """One JUnit testcase per task for the gate's verdict (CI dashboards show them)."""
        from _pytest.junitxml import xml_key
        from _pytest.reports import TestReport

        xml = self.config.stash.get(xml_key, None)
        if xml is None or not self.verdicts:
            return
        for v in self.verdicts:
            failed = v.failed
            nodeid = f"hud-gate::{v.task}"
            props = [(k, val) for k, val in v.to_dict().items() if val is not None and not isinstance(val, list)]
            for when in ("setup", "call", "teardown"):
                report = TestReport(nodeid, ("hud-gate", None, v.task), {},
                                    "failed" if failed and when == "call" else "passed",
                                    f"{v.verdict}: {v.reason}" if failed and when == "call" else None,
                                    when, [], 0.0, user_properties=props if when == "teardown" else [])
                xml.pytest_runtest_logreport(report)

    def _step_summary(self) -> None:
        """Append the markdown summary to $GITHUB_STEP_SUMMARY (GitHub Actions' job page)."""
        path = os.environ.get("GITHUB_STEP_SUMMARY")
        if not path:
            return
        from .report.markdown import summary_markdown

        text = summary_markdown(self.tasks(), self.verdict_dicts(), self.coverage(), title="pytest-hud results")
        try:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(text.rstrip() + "\n\n")
        except OSError as exc:
            self.config.issue_config_time_warning(pytest.PytestWarning(f"cannot write $GITHUB_STEP_SUMMARY: {exc}"), 2)

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        s = self.settings
        where = f"attached to {s['sim_url']}" if s["sim_url"] else "bridges spawned on demand"
        return [
            f"hud: sim={s['sim'] or '(per test)'} width={self.width} workers={self.workers} "
            f"policy={s['policy'] or '(per test)'} ({where})",
        ] + ([f"hud: results -> {self.results_path}"] if self.results_path else [])

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        if not self.records and not self.declared:
            return
        from .report.table import summary_lines

        tr = terminalreporter
        tr.write_sep("=", "pytest-hud summary")
        verdicts = self.verdict_dicts()
        for line in summary_lines(self.tasks(), verdicts):
            tr.write_line(line)
        cov = self.coverage()
        text = (f"coverage: {cov['reported']}/{cov['declared']} declared episodes reported, "
                f"{cov['graded']} graded, {cov['errors']} errors, {cov['skipped']} skipped")
        if cov["missing"]:
            text += f"; MISSING {len(cov['missing'])}: " + ", ".join(cov["missing"][:5])
            tr.write_line(text, red=True, bold=True)
        else:
            tr.write_line(text, yellow=bool(cov["errors"]))
        if self.writer is not None:
            tr.write_line(f"results: {self.writer.path}")
        if self.recording is not None:
            for ds in self.recording["datasets"]:
                tr.write_line(f"recorded: {ds['episodes']} episodes, {ds['frames']} frames -> {ds['path']} "
                              "(LeRobot v3 dataset)")
            for text in self.recording.get("warnings", []) + ([self.recording["error"]]
                                                             if self.recording.get("error") else []):
                tr.write_line(f"recording: {text}", yellow=True)
        if self.verdicts is not None:
            from .gate import gate_passed, nothing_compared

            for v in self.verdicts:
                if v.verdict != "pass":
                    tr.write_line(f"gate: {v.verdict.upper()} {v.task}: {v.reason}",
                                  red=v.failed, yellow=not v.failed)
            ok = gate_passed(self.verdicts)
            nothing = nothing_compared(self.verdicts)
            if nothing:
                tr.write_line(f"gate: {nothing}", red=True)
            base = f" against {self.settings['baseline']}" if self.settings["baseline"] else ""
            kinds: dict[str, int] = {}
            for v in self.verdicts:
                kinds[v.verdict] = kinds.get(v.verdict, 0) + 1
            counts = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
            tr.write_line(f"gate{base}: {'PASSED' if ok else 'FAILED'} ({counts})"
                          + ("; other tests failed" if self.other_failures else ""),
                          green=ok and not self.other_failures, red=not ok or bool(self.other_failures), bold=True)

    def stop(self) -> None:
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)
        self.service.close()
        self.pool.stop_all()
        if self.writer is not None:
            self.writer.close()


class JunitErrors:
    """Runs after junitxml: an errored episode's call report becomes a JUnit ``<error>``.

    junitxml writes every failed call report as ``<failure>``; for an episode that crashed, timed out
    or met a sim error the right element is ``<error>`` (counted as such in the testsuite).
    """

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call" or not _is_episode_error(report):
            return
        from _pytest.junitxml import xml_key

        xml = self.config.stash.get(xml_key, None)
        if xml is None:
            return
        for node in xml.node_reporter(report).nodes:
            if node.tag == "failure":
                node.tag = "error"
                xml.stats["failure"] = xml.stats.get("failure", 1) - 1
                xml.stats["error"] = xml.stats.get("error", 0) + 1


class XdistHooks:
    """Registered only when pytest-xdist is present: hands each worker the pool's address."""

    def __init__(self, controller: HudController) -> None:
        self.controller = controller

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput["hud"] = self.controller.workerinput()


def _git_revision(root: Path) -> dict[str, Any] | None:
    import subprocess

    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5)
        return {"revision": rev.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return None



def _gate_config(config: pytest.Config, settings: dict[str, Any]):
    """The gate's settings: the YAML gate file, then command-line/ini overrides."""
    from .gate import GateConfig, load_gate_file

    data: dict[str, Any] = {}
    if settings["gate"]:
        path = Path(settings["gate"])
        if not path.is_absolute():
            path = config.invocation_params.dir / path
        try:
            data = load_gate_file(path.read_text(encoding="utf-8"), source=str(path))
        except FileNotFoundError:
            raise pytest.UsageError(f"--hud-gate: {path} does not exist") from None
        except ValueError as exc:
            raise pytest.UsageError(f"--hud-gate: {exc}") from None
    for key in ("alpha", "max_drop", "min_coverage"):
        if settings[key] is not None:
            data[key] = settings[key]
    try:
        return GateConfig(**data)
    except (TypeError, ValueError) as exc:
        raise pytest.UsageError(f"gate settings: {exc}") from None


def _sigterm_as_interrupt():
    """Make SIGTERM end the run like Ctrl-C, so teardown stops the pool and removes its secrets.

    Returns the previous handler (None when not on the main thread or someone else handles it).
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGTERM)
    if previous not in (signal.SIG_DFL, None):
        return None  # another tool manages SIGTERM: leave it alone

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, interrupt)
    return previous
