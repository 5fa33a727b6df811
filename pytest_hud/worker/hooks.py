"""The worker side of the plugin: the runtest hooks of a process that runs episodes.

An xdist worker (or the only process under ``-n 0``) registers :class:`WorkerHooks` once the run
uses pytest-hud. They declare the collected episodes to the controller, reuse resumed episodes,
skip what the sequential gate has decided, attach every episode to its test's call phase, and put
the episode's record (:mod:`pytest_hud.core.classify`) on the test's report for the controller.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_hud import __version__
from pytest_hud.worker.fixtures import hud_settings, item_settings
from pytest_hud.worker.keys import EPISODES_KEY, SESSION_KEY
from pytest_hud.worker.reports import EPISODE_PROPERTIES, forget_episode, lighten_report
from pytest_hud.core.settings import HudSettings, graded_problem, metric_problem, rename_problem

if TYPE_CHECKING:
    from pytest_hud.core.results import EpisodeRecord
    from pytest_hud.worker.session import HudSession

__all__ = ["EPISODE_FIXTURES", "LazyWorker", "WorkerHooks", "declaration", "is_episode_item",
           "item_axes", "item_identity", "start_worker"]

EPISODE_FIXTURES = frozenset({"shared_sim", "robot_agent"})
DESELECTED_KEY = pytest.StashKey[list]()
# --hud-shard: {"index", "count", "suite", "out": set of nodeids, "out_items": their items}
SHARD_KEY = pytest.StashKey[dict]()


def is_episode_item(item: pytest.Item) -> bool:
    return bool(EPISODE_FIXTURES & set(getattr(item, "fixturenames", ())))


def uses_hud(items: list[pytest.Item]) -> bool:
    return any(is_episode_item(item) or item.get_closest_marker("hud") is not None for item in items)


def item_identity(item: pytest.Item) -> dict[str, Any]:
    """Task, episode id and seed of a test item (see :func:`pytest_hud.core.classify.episode_identity`)."""
    from pytest_hud.core.classify import episode_identity

    callspec = getattr(item, "callspec", None)
    return episode_identity(item.nodeid, callspec.params if callspec is not None else None,
                            callspec.id if callspec is not None else None)


def item_axes(item: pytest.Item, settings: HudSettings) -> dict[str, dict[str, Any]]:
    """The robustness axes of a test item: ``--hud-axis`` (or ``hud_axis`` in the ini), then ``hud_axis``
    markers (closest wins per axis); a reference level given with ``--hud-axis NAME=REFERENCE`` on
    the command line beats the markers'.

    Each axis the item's parameters (``parametrize`` or a parametrized fixture) include becomes
    ``{"level", "index", "reference", "task"}``: the parameter's value as text, its position in the
    parameter's list, the reference level (None: the first value), and the task without this axis
    (what pairs episodes across levels; :mod:`pytest_hud.core.sensitivity`), plus ``"paired": False``
    for a marker that says its levels share no initial states by seed. Raises ``ValueError``
    when a marker names a parameter the test does not have.
    """
    from pytest_hud.core.classify import episode_identity

    named: dict[str, str | None] = dict(settings.axes)
    marked: set[str] = set()
    unpaired: set[str] = set()
    for mark in reversed(list(item.iter_markers("hud_axis"))):
        if (len(mark.args) != 1 or not isinstance(mark.args[0], str) or set(mark.kwargs) - {"reference", "paired"}
                or not isinstance(mark.kwargs.get("paired", True), bool)):
            raise ValueError(f"{item.nodeid}: write the marker as @pytest.mark.hud_axis(\"PARAMETER\", "
                             f"reference=\"LEVEL\", paired=True|False), got hud_axis(*{mark.args!r}, "
                             f"**{mark.kwargs!r})")
        reference = mark.kwargs.get("reference")
        named[mark.args[0]] = None if reference is None else str(reference)
        marked.add(mark.args[0])
        (unpaired.add if mark.kwargs.get("paired", True) is False else unpaired.discard)(mark.args[0])
    if settings.axis_cli:  # a reference given on the command line beats the markers' (as --hud-policy does)
        named.update({name: reference for name, reference in settings.axes.items() if reference is not None})
    if not named:
        return {}
    callspec = getattr(item, "callspec", None)
    params = dict(callspec.params) if callspec is not None else {}
    out: dict[str, dict[str, Any]] = {}
    for name, reference in named.items():
        if name not in params:
            if name in marked:
                raise ValueError(f"{item.nodeid}: hud_axis({name!r}) names no parameter of this test (its parameters:"
                                 f" {', '.join(sorted(params)) or 'none'}); parametrize {name!r} or fix the marker")
            continue  # --hud-axis applies to the tests that have the parameter
        rest = {k: v for k, v in params.items() if k != name}
        out[name] = {"level": str(params[name]), "index": callspec.indices.get(name), "reference": reference,
                     "task": episode_identity(item.nodeid, rest)["task"]}
        if name in unpaired:
            out[name]["paired"] = False
    return out


def note_deselected(config: pytest.Config, items: list[pytest.Item]) -> None:
    out = config.stash[SHARD_KEY]["out"] if SHARD_KEY in config.stash else ()
    # Episodes of other shards are not "deselected with -k/-m": the ledger hears of them as shards.
    config.stash.setdefault(DESELECTED_KEY, []).extend(i for i in items if is_episode_item(i) and i.nodeid not in out)


def select_shard(config: pytest.Config, items: list[pytest.Item], settings: HudSettings) -> None:
    """Keep this shard's episodes (``--hud-shard I/N``) in ``items``; deselect the other shards'.

    Runs after ``-k``/``-m`` (the partition is of what the run selected). Tests that are not
    episodes stay in every shard.
    """
    from pytest_hud.core.shard import partition, suite_tasks

    shard = settings.shard_spec
    if shard is None:
        return
    episodes = [(item, item_identity(item)) for item in items if is_episode_item(item)]
    pairs = [(ident["task"], ident["episode"]) for _, ident in episodes]
    where = partition(pairs, shard.count)
    out = {item.nodeid for item, ident in episodes if where[(ident["task"], ident["episode"])] != shard.index}
    config.stash[SHARD_KEY] = {"index": shard.index, "count": shard.count, "suite": suite_tasks(pairs),
                               "out": out, "out_items": [item for item, _ in episodes if item.nodeid in out]}
    if out:
        items[:] = [item for item in items if item.nodeid not in out]
        config.hook.pytest_deselected(items=[item for item, _ in episodes if item.nodeid in out])


def start_worker(config: pytest.Config, hud: dict[str, Any], worker: int | None = None) -> HudSession:
    """Create this process's :class:`HudSession` from the controller's hand-off and register the hooks."""
    from pytest_hud.worker.session import HudSession

    if worker is None:
        worker = int(str(config.workerinput.get("workerid", "gw0")).lstrip("gw") or 0)
    session = HudSession(hud.get("pool_host"), hud.get("pool_port"), hud["secret"], worker,
                         HudSettings.from_dict(hud["settings"]), rendezvous=hud.get("rendezvous"),
                         project_roots=(str(config.rootpath), str(config.invocation_params.dir)))
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(WorkerHooks(config, session), "hud-worker")
    return session


def declaration(session: pytest.Session, hud: HudSession) -> dict[str, Any] | None:
    """This run's episodes (after -k/-m deselection) and the deselected tasks, for the controller."""
    if session.config.option.collectonly:
        return None  # nothing will run: declare nothing, so nothing is written
    declared, served, used, sims = [], set(), set(), {}
    problems_of_items: list[str] = []
    for item in session.items:
        if is_episode_item(item):
            ident = item_identity(item)
            settings = item_settings(item, hud)
            item_problems = (
                metric_problem(settings.metric),
                rename_problem(hud_settings(item).get("rename")),
                graded_problem(settings.graded),
            )
            for problem in item_problems:
                problem = problem and f"{item.nodeid.split('[', 1)[0]}: {problem}"
                problems_of_items += [] if not problem or problem in problems_of_items else [problem]
            if settings.min_success is not None:
                ident["min_success"] = settings.min_success
            if settings.metric is not None and not metric_problem(settings.metric):
                ident["metric"] = settings.metric
            try:
                axes = item_axes(item, hud.settings)
            except ValueError as exc:
                problems_of_items.append(str(exc))
                axes = {}
            if axes:
                ident["axes"] = axes
            declared.append(ident)
            if settings.policy:
                used.add(settings.policy)
            fixtures = getattr(item, "fixturenames", ())
            if hud.settings.policy_server and settings.policy and "robot_agent" in fixtures:
                served.add((settings.policy, json.dumps(settings.rename, sort_keys=True)))
            if settings.sim and "shared_sim" in fixtures and not hud.settings.resume:
                # (resumed episodes may all be replayed: their bridge starts when one runs); each
                # episode names its sim by its index in data["sims"] (collection order)
                ident["sim"] = sims.setdefault((settings.sim, json.dumps(settings.build or {}, sort_keys=True)),
                                               len(sims))
    deselected: dict[str, list[str]] = {}  # task -> episode ids
    for item in session.config.stash.get(DESELECTED_KEY, []):
        ident = item_identity(item)
        deselected.setdefault(ident["task"], []).append(ident["episode"])
    shard = session.config.stash.get(SHARD_KEY, None)
    if not declared and not deselected and shard is None:
        return None
    data = {"episodes": declared, "worker": hud.worker, "deselected": deselected}
    problems = (problems_of_items + _axis_problems(session, declared, hud.settings)
                + _policy_problems(used, Path(str(session.config.invocation_params.dir))))
    if problems:  # the controller makes them a usage error before anything is written
        data["problems"] = problems
    if used:  # the controller hashes them now, once, for every record's identity (run_identity)
        from pytest_hud.agent.model import policy_files

        data["hash_policies"] = {spec: policy_files(spec) for spec in sorted(used)}
    if served:  # the pool starts their servers now, while the sims boot (SimPool.prestart_policy_server)
        data["policies"] = [[spec, json.loads(rename)] for spec, rename in sorted(served)]
    if sims:  # the bridges of the first ones start before the first test asks (Bridges.prestart_bridge)
        data["sims"] = [[target, json.loads(build)] for target, build in sims]
    if served or sims:
        data["python_path"] = hud.project_paths()  # what those servers and bridges import with
    if shard is not None:  # the whole suite too: the gate and the merge need the other shards' episodes
        data["shard"] = {key: shard[key] for key in ("index", "count", "suite")}
    return data


def _axis_problems(session: pytest.Session, declared: list[dict[str, Any]],
                   settings: HudSettings) -> list[str]:
    """Robustness axes that cannot mean what they say: a typo must not just drop the table.

    A reference level (``hud_axis(..., reference=...)`` or ``--hud-axis NAME=REFERENCE``) that is
    none of the parameter's values in the collected tests (deselected ones included) is a problem;
    so is a ``--hud-axis`` name given on the command line that no collected episode test has as a
    parameter (the ``hud_axis`` ini key applies to the tests that have it, silently).
    """
    items = [item for item in session.items if is_episode_item(item)]
    items += list(session.config.stash.get(DESELECTED_KEY, []))
    items += session.config.stash[SHARD_KEY]["out_items"] if SHARD_KEY in session.config.stash else []
    levels: dict[str, set[str]] = {}
    for item in items:
        callspec = getattr(item, "callspec", None)
        for name, value in (callspec.params.items() if callspec is not None else ()):
            levels.setdefault(name, set()).add(str(value))
    problems = []
    if settings.axis_cli:
        for name in settings.axes:
            if name not in levels:
                known = ", ".join(sorted(levels)) or "none"
                problems.append(f"--hud-axis {name!r} names no parameter of the collected tests (their "
                                f"parameters: {known}); fix the name, or drop the option")
    references = sorted({(name, axis["reference"]) for ident in declared
                         for name, axis in ident.get("axes", {}).items() if axis["reference"] is not None})
    for name, reference in references:
        if reference not in levels.get(name, ()):
            values = ", ".join(sorted(levels.get(name, ()))) or "none"
            problems.append(f"robustness axis {name!r}: the reference level {reference!r} is none of its "
                            f"values ({values}); name one of them as the reference")
    return problems


def _policy_problems(specs: set[str], here: Path) -> list[str]:
    """What is wrong with the policy specs the run's tests use (markers included), checked statically."""
    from pytest_hud.agent.model import PolicyError, check_policy_spec

    problems = []
    for spec in sorted(specs):
        try:
            check_policy_spec(spec, here)
        except PolicyError as exc:
            problems.append(f"policy of a test: {exc}")
    return problems


def declare_episodes(session: pytest.Session, hud: HudSession | None) -> None:
    """Declare this run's episodes so coverage has a true denominator.

    The controller checks the declaration (floors that match no task, policies that cannot load);
    a problem is a usage error before any episode runs: raised here without xdist, and by the
    controller with it (this worker then runs nothing).
    """
    from pytest_hud.wire.jsonrpc import RpcError

    data = declaration(session, hud) if hud is not None else None
    if data is None:
        return
    try:
        hud.pool_call("declare", **data)
    except RpcError as exc:
        if not (isinstance(exc.data, dict) and exc.data.get("usage_error")):
            raise
        if hasattr(session.config, "workerinput"):
            session.items[:] = []  # the controller stops the run with the usage error
            return
        raise pytest.UsageError(exc.message) from None


@functools.lru_cache(maxsize=64)  # (the same few specs for every episode of the run)
def _portable_specs(policy: str | None, sim: str | None, roots: tuple[str, ...]) -> tuple[str | None, str | None]:
    from pytest_hud.core.specs import portable_spec

    return portable_spec(policy, roots), portable_spec(sim, roots)


def run_identity(item: pytest.Item, hud: HudSession) -> dict[str, Any]:
    """What an episode's result depends on besides its seed: resume reuses only exact matches."""
    from pytest_hud.agent.model import policy_files

    settings = item_settings(item, hud)
    policy, cache = settings.policy, hud.policy_hashes
    if policy not in cache:  # the files as this worker finds them, hashed once per run by the controller
        cache[policy] = hud.pool_call("policy_hash", spec=policy, files=policy_files(policy)) if policy else None
    portable = _portable_specs(policy, settings.sim, tuple(hud.project_roots))
    return {"plugin_version": __version__, "policy": portable[0], "policy_hash": cache[policy],
            "sim": portable[1], "build": settings.build,
            "max_steps": hud_settings(item).get("max_steps", hud.settings.max_steps),
            "n_action_steps": hud.settings.n_action_steps,
            **({"graded": False} if settings.graded is False else {})}


def with_placement(record: EpisodeRecord, episodes: list[Any], policy: dict[str, Any] | None) -> EpisodeRecord:
    """Add where the episode's bridge and policy server ran (cluster runs only) to ``record``.

    An error names the bridge's node, so a lost machine is visible in the episode's own line.
    """
    address = next((getattr(getattr(ep, "_sim", None), "address", None) for ep in reversed(episodes)), None)
    where: dict[str, Any] = {}
    if address is not None and address.node:
        where.update(bridge_node=address.node, bridge_host=address.host)
    if policy and policy.get("node"):
        where.update(policy_node=policy["node"], policy_host=policy.get("host"), policy_replica=policy.get("replica"))
    if not where:
        return record
    record.extra.update(where)
    if record.error and "bridge_node" in where:
        record.error = f"{record.error} [bridge on node {where['bridge_host']} ({where['bridge_node']})]"
    return record


class LazyWorker:
    """On an xdist worker of a run without hud settings: ask the controller for pytest-hud if needed.

    See :class:`pytest_hud.plugin.LazyXdist` for the controller's half of the rendezvous.
    """

    def __init__(self, config: pytest.Config, hud: dict[str, Any]) -> None:
        self.config, self.hud = config, hud

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        note_deselected(self.config, items)

    @pytest.hookimpl(tryfirst=True)  # before xdist tells the controller that collection finished
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if not uses_hud(session.items):
            return
        rendezvous = Path(self.hud["rendezvous"])
        rendezvous.mkdir(mode=0o700, exist_ok=True)
        worker = str(self.config.workerinput.get("workerid", "gw0"))
        (rendezvous / f"want-{worker}").touch(0o600)
        hud = start_worker(self.config, self.hud)
        # The pool's address appears once the controller has seen this collection: declare later,
        # with the first call to the pool (declaring now would wait for an answer not yet possible).
        hud.pending_declare = declaration(session, hud)


class WorkerHooks:
    """The runtest hooks of a process that runs episodes (an xdist worker, or the only process)."""

    def __init__(self, config: pytest.Config, hud: HudSession) -> None:
        self.config, self.hud = config, hud

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        note_deselected(self.config, items)

    @pytest.hookimpl(trylast=True)  # after -k/-m: a shard is a part of what the run selected
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        select_shard(config, items, self.hud.settings)

    @pytest.hookimpl(tryfirst=True)  # before xdist tells the controller that collection finished
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        declare_episodes(session, self.hud)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
        hud = self.hud
        if is_episode_item(item) and hud.settings.resume:
            ident = item_identity(item)
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
            ident = item_identity(item)
            self.hud.label_recorders(ident["task"], ident["episode"])
        self.hud.current_item = item
        try:
            return (yield)
        finally:
            self.hud.current_item = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        if not self.hud.settings.sequential or not is_episode_item(item):
            return
        task = item_identity(item)["task"]
        decision = self.hud.pool_call("sequential", task=task)
        if decision and decision != "undecided":
            pytest.skip(f"sequential gate already decided {task}: {decision}")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        from pytest_hud.core.results import to_builtin

        report = yield
        # Users may record numpy scalars: make every property crossable by the xdist channel.
        report.user_properties = [(str(k), to_builtin(v)) for k, v in report.user_properties]
        if not is_episode_item(item):
            return report
        if report.when == "teardown":
            forget_episode(item)  # the reports carry it from here: the item keeps none of it
            return report
        if report.when == "call" or (report.when == "setup" and not report.passed):
            artefacts = self.hud.flush_recorders() if report.when == "call" else {}
            record = self._record(item, call, report)
            if artefacts and not record.artefacts:
                record.artefacts = artefacts  # an errored episode has no result to carry them
            report.hud_episode = data = record.to_dict()  # builtin types: it crosses the xdist channel
            props = [(k, data[k]) for k in EPISODE_PROPERTIES if data.get(k) is not None]
            report.user_properties.extend(props)
            item.user_properties.extend(props)  # JUnit XML reads properties from the teardown report
        return report

    def _record(self, item: pytest.Item, call: pytest.CallInfo, report: pytest.TestReport) -> EpisodeRecord:
        from pytest_hud.core.classify import classify, episode_record, skip_reason

        episodes = item.stash.get(EPISODES_KEY, [])
        result = next((ep.result for ep in reversed(episodes) if ep.result is not None), None)
        grade = next((ep.grade_data for ep in reversed(episodes) if ep.grade_data is not None), None)
        bridge_error = (result.error if result is not None else None) or (grade or {}).get("error")
        exc = call.excinfo.value if call.excinfo is not None else None
        outcome = classify(when=report.when, passed=report.passed, skipped=report.skipped, exc=exc,
                           bridge_error=bridge_error, failure_types=(AssertionError, pytest.fail.Exception))
        record = episode_record(
            item_identity(item), outcome=outcome, identity=run_identity(item, self.hud),
            worker=f"gw{self.hud.worker}" if hasattr(item.config, "workerinput") else "main",
            duration_s=report.duration, exc=exc, bridge_error=bridge_error,
            skipped_because=skip_reason(report.longrepr) if report.skipped else None, result=result, grade=grade)
        claimed = next((ep for ep in reversed(episodes)
                        if getattr(ep, "started", None) is not None and hasattr(ep, "definition")), None)
        if claimed is not None:  # what defines the episode: it can be run again from this line
            record.claim = claimed.definition()
            if record.seed is None and claimed.seed is not None:
                record.seed = claimed.seed
        contract = next((ep.contract for ep in reversed(episodes) if getattr(ep, "contract", None) is not None), None)
        if contract is not None:  # what the policy saw and sent: part of what defines the task for the gate
            record.contract = contract.signature()
        try:
            record.axes = item_axes(item, self.hud.settings)
        except ValueError:
            pass  # the declaration reported it as a usage error
        return with_placement(record, episodes, self.hud.policy_places.get(item_settings(item, self.hud).policy or ""))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport):
        try:
            return (yield)
        finally:
            if hasattr(self.config, "workerinput"):  # sent to the controller: this worker needs none of it
                lighten_report(report)

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report: pytest.TestReport, config: pytest.Config):
        from pytest_hud.core.classify import episode_teststatus

        return episode_teststatus(report)


def _replay(item: pytest.Item, data: dict[str, Any]) -> None:
    """Report a reused episode with its recorded outcome, without running it."""
    from _pytest.reports import TestReport

    from pytest_hud.core.results import EpisodeRecord

    ihook = item.ihook
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    record = EpisodeRecord.from_dict(data, warn=False)  # the controller read the line (and reported what it did not know)
    record.reused, record.nodeid = True, item.nodeid
    for when in ("setup", "call", "teardown"):
        failed = when == "call" and record.outcome == "failed"
        report = TestReport(
            item.nodeid, item.location, {}, "failed" if failed else "passed",
            "reused from an earlier run (--hud-resume): the episode failed there" if failed else None,
            when, [], 0.0,
            user_properties=[("reused", True)] if when == "call" else [],
        )
        if when == "call":
            report.hud_episode = record.to_dict()
        ihook.pytest_runtest_logreport(report=report)
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
