"""pytest-hud: every episode a test, one shared vectorized sim, success rates that CI can act on.

This module is the hook wiring only; the logic lives in modules cut by role (``docs/architecture.md``):

- the **controller** (the xdist controller, or the only process under ``-n 0``):
  :class:`~pytest_hud.controller.hooks.HudController`, created here once the run uses pytest-hud and
  stopped in ``pytest_unconfigure``;
- each **worker** (or the same process under ``-n 0``): a :class:`~pytest_hud.worker.session.HudSession`
  and the runtest hooks of :mod:`pytest_hud.worker.hooks`;
- the settings: one :class:`~pytest_hud.core.settings.HudSettings`, built from the command line and the
  ini file, checked and loaded with its input files (:mod:`pytest_hud.controller.inputs`) before anything is
  created.

The plugin stays out of runs that don't use it (as junitxml does without ``--junitxml``): the
controller, its pool service, its threads and the runtest hooks exist only once a hud option or ini
key is set (decided in ``pytest_configure``), or else a collected test uses ``shared_sim``,
``robot_agent`` or the ``hud`` marker (decided after collection: :class:`LazyLocal`, or with xdist
:class:`LazyXdist` and :class:`~pytest_hud.worker.hooks.LazyWorker`).
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_hud.worker.fixtures import robot_agent, shared_sim  # noqa: F401 - the plugin's fixtures
from pytest_hud.worker.keys import SESSION_KEY, worker_session
from pytest_hud.core.settings import OPTIONS, HudSettings, SettingsError, flag
from pytest_hud.worker.hooks import (
    LazyWorker, declare_episodes, note_deselected, start_worker, uses_hud,
)

if TYPE_CHECKING:
    from pytest_hud.controller.hooks import HudController
    from pytest_hud.controller.inputs import RunInputs

__all__ = ["CONTROLLER_KEY", "HudController", "worker_session"]

#: The run's controller, in the config's stash of the controlling process.
CONTROLLER_KEY = pytest.StashKey["HudController"]()


def __getattr__(name: str) -> Any:
    """``HudController`` on first use: pytest imports this module in every process where pytest-hud is
    installed, and a run that never uses it should not pay for the controller's imports."""
    if name == "HudController":
        from pytest_hud.controller.hooks import HudController

        return HudController
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---------------------------------------------------------------- options
def _leave_unrewritten(pluginmanager: pytest.PytestPluginManager) -> None:
    """Import this package's modules as plain Python, not through pytest's assertion rewriter.

    pytest rewrites the asserts of every module in a plugin's distribution: each module this
    package imports later (lazily, often on a thread of the controller or a worker) would be parsed
    and rewritten, in every process, on every run where bytecode is not written. Its asserts are
    internal invariants that gain nothing from it, and on CPython 3.11.0-3.11.7 and 3.12.0-3.12.1
    a parse on one thread while another parses (pytest rewriting a test module, a plugin's lazy
    import) can fail with ``SystemError: AST constructor recursion depth mismatch`` (CPython
    gh-106905), and with it the run. pytest has no public way to take a plugin off its list; the
    hook's set is left alone where it is not what this expects (then the modules stay rewritten).
    """
    hook = getattr(pluginmanager, "rewrite_hook", None)
    marked, cache = getattr(hook, "_must_rewrite", None), getattr(hook, "_marked_for_rewrite_cache", None)
    if not isinstance(marked, set):
        return
    package = __name__.partition(".")[0]
    marked.discard(package)
    if isinstance(cache, dict):
        for name in [n for n in cache if n == package or n.startswith(package + ".")]:
            del cache[name]


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    _leave_unrewritten(pluginmanager)
    group = parser.getgroup("hud", "pytest-hud robot-policy evaluation")
    for name, opt in OPTIONS.items():
        extra = f". Ini: hud_{name}" + (f" (default {opt.default})" if opt.default not in (None, False) else "")
        if opt.type is bool:
            group.addoption(flag(name), dest=f"hud_{name}", action="store_true", default=None, help=opt.help + extra)
            parser.addini(f"hud_{name}", opt.help, type="bool", default=None)
        elif opt.repeat:
            group.addoption(flag(name), dest=f"hud_{name}", default=None, action="append", help=opt.help + extra)
            parser.addini(f"hud_{name}", opt.help, default=None)
        else:
            group.addoption(flag(name), dest=f"hud_{name}", default=None, type=opt.type, help=opt.help + extra)
            parser.addini(f"hud_{name}", opt.help, default=None)


def _raw_options(config: pytest.Config) -> tuple[dict[str, Any], dict[str, Any]]:
    cli = {name: config.getoption(f"hud_{name}", None) for name in OPTIONS}
    for name, opt in OPTIONS.items():
        if opt.repeat and isinstance(cli[name], list):
            cli[name] = ",".join(cli[name])
    ini = {name: config.getini(f"hud_{name}") for name in OPTIONS}
    return cli, ini


def _num_workers(config: pytest.Config) -> int:
    if _distributed(config):
        return max(1, len(getattr(config.option, "tx", None) or []) or int(config.option.numprocesses or 1))
    return 1


def _has_xdist(config: pytest.Config) -> bool:
    """pytest-xdist is loaded: by its entry point ("xdist"), or by ``-p xdist.plugin`` under
    ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1`` (then it is registered under its module's name)."""
    return config.pluginmanager.hasplugin("xdist") or config.pluginmanager.hasplugin("xdist.plugin")


def _distributed(config: pytest.Config) -> bool:
    return _has_xdist(config) and getattr(config.option, "dist", "no") != "no"


def build_settings(config: pytest.Config) -> HudSettings:
    """The run's settings from the command line and the ini file; a bad one is a usage error."""
    cli, ini = _raw_options(config)
    try:
        return HudSettings.build(cli, ini, workers=_num_workers(config), distributed=_distributed(config))
    except SettingsError as exc:
        raise pytest.UsageError(str(exc)) from None


def load_settings(config: pytest.Config, settings: HudSettings | None = None) -> tuple[HudSettings, RunInputs]:
    """The run's settings and inputs, checked and loaded; a bad one is a usage error. No side effects."""
    from pytest_hud.controller.inputs import load_inputs

    settings = settings or build_settings(config)
    cli, ini = _raw_options(config)
    try:
        return load_inputs(settings, config.invocation_params.dir,
                           video_explicit=bool(cli["video"] or ini["video"]),
                           report_html=getattr(config.option, "htmlpath", None),
                           test_dirs=_test_dirs(config))
    except SettingsError as exc:
        raise pytest.UsageError(str(exc)) from None


def _test_dirs(config: pytest.Config) -> list[Path]:
    """The folders of the command line's test paths (a file's folder; ``::`` parts dropped)."""
    here, out = config.invocation_params.dir, []
    for arg in config.args:
        path = here / str(arg).split("::", 1)[0]
        try:
            folder = path if path.is_dir() else path.parent if path.is_file() else None
        except OSError:  # a name no file can have: pytest reports the argument itself
            continue
        if folder is not None and folder.resolve() not in out:
            out.append(folder.resolve())
    return out


def _explicitly_used(config: pytest.Config) -> bool:
    """A hud option on the command line or a hud ini key in the config file."""
    cli, ini = _raw_options(config)
    return any(v is not None for v in cli.values()) or any(v not in (None, "", []) for v in ini.values())


# ------------------------------------------------------------- lifecycle
@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "hud(sim=None, policy=None, max_steps=None, build=None, min_success=None, metric=None, graded=True): "
        "per-test pytest-hud settings (closest marker wins)",
    )
    config.addinivalue_line(
        "markers",
        "hud_axis(parameter, reference=None, paired=True): the parameter's values are robustness levels; the "
        "summary tests each against the reference level (default: the first value) in a sensitivity table "
        "(paired=False: a seed is not the same initial state at every level, so the tests are unpaired)",
    )
    if hasattr(config, "workerinput"):
        hud = config.workerinput.get("hud")
        if hud and hud.get("pool_port"):
            start_worker(config, hud)
        elif hud:
            config.pluginmanager.register(LazyWorker(config, hud), "hud-lazy")
        return
    if _explicitly_used(config):
        _activate(config, *load_settings(config))
        return
    # Nothing asks for pytest-hud yet: its inputs (and the modules that load them) wait until a
    # collected test uses it.
    settings = build_settings(config)
    if _distributed(config):
        config.pluginmanager.register(LazyXdist(config, settings), "hud-lazy")
    else:
        config.pluginmanager.register(LazyLocal(config, settings), "hud-lazy")


def _activate(config: pytest.Config, settings: HudSettings, inputs: RunInputs,
              xdist_hooks: bool = True, secret: str | None = None) -> HudController:
    """Create the controller (and, without xdist, this process's worker session); register hooks."""
    from pytest_hud.controller.hooks import HudController
    from pytest_hud.report.junit import JunitErrors

    controller = HudController(config, settings, inputs, secret=secret)
    config.stash[CONTROLLER_KEY] = controller
    config.pluginmanager.register(controller, "hud-controller")
    controller.prestart_at_configure(collect_only=config.option.collectonly)  # stopped with the controller
    config.pluginmanager.register(JunitErrors(config), "hud-junit-errors")
    if xdist_hooks and _has_xdist(config):
        config.pluginmanager.register(XdistHooks(controller), "hud-xdist")
    plugins = config.pluginmanager
    html_loaded = plugins.hasplugin("html") or plugins.hasplugin("pytest_html.plugin")
    if html_loaded and getattr(config.option, "htmlpath", None):
        from pytest_hud.report.pytest_html import HtmlReportHooks

        html = HtmlReportHooks(config, controller.html_summary)
        config.pluginmanager.register(html, "hud-html")
        html.join_started_report()  # activated lazily: pytest-html built its header already
    if not _distributed(config):
        start_worker(config, controller.workerinput(), worker=0)
    return controller


def _late_header(config: pytest.Config, controller: HudController) -> None:
    """Print the ``hud:`` header lines that ``pytest_report_header`` could not (we activated later)."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or config.get_verbosity() < 0:
        return
    reporter.ensure_newline()
    for line in controller.pytest_report_header(config):
        reporter.write_line(line)


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is not None:
        session.close()
        del config.stash[SESSION_KEY]
        if hasattr(config, "workerinput"):
            # An xdist worker is about to exit, its episodes reported and its files closed: the
            # interpreter's last garbage collection need not walk every object of pytest, numpy,
            # PyAV and the run (about 45 of a worker's 60 ms of exit; the run waits for its slowest
            # worker, and 8 of them exit at once on the same cores). Objects that die by reference
            # count are still finalized; only cyclic garbage made before now is left to the OS.
            import gc

            gc.freeze()
    controller = config.stash.get(CONTROLLER_KEY, None)
    if controller is not None:
        controller.stop()
        config.pluginmanager.unregister(controller)
        del config.stash[CONTROLLER_KEY]
    lazy = config.pluginmanager.get_plugin("hud-lazy")
    if isinstance(lazy, LazyXdist):
        lazy.close()


class XdistHooks:
    """Registered only when pytest-xdist is present: hands each worker the pool's address."""

    def __init__(self, controller: HudController) -> None:
        self.controller = controller

    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput["hud"] = self.controller.workerinput()


class LazyLocal:
    """Without xdist and without hud settings: activate after collection if a test uses pytest-hud."""

    def __init__(self, config: pytest.Config, settings: HudSettings) -> None:
        self.config, self.settings = config, settings

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        note_deselected(self.config, items)

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if uses_hud(session.items) and self.config.stash.get(CONTROLLER_KEY, None) is None:
            _late_header(self.config, _activate(self.config, *load_settings(self.config, self.settings)))
            declare_episodes(session, worker_session(self.config))


class LazyXdist:
    """On an xdist controller without hud settings: start the controller when a worker asks.

    Workers get a rendezvous path instead of the pool's address. A worker that collects a test
    using pytest-hud leaves a ``want`` file there before xdist reports its collection; on that
    report the controller starts and writes the pool's address there (0600, atomically). Until
    then nothing exists: no directory, no thread, no port.
    """

    def __init__(self, config: pytest.Config, settings: HudSettings) -> None:
        import tempfile

        self.config, self.settings = config, settings
        self.secret = secrets.token_hex(16)
        self.rendezvous = Path(tempfile.gettempdir()) / f"pytest-hud-rendezvous-{secrets.token_hex(8)}"
        self.controller: HudController | None = None

    def pytest_configure_node(self, node: Any) -> None:
        if self.controller is not None:  # a replacement worker after activation
            node.workerinput["hud"] = self.controller.workerinput()
        else:
            node.workerinput["hud"] = {"secret": self.secret, "rendezvous": str(self.rendezvous),
                                       "settings": self.settings.to_dict()}

    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        if self.controller is not None or not _trusted_dir(self.rendezvous):
            return
        if not any(p.name.startswith("want-") for p in self.rendezvous.iterdir()):
            return
        self.controller = _activate(self.config, *load_settings(self.config, self.settings), xdist_hooks=False,
                                    secret=self.secret)
        _late_header(self.config, self.controller)
        tmp = self.rendezvous / "pool.json.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(self.controller.workerinput(), fh)  # what an eager run's workers get at start
        os.replace(tmp, self.rendezvous / "pool.json")

    def close(self) -> None:
        import shutil

        shutil.rmtree(self.rendezvous, ignore_errors=True)


def _trusted_dir(path: Path) -> bool:
    """An existing directory of ours that nobody else can write to."""
    try:
        st = path.stat()
    except OSError:
        return False
    return path.is_dir() and st.st_uid == os.getuid() and not st.st_mode & 0o077
