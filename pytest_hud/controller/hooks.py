"""The controller: owns the run's bridges, its pool service, its books and its results file.

One :class:`HudController` per run, in the xdist controller (or the only process under ``-n 0``),
created by the plugin once the run uses pytest-hud and stopped in ``pytest_unconfigure``. It wires
the pieces cut by role, as pytest-xdist cuts ``dsession``/``workermanage``:

- :class:`~.ledger.Ledger` (pure): declared episodes, records, coverage, sequential tests, verdicts;
- :class:`~pytest_hud.controller.pool.SimPool` and :class:`~pytest_hud.controller.pool_service.PoolService`: bridges
  and the loopback service workers ask for them; :class:`~.startup.StartupClock`: where the first seconds went;
- :class:`~pytest_hud.core.results.ResultsWriter`: one flushed line per episode (fsynced within a
  second), opened on the first; where it goes and when it becomes the baseline
  (:mod:`~pytest_hud.controller.results_file`);
- the reports: terminal, JUnit, ``$GITHUB_STEP_SUMMARY`` and HTML (:mod:`~pytest_hud.report`).
"""
from __future__ import annotations

import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from pytest_hud.client.address import BridgeAddress
from pytest_hud.controller.startup import StartupClock
from pytest_hud.controller.bridges import first_sims
from pytest_hud.controller.inline import KnownSims
from pytest_hud.controller.inputs import RunInputs
from pytest_hud.controller.kept_reports import ReportLightener
from pytest_hud.controller.progress import progress_record
from pytest_hud.controller.ledger import Ledger
from pytest_hud.controller.provenance import PolicyHashes, installed_provenance, provenance
from pytest_hud.controller.signals import sigterm_as_interrupt
from pytest_hud.controller.spool import RecordSpool
from pytest_hud.controller.results_file import episodes_written, results_paths, settle_baseline
from pytest_hud.core.specs import portable_spec
from pytest_hud.core.results import EpisodeRecord, ResultsWriter
from pytest_hud.core.settings import HudSettings
from pytest_hud.recording.quota import VideoQuota
from pytest_hud.report.terminal import write_progress

__all__ = ["HudController", "results_paths"]


class HudController:
    """Controller-side state of a run; a pytest plugin object (its hooks are the controller's)."""

    def __init__(self, config: pytest.Config, settings: HudSettings, inputs: RunInputs,
                 secret: str | None = None) -> None:
        from pytest_hud.controller.pool import BridgeSpec, SimPool
        from pytest_hud.controller.pool_service import PoolService

        self.config = config
        self.settings = settings
        self.workers = settings.workers
        self.width = settings.slots
        self.secret = secret or secrets.token_hex(16)
        self.run_id = secrets.token_hex(8)
        self.started = time.monotonic()
        self.startup = StartupClock()  # where the run's first seconds go (summary and results file)
        self.ledger = Ledger(inputs.gate_config, inputs.baseline, inputs.resumable,
                             sequential=settings.sequential, gated_by_file=bool(settings.gate),
                             read_back=self._read_back)
        self.verdicts: list[Any] | None = None
        self.other_failures = 0
        self.usage_error: str | None = None  # a declaration the run cannot gate: nothing runs, nothing is written
        self.baseline_note: str | None = None  # where the results went when they are the baseline too
        self._last_progress = time.monotonic()
        self.recording: dict[str, Any] | None = None
        self._sensitivity: list[Any] | None = None  # computed once the run has finished

        # Everything above only read; from here on the run has side effects (all inputs are valid).
        self._lock = threading.Lock()
        self._writer_lock = threading.Lock()
        rootdir = str(config.rootpath)
        invocation = str(config.invocation_params.dir)
        attach = BridgeAddress.from_announce(settings.sim_url) if settings.sim_url else None
        timeouts = settings.timeouts
        spec = BridgeSpec(
            width=self.width, boot_timeout=timeouts.boot, claim_timeout=timeouts.claim,
            first_action_timeout=timeouts.first_action, step_timeout=timeouts.step,
            vectorization=settings.vectorization, inline=settings.inline, tick=settings.tick,
            tick_window=settings.tick_window, batched_policy=settings.policy_server,
            io_thread=settings.io_thread, policy_rename=settings.rename, cwd=invocation,
            python_path=[invocation, rootdir] + [p for p in sys.path if p and p.startswith(rootdir)],
        )
        self.pool = SimPool(self.secret, spec, workers=self.workers, attach=attach, launcher=_launcher(settings, spec),
                            policy_replicas=settings.policy_replicas, known=KnownSims(getattr(config, "cache", None)))
        self._videos = VideoQuota(settings.video_max)  # videos taken per task, for every worker
        self.service_host = "127.0.0.1"
        self.service = PoolService(self.pool, self.secret, self.service_host,
                                   extra_methods={"declare": self._declare, "sequential": self._sequential,
                                                  "resume_lookup": self._resume_lookup,
                                                  "policy_hash": self._policy_hash,
                                                  "video_slot": self._videos})
        self.provenance = provenance(settings, config.rootpath, list(config.invocation_params.args), installed=False)
        # package versions and the git revision are looked up while the workers start; the header waits for them
        self._installed: dict[str, Any] = {}
        self._installed_lookup = threading.Thread(
            target=lambda root=config.rootpath: self._installed.update(installed_provenance(root)),
            name="hud-provenance", daemon=True)
        self._installed_lookup.start()
        self.policy_hashes = PolicyHashes()  # each policy's content hash, once per run, off the workers' cores
        self._policy_files = None
        if settings.policy:
            from pytest_hud.agent.model import policy_files

            self._policy_files = policy_files(settings.policy)
            self.policy_hashes.start(settings.policy, self._policy_files)
        self._old_sigterm = sigterm_as_interrupt()
        self.results_path: Path | None = None
        self.baseline_path: Path | None = None  # set when the results file is the baseline too
        self._spool: RecordSpool | None = None  # the records' file without --hud-results
        if settings.results:
            self.results_path = config.invocation_params.dir / settings.results
            self.results_path, self.baseline_path = results_paths(self.results_path, settings.baseline,
                                                                  config.invocation_params.dir)
        else:  # no results file asked for: the records still go to disk, not to memory
            self._spool = RecordSpool()
            self.results_path = self._spool.path
        self.writer: ResultsWriter | None = None  # opened with the first record: a run of nothing writes nothing
        self._episodes_from = 0  # where this run's episode lines start in the results file
        self._lightener = ReportLightener()  # episode reports lose their payload once every plugin saw them

    # ------------------------------------------------------------ plumbing
    @property
    def records(self) -> dict[str, EpisodeRecord]:
        return self.ledger.records

    def _write(self) -> ResultsWriter | None:
        """The results file's writer, opened on first use (appending when resuming into the same file).

        Its header lists the episodes the run declared, so it is opened once they are known (by
        the first declaration, on a thread of its own: the header waits for the policy's hash).
        """
        with self._writer_lock:
            if self.writer is None and self.results_path is not None and self.usage_error is None:
                self.provenance["policy_hash"] = self.policy_hashes.get(self.settings.policy, self._policy_files)
                self._installed_lookup.join()
                self.provenance.update(self._installed)
                resume = self.settings.resume
                resuming_here = bool(resume) and Path(resume).resolve() == self.results_path.resolve()
                with self._lock:
                    declared, deselected = self.ledger.declared_ids(), self.ledger.deselected_ids()
                self.writer = ResultsWriter(self.results_path, self.provenance, self.run_id, append=resuming_here,
                                            declared=declared, deselected=deselected)
                self._episodes_from = self.writer.path.stat().st_size
            return self.writer

    def _read_back(self) -> list[EpisodeRecord]:
        """The episode records this run wrote (the ledger keeps tallies, not records)."""
        writer = self.writer
        return [] if writer is None else list(episodes_written(writer.path, self._episodes_from))

    def workerinput(self) -> dict[str, Any]:
        """What a worker needs to reach the pool (builtin types: it crosses the xdist channel)."""
        return {"pool_host": self.service_host, "pool_port": self.service.port, "secret": self.secret,
                "settings": self.settings.to_dict()}

    def tasks(self):
        return self.ledger.tasks(time.monotonic() - self.started)

    def coverage(self) -> dict[str, Any]:
        return self.ledger.coverage()

    def html_summary(self):
        return self.tasks(), self.verdict_dicts(), self.coverage(), self.sensitivity()

    def sensitivity(self) -> list[Any]:
        """The sensitivity tables of the run's robustness axes (``hud_axis``), pooled and per task;
        empty for a run without axes. Holm's alpha, the coverage rule and each task's metric are the gate's."""
        if self._sensitivity is not None or not self.ledger.has_axes:  # (computed once the run finished)
            return self._sensitivity or []
        from pytest_hud.core.sensitivity import sensitivity_tables  # (the statistics, numpy: for axes only)
        from pytest_hud.gate import metric_for

        records = list(self.records.values())
        config = self.ledger.gate_config
        metrics = {**config.metrics, **self.ledger.metrics}
        scored = {r.task for r in records if metric_for(r.task, metrics) == "score"}
        return sensitivity_tables(records, alpha=config.alpha, per_task=True, min_coverage=config.min_coverage,
                                  score_tasks=scored)

    def verdict_dicts(self) -> dict[str, dict[str, Any]] | None:
        return None if self.verdicts is None else {v.task: v.to_dict() for v in self.verdicts}

    # ------------------------------------------------- the pool service's calls
    def _declare(self, episodes: list[dict[str, Any]], worker: int = 0,
                 deselected: dict[str, list[str]] | None = None,
                 shard: dict[str, Any] | None = None, policies: list[list[Any]] = (),
                 python_path: list[str] = (), hash_policies: dict[str, list[str] | None] | None = None,
                 sims: list[list[Any]] = (), problems: list[str] = ()) -> int:
        self.startup.mark("collected")  # declared once collected: the last worker's counts
        self.pool.add_python_path(python_path)
        self.prestart_policy_servers(policies, worker)  # the policies this worker's tests will ask a server for
        # and the bridges of the sims the workers begin with, the next one's ahead (the rest as the
        # run goes on); each stops once its sim's episodes are reported (see _add)
        if sims:
            self.pool.plan_bridges(sims, first_sims([ep.get("sim") for ep in episodes], self.workers))
        for spec, files in (hash_policies or {}).items():  # every episode's record carries its policy's hash
            self.policy_hashes.start(spec, files)
        with self._lock:
            first = not self.ledger.declared and self.ledger.shard is None
            count = self.ledger.declare(episodes, deselected or {}, shard, sims)
            problems = list(problems)
            if first:
                problems += self._declaration_problems()
            if problems and self.usage_error is None:
                self.usage_error = "\n".join(problems)
        if self.usage_error is not None:
            from pytest_hud.wire.jsonrpc import RpcError

            raise RpcError(self.usage_error, data={"usage_error": True})
        with self._lock:
            if shard is not None and "shard" not in self.provenance:
                # Declared before any episode lands, so the results file's header carries it.
                from pytest_hud.core.shard import suite_fingerprint

                suite = self.ledger.shard["suite"]
                self.provenance["shard"] = {
                    "index": self.ledger.shard["index"], "count": self.ledger.shard["count"],
                    "episodes": len(self.ledger.declared),
                    "suite": {"episodes": sum(map(len, suite.values())), "fingerprint": suite_fingerprint(suite),
                              "tasks": suite},
                }
        if first and (self.ledger.declared or self.ledger.shard is not None) and self.results_path is not None:
            # The header (with the declared episodes) goes out before any episode runs.
            threading.Thread(target=self._write, name="hud-results-header", daemon=True).start()
        return count

    def _declaration_problems(self) -> list[str]:
        """What makes the declared run ungateable: gate-file floors that match none of its tasks."""
        from pytest_hud.gate import floors_problem

        problem = floors_problem(self.ledger.gate_config.floors, self.ledger.collected_tasks())
        return [problem] if problem else []

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodeready(self, node: Any) -> None:
        self.startup.mark("workers_up")  # the last worker's counts

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """A worker's declaration was refused: stop here, before any test is scheduled (exit 4).
        Else xdist's copy of each worker's collection shares the ledger's (interned) test ids."""
        if self.usage_error is not None:
            raise pytest.UsageError(self.usage_error)
        if isinstance(ids, list):
            ids[:] = [sys.intern(i) if isinstance(i, str) else i for i in ids]

    def prestart_at_configure(self, collect_only: bool = False) -> None:
        """With ``--hud-policy-server`` and a LeRobot checkpoint named by ``--hud-policy`` on the
        command line (which beats markers and ini): start its servers now, one per replica, before
        the workers even collect, so that the server's imports and load (seconds) overlap pytest's
        start-up. A factory waits for the declarations, which bring the import paths its module
        needs. Without a checkpoint named, and with LeRobot installed, a standby interpreter imports
        torch and LeRobot meanwhile (:meth:`pytest_hud.controller.pool.SimPool.warm_policy_server`). Nothing
        starts for ``--collect-only``. A run whose tests turn out not to ask for the server (none
        uses ``robot_agent``) leaves it idle until the run ends. A standby bridge starts the same way
        (:meth:`pytest_hud.controller.pool.SimPool.warm_bridge`), since most runs step a sim."""
        if collect_only:
            return
        self.pool.warm_bridge()  # the first bridge's imports overlap the workers' start-up
        spec = self.settings.policy_cli
        if not self.settings.policy_server:
            return
        from pytest_hud.core.specs import looks_like_lerobot_checkpoint  # reads a JSON file; no numpy, no torch

        if spec and looks_like_lerobot_checkpoint(Path(spec).expanduser()):
            for worker in range(min(self.settings.policy_replicas, self.workers)):
                self.prestart_policy_servers([spec], worker)  # worker i uses replica i mod replicas
            return
        import importlib.util

        if importlib.util.find_spec("lerobot") is not None:
            # Which policy is only known once a worker has collected (a second or more on a busy
            # machine), but with LeRobot installed it most likely needs torch and LeRobot: a standby
            # imports them meanwhile and becomes the first policy server started.
            self.pool.warm_policy_server()

    def prestart_policy_servers(self, specs: Iterable[str | list[Any]], worker: int = 0) -> None:
        """With ``--hud-policy-server``: start the servers of ``specs`` (each a spec, or a spec and
        the rename map its tests feed it) for ``worker``'s replica now, while the sims boot
        (:meth:`pytest_hud.controller.pool.SimPool.prestart_policy_server`)."""
        if not self.settings.policy_server:
            return
        from pytest_hud.agent.model import PolicyError, check_policy_spec

        for entry in specs:
            spec, rename = (entry, None) if isinstance(entry, str) else (entry[0], entry[1])
            try:
                if check_policy_spec(spec).kind != "url":  # a ws:// policy is someone else's server
                    self.pool.prestart_policy_server(spec, worker, rename)
            except PolicyError:
                pass  # the test that uses it reports the bad spec

    def _policy_hash(self, spec: str, files: list[str] | None = None) -> str | None:
        return self.policy_hashes.get(spec, files)

    def _resume_lookup(self, task: str, episode: str, identity: dict[str, Any]) -> dict[str, Any] | None:
        return self.ledger.resume_lookup(task, episode, identity)

    def _sequential(self, task: str) -> str:
        with self._lock:
            return self.ledger.decision(task)

    # ---------------------------------------------------------------- hooks
    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report: pytest.TestReport, config: pytest.Config):
        from pytest_hud.core.classify import episode_teststatus

        return episode_teststatus(report)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport):
        self._record_report(report)  # before any other plugin sees the report
        try:
            return (yield)
        finally:
            self._lightener.seen(report)

    def _record_report(self, report: pytest.TestReport) -> None:
        data = getattr(report, "hud_episode", None)
        worker = getattr(getattr(report, "node", None), "gateway", None)  # (None without xdist)
        if data:
            record = EpisodeRecord.from_dict(data)
            if worker is not None:
                record.worker = worker.id
            self._add(record)
            return
        if report.failed and not self.ledger.is_declared(report.nodeid):
            self.other_failures += 1  # an ordinary test failed: the gate does not excuse that
        if report.failed and report.when not in ("setup", "call", "teardown"):
            # xdist's report for an item whose worker crashed mid-test ("???")
            lines = str(report.longrepr).strip().splitlines()
            if worker is not None:
                self._videos.release(worker.id)  # the video its episode took and never made
            record = self.ledger.crashed(report.nodeid, lines[0] if lines else "")
            if record is not None:
                self._add(record)
                report.hud_episode = record.to_dict()  # counted as an error

    def _add(self, record: EpisodeRecord) -> None:
        if not record.reused:
            record.finished_at = time.time()
            self.startup.first("first_result", now := time.monotonic())
            self.startup.first("first_episode_started", now - record.before_report_s)
        with self._lock:
            finished = self.ledger.add(record)
        if finished is not None:  # the last declared episode of a sim: its bridges have nothing left to run
            self.pool.finish_bridges(*finished)
        writer = self._write()  # (takes its own lock, then the books': never the other way round)
        if writer is not None:
            with self._writer_lock:
                writer.episode(record)
        self._progress()

    def _progress(self) -> None:
        """Every few seconds and at the last declared episode, one line: episodes done of the total,
        rate, time left, each task's running success with its interval (:mod:`.progress`); the same
        line goes into the results file as a ``progress`` record, for tools that tail it."""
        interval, now = self.settings.progress_interval or 0, time.monotonic()
        last = self.ledger.reported == len(self.ledger.declared) > 0
        if interval <= 0 or (now - self._last_progress < interval and not last):
            return
        self._last_progress = now
        with self._lock:
            progress = self.ledger.progress(time.time())
        writer = self.writer
        if writer is not None:
            with self._writer_lock:
                writer.progress(progress_record(progress))
        write_progress(self.config.pluginmanager.get_plugin("terminalreporter"), progress.line())

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if session.config.option.collectonly or self.usage_error is not None:
            return  # nothing ran: no verdicts, no files (and no imports racing the pool's threads)
        from pytest_hud.gate import gate_passed
        from pytest_hud.report.junit import add_gate_cases
        from pytest_hud.worker.keys import worker_session  # (not the session module: numpy, the client)

        in_process = worker_session(self.config)
        if in_process is not None:
            in_process.close_recorders()  # -n 0: this process recorded; finish before merging
        if self.settings.record:
            from pytest_hud.controller.recordings import merged_recording

            self.recording = merged_recording(self.settings.record)
        if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and self._empty_shard():
            # More shards than episodes (a SLURM array or CI matrix sized for a bigger suite): this
            # shard has nothing of its own to run. That is not a failure; its (empty) file is written.
            session.exitstatus = pytest.ExitCode.OK
        self.verdicts = self.ledger.verdicts()
        if self.verdicts is not None:
            passed = gate_passed(self.verdicts, strict=self.settings.strict) and not self.other_failures
            if exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED):
                # Failed episodes are data: the gate, not single episodes, decides the run.
                session.exitstatus = pytest.ExitCode.OK if passed else pytest.ExitCode.TESTS_FAILED
            add_gate_cases(self.config, self.verdicts, strict=self.settings.strict)
        gate = [v.to_dict() for v in self.verdicts] if self.verdicts is not None else None
        tables = self._sensitivity = self.sensitivity()
        if self.ledger.reported or self.ledger.declared or self.ledger.shard is not None:
            # (A shard with no episodes of its own still writes its file: the merge expects it.)
            self._step_summary()
            writer = self._write()
            if writer is not None:
                policies, sims = self.ledger.used()
                writer.summary(self.tasks(), self.coverage(),
                               dict(self.provenance, policies=policies, sims=self._with_bridges(sims),
                                    startup=self.startup.to_dict(self.pool.launches)), gate,
                               sensitivity=[t.to_dict() for t in tables])
                self.baseline_note = settle_baseline(self.writer, self.results_path, self.baseline_path,
                                                     session.exitstatus)
            if self.settings.html:
                from pytest_hud.report.html import write_standalone_page

                write_standalone_page(self.settings.html, self.tasks(), list(self.records.values()),
                                      verdicts=self.verdict_dicts(), coverage=self.coverage(),
                                      title="pytest-hud report", sensitivity=tables)

    def _with_bridges(self, sims: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each sim with how its bridges ran it (what ``auto`` chose for vectorization and ticks)."""
        bridges = self.pool.bridges()
        roots = [self.config.rootpath, self.config.invocation_params.dir]
        for entry in sims:
            ran = [{"group": b["group"], "vectorization": b["vectorization"], "tick": b["tick"]}
                   for b in bridges
                   if portable_spec(b["target"], roots) == entry["sim"] and b["build"] == entry["build"]]
            if ran:
                entry["bridges"] = ran
        return sims

    def _empty_shard(self) -> bool:
        """A ``--hud-shard`` run of a non-empty suite whose partition gave this shard no episode."""
        shard = self.ledger.shard
        return shard is not None and any(shard["suite"].values()) and not self.ledger.declared


    def _step_summary(self) -> None:
        """Append the markdown summary to $GITHUB_STEP_SUMMARY (GitHub Actions' job page)."""
        path = os.environ.get("GITHUB_STEP_SUMMARY")
        if not path:
            return
        from pytest_hud.report.markdown import summary_markdown

        text = summary_markdown(self.tasks(), self.verdict_dicts(), self.coverage(), title="pytest-hud results",
                                sensitivity=[t for t in self.sensitivity() if t.scope == "pooled"])
        try:
            with open(path, "a", encoding="utf-8") as fh:
                fh.write(text.rstrip() + "\n\n")
        except OSError as exc:
            self.config.issue_config_time_warning(pytest.PytestWarning(f"cannot write $GITHUB_STEP_SUMMARY: {exc}"), 2)

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        s = self.settings
        where = f"attached to {s.sim_url}" if s.sim_url else self.pool.launcher.describe()
        return [
            f"hud: sim={s.sim or '(per test)'} width={self.width} workers={self.workers} tick={s.tick} "
            f"policy={s.policy or '(per test)'} ({where})",
        ] + ([f"hud: results -> {self.results_path}"] if self._spool is None and self.results_path else []) + (
            [f"hud: shard {s.shard_spec} (a stable partition of the suite's episodes)"] if s.shard else [])

    def pytest_terminal_summary(self, terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
        if self._empty_shard():
            terminalreporter.write_line(
                f"hud: shard {self.settings.shard_spec} has no episodes of its own (the suite's "
                f"{sum(map(len, self.ledger.shard['suite'].values()))} episodes went to other shards); "
                f"its results file is written for the merge")
        if self.usage_error is not None or (not self.ledger.reported and not self.ledger.declared):
            return
        from pytest_hud.report.terminal import write_summary

        write_summary(terminalreporter, self.tasks(), self.verdicts, self.coverage(),
                      results=str(self.writer.path) if self.writer is not None and self._spool is None else None,
                      recording=self.recording, baseline=self.settings.baseline,
                      other_failures=self.other_failures, strict=self.settings.strict,
                      baseline_note=self.baseline_note,
                      sensitivity=[t for t in self.sensitivity() if t.scope == "pooled"
                                   or self.config.get_verbosity() > 0],
                      notes=list(self.pool.notes) + (
                          self.pool.stepping_notes() if exitstatus != pytest.ExitCode.INTERRUPTED else []))
        terminalreporter.write_line(f"startup (s since pytest started): {self.startup.line(self.pool.launches)}")

    def stop(self) -> None:
        if self._old_sigterm is not None:
            signal.signal(signal.SIGTERM, self._old_sigterm)
        self.service.close()
        self.pool.stop_all()
        self.policy_hashes.close()
        if self.writer is not None:
            self.writer.close()
        if self._spool is not None:
            self._spool.cleanup()


def _launcher(settings: HudSettings, spec: Any) -> Any:
    """The launcher backend this run asks for: Ray (``--hud-ray``), static endpoints, or None (local)."""
    from pytest_hud.launch.launcher import BRIDGES_ENV, POLICY_SERVERS_ENV, LaunchError, StaticLauncher

    try:
        if settings.ray:
            from pytest_hud.launch.ray import RayLauncher  # Ray is imported here only

            resources = settings.resources
            return RayLauncher(settings.ray, bridge_resources=resources["bridge"],
                               policy_resources=resources["policy"], lease=settings.lease, cwd=spec.cwd,
                               python_path=spec.python_path)
        if os.environ.get(BRIDGES_ENV) or os.environ.get(POLICY_SERVERS_ENV):
            return StaticLauncher(cwd=spec.cwd)
    except LaunchError as exc:
        raise pytest.UsageError(str(exc)) from None
    return None
