"""Per-episode records, per-task aggregates, and the results file (``pytest-hud/results/1``).

The results file is JSON Lines so that nothing finished is lost: every episode is appended (and
flushed to disk) the moment its report reaches the controller, and a crash leaves a valid file.

    {"record": "run", "schema": "pytest-hud/results/1", "run_id": ..., "started": ..., "provenance": {...},
     "declared": {TASK: [episode ids]}, "deselected": {TASK: [episode ids]}}
    {"record": "episode", "task": "evals/test_cartpole.py::test_balance", "episode": "7", "seed": 7,
     "outcome": "passed", "success": true, "score": 1.0, "total_reward": 500.0, "steps": 500, ...}
    ...
    {"record": "progress", "line": "hud progress: 2 of 50 episodes done, ...", ...}   (every few seconds)
    {"record": "summary", "tasks": {TASK: {n, successes, success_rate, ci_low, ci_high, ...}},
     "coverage": {...}, "gate": {...} | null, "provenance": {...}}

The run record is written before the first episode runs and lists every episode the run declared
(after ``-k``/``-m``; ``deselected`` lists the ones those left out), so a file is interpretable
without its summary: a killed run's file is *incomplete* (:attr:`Results.complete`), and what it
did not finish is known. A shard's file (``--hud-shard I/N``) says so in its provenance
(:attr:`Results.shard`).

``load_results(path)`` reads it back (a file without a summary line, from a killed run, loads too).
"""

from __future__ import annotations

import functools
import json
import math
import os
import threading
import time
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

from pytest_hud.stats.wilson import wilson_interval

__all__ = [
    "SCHEMA",
    "EpisodeRecord",
    "EpisodeResult",
    "Results",
    "ResultsWarning",
    "ResultsWriter",
    "TaskSummary",
    "aggregate",
    "gate_input_problem",
    "load_results",
    "to_builtin",
]

SCHEMA = "pytest-hud/results/1"
OUTCOMES = ("passed", "failed", "error", "skipped")


class ResultsWarning(UserWarning):
    """A record carries fields this version of pytest-hud does not know (a newer one wrote it)."""


def _split_known(cls: type, data: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    known = cls.__dataclass_fields__
    return ({k: v for k, v in data.items() if k in known}, {k: v for k, v in data.items() if k not in known})


def _warn_unknown(what: str, names: Iterable[str], consequence: str) -> None:
    names = sorted(names)
    if names:
        warnings.warn(ResultsWarning(
            f"{what} fields this version of pytest-hud does not know: {', '.join(names)}; {consequence}"
            " (a newer pytest-hud wrote them: upgrade to read them)"), stacklevel=3)


_PLAIN = frozenset({str, bool, int, type(None)})  # exact types that are their own builtin form


def to_builtin(value: Any) -> Any:
    """Recursively convert numpy scalars/arrays, dataclasses and other oddities to JSON-able
    builtins (new containers throughout: the result shares nothing mutable with ``value``)."""
    kind = type(value)  # the exact builtin types first: a record's fields are nearly all of them
    if kind in _PLAIN:
        return value
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is dict:
        return {k if type(k) is str else str(k): to_builtin(v) for k, v in value.items()}
    if kind is list or kind is tuple:
        return [to_builtin(v) for v in value]
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): to_builtin(v) for k, v in value.items()}
    if is_dataclass(value) and not isinstance(value, type):
        return _fields_builtin(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_builtin(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    item = getattr(value, "item", None)  # numpy scalars and 0-d arrays
    if callable(item) and getattr(value, "ndim", 0) == 0:
        return to_builtin(item())
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return to_builtin(tolist())
    return str(value)


@functools.cache
def _field_names(cls: type) -> tuple[str, ...]:
    """The names of a dataclass's fields, in order (looked up once per class: records are made
    and written per episode)."""
    return tuple(f.name for f in fields(cls))


def _fields_builtin(obj: Any) -> dict[str, Any]:
    """A dataclass's fields as builtins: :func:`dataclasses.asdict` without its deep copy, which
    :func:`to_builtin` makes needless (an episode's record is written twice per episode)."""
    return {name: to_builtin(getattr(obj, name)) for name in _field_names(type(obj))}


@dataclass
class EpisodeResult:
    """What one episode did: the one result type from the bridge's grade to the results line.

    The bridge grades a slot into one (:meth:`pytest_hud.bridge.slots.Slot.result`; it crosses the
    control channel as :meth:`to_dict`); the worker's episode completes it with what only the worker
    knows (:meth:`completed`: the duration, the policy's time, artefacts, an error of the agent's) and
    hands it back from ``robot_agent.run``; the worker's :class:`EpisodeRecord` of the test takes its
    fields from it (:meth:`EpisodeRecord.take_result`), so each field has one name and one meaning all
    the way to the results file. Builtin types only, so it crosses the xdist channel as it is.
    """

    success: bool
    score: float
    total_reward: float
    steps: int
    duration_s: float = 0.0
    slot: int | None = None
    seed: int | None = None
    prompt: str | None = None
    success_at_reset: bool = False
    terminated: bool = False
    truncated: bool = False
    error: str | None = None
    inference_s: float = 0.0
    artefacts: dict[str, str] = field(default_factory=dict)
    #: seconds the worker spent after the grade replaying the episode for its video or trace
    replay_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The fields as a new dict (builtin types already: only ``artefacts`` is copied)."""
        data = {name: getattr(self, name) for name in _field_names(EpisodeResult)}
        data["artefacts"] = dict(self.artefacts)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EpisodeResult:
        """The result a bridge's ``result(token)`` answered (fields it does not send keep their defaults;
        besides the claim's ``task``, which the episode keeps itself, fields it sends that this version
        does not know are named in a :class:`ResultsWarning`)."""
        known, unknown = _split_known(cls, data)
        unknown.pop("task", None)
        _warn_unknown("the bridge's episode result has", unknown, "they are not recorded")
        return cls(**known)

    def completed(self, *, duration_s: float, inference_s: float = 0.0, error: str | None = None,
                  artefacts: Mapping[str, str] | None = None, slot: int | None = None,
                  seed: int | None = None, prompt: str | None = None) -> EpisodeResult:
        """This grade completed by the worker: an error of its own makes the episode unsuccessful."""
        return replace(
            self, success=bool(self.success) and error is None, duration_s=float(duration_s),
            inference_s=float(inference_s), error=error or self.error, artefacts=dict(artefacts or {}),
            slot=self.slot if slot is None else slot, seed=self.seed if seed is None else seed,
            prompt=self.prompt if prompt is None else prompt)


@dataclass
class EpisodeRecord:
    """One episode test's record: the one shape from the worker's grade to the results line and back.

    The worker makes it (:func:`pytest_hud.core.classify.episode_record`) and sends it on the test's
    report as :meth:`to_dict` (builtin types: it crosses the xdist channel); the controller reads it
    back with :meth:`from_dict`, adds it to the ledger and writes it as one results line;
    :func:`load_results` reads the line back into the same record. Fields this version does not know
    (a newer pytest-hud wrote the file) are kept in :attr:`unknown`, named in a
    :class:`ResultsWarning`, and written back as they were.
    """

    task: str
    episode: str
    nodeid: str
    outcome: str  # passed | failed | error | skipped
    seed: int | None = None
    success: bool | None = None  # the test's outcome (passed): what the summary and the gate count
    score: float | None = None  # the sim's graded score in [0, 1] (its info["score"], else 1/0 from its success)
    #: the sim's own success as the bridge graded it (``info["is_success"]``), beside the test's
    #: outcome; None where no grade came back (an error before the episode ended, an old file)
    sim_success: bool | None = None
    total_reward: float | None = None
    steps: int | None = None
    duration_s: float | None = None
    slot: int | None = None
    worker: str | None = None
    error: str | None = None
    skip_reason: str | None = None  # why a skipped episode was skipped (skip/skipif reason)
    reused: bool = False
    finished_at: float | None = None  # epoch seconds when the controller received it
    artefacts: dict[str, str] = field(default_factory=dict)
    identity: dict[str, Any] = field(default_factory=dict)
    contract: str | None = None  # the bridge's contract as the episode saw it (Contract.signature)
    #: what defines the episode (seed, the sim's task, options, build, prompt): a claim with these
    #: on the same sim runs it again (:meth:`pytest_hud.client.episode.Episode.definition`)
    claim: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    #: robustness axes of the episode's test: axis -> {"level", "index", "reference", "task"}
    #: (:mod:`pytest_hud.core.sensitivity`); empty for tests without ``hud_axis``
    axes: dict[str, Any] = field(default_factory=dict)
    #: fields of the line this version does not know, kept as they are (not a field of the line itself)
    unknown: dict[str, Any] = field(default_factory=dict)

    def take_result(self, result: EpisodeResult, *, graded_only: bool = False) -> None:
        """Fill the fields the episode's result knows (``extra`` holds what the gate does not read).

        ``graded_only``: the bridge graded the episode but the worker never completed it (the test
        failed before the agent returned): the record keeps the test's own duration and artefacts.
        """
        self.score, self.total_reward, self.steps, self.slot = (
            result.score, result.total_reward, result.steps, result.slot)
        self.sim_success = result.success
        self.extra["env_success"] = result.success
        if graded_only:
            return
        self.duration_s = result.duration_s
        self.artefacts = dict(result.artefacts)
        self.extra.update(success_at_reset=result.success_at_reset, inference_s=result.inference_s,
                          terminated=result.terminated, truncated=result.truncated)
        if result.replay_s:
            self.extra["replay_s"] = result.replay_s
        if self.seed is None and result.seed is not None:
            self.seed = result.seed

    @property
    def before_report_s(self) -> float:
        """Seconds from the episode's start to its report: its duration and the replay its worker
        ran after it (for a video) before reporting."""
        return (self.duration_s or 0.0) + float(self.extra.get("replay_s") or 0.0)

    @property
    def started_at(self) -> float | None:
        """Epoch seconds when the episode started (its report's arrival less :attr:`before_report_s`);
        None without timestamps."""
        if self.finished_at is None or self.duration_s is None:
            return None
        return self.finished_at - self.before_report_s

    @property
    def sim_checked(self) -> bool:
        """A passed episode whose sim's own success is known, of a test that grades success: one the
        summary checks against the sim (not a ``hud(graded=False)`` smoke test's)."""
        return (bool(self.success) and self.sim_success is not None
                and self.identity.get("graded") is not False)

    def to_dict(self) -> dict[str, Any]:
        """The record as builtin types: its fields, then the unknown ones it was read with."""
        data = _fields_builtin(self)
        unknown = data.pop("unknown")
        return {**data, **{k: v for k, v in unknown.items() if k not in data}}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, warn: bool = True) -> EpisodeRecord:
        """The record ``data`` describes; keys it does not know go to :attr:`unknown` and, unless
        ``warn`` is false (the caller reports them itself), into a :class:`ResultsWarning`."""
        known, unknown = _split_known(cls, data)
        unknown = {**dict(known.pop("unknown", None) or {}), **unknown}  # a record's own dict() keeps its name
        if warn:
            _warn_unknown("an episode record has", unknown, "kept as they are")
        return cls(**known, unknown=unknown)


@dataclass
class TaskSummary:
    task: str
    n: int  # graded episodes (passed + failed)
    successes: int
    errors: int
    skipped: int
    declared: int
    success_rate: float | None
    ci_low: float
    ci_high: float
    mean_return: float | None
    mean_steps: float | None
    episodes_per_hour: float | None
    reused: int = 0
    sim_checked: int = 0  # passed episodes whose record carries the sim's own success
    sim_successes: int = 0  # of those, the ones the sim graded a success

    def to_dict(self) -> dict[str, Any]:
        return _fields_builtin(self)


def aggregate(
    episodes: Iterable[EpisodeRecord],
    declared: Mapping[str, int] | None = None,
    wall_s: float | None = None,
) -> dict[str, TaskSummary]:
    """Per-task success rate with a 95% Wilson interval, errors, mean return and throughput.

    Errors are not failures: they are excluded from ``n`` and counted separately (coverage).
    ``episodes_per_hour`` is the task's own throughput: its episodes over the span from its first
    episode's start to its last one's end (:attr:`EpisodeRecord.started_at`); without timestamps, over
    ``wall_s`` (the run's wall time) when given, else over the summed durations.
    """
    by_task: dict[str, list[EpisodeRecord]] = {}
    for rec in episodes:
        by_task.setdefault(rec.task, []).append(rec)
    for task in declared or {}:
        by_task.setdefault(task, [])
    out: dict[str, TaskSummary] = {}
    for task, recs in sorted(by_task.items()):
        graded = [r for r in recs if r.outcome in ("passed", "failed") and r.success is not None]
        n = len(graded)
        successes = sum(1 for r in graded if r.success)
        low, high = wilson_interval(successes, n)
        returns = [r.total_reward for r in graded if r.total_reward is not None]
        steps = [r.steps for r in graded if r.steps is not None]
        ran = [r for r in recs if not r.reused and r.outcome != "skipped"]
        stamped = [r for r in ran if r.started_at is not None]
        if stamped and len(stamped) == len(ran):
            busy = max(r.finished_at for r in stamped) - min(r.started_at for r in stamped)
        else:
            busy = wall_s if wall_s else sum(r.duration_s or 0.0 for r in ran)
        out[task] = TaskSummary(
            task=task,
            n=n,
            successes=successes,
            errors=sum(1 for r in recs if r.outcome == "error"),
            skipped=sum(1 for r in recs if r.outcome == "skipped"),
            declared=max(int((declared or {}).get(task, 0)), len(recs)),
            success_rate=successes / n if n else None,
            ci_low=low,
            ci_high=high,
            mean_return=sum(returns) / len(returns) if returns else None,
            mean_steps=sum(steps) / len(steps) if steps else None,
            # none for a task whose episodes all errored: failing fast is no throughput
            episodes_per_hour=len(ran) * 3600.0 / busy if busy and ran and graded else None,
            reused=sum(1 for r in recs if r.reused),
            sim_checked=sum(1 for r in graded if r.sim_checked),
            sim_successes=sum(1 for r in graded if r.sim_checked and r.sim_success),
        )
    return out


@dataclass
class Results:
    """A results file read back."""

    run: dict[str, Any]
    episodes: list[EpisodeRecord]
    summary: dict[str, Any] | None
    path: str | None = None

    @property
    def complete(self) -> bool:
        """False for a file left by a killed run (no summary line)."""
        return self.summary is not None

    @property
    def shard(self) -> dict[str, Any] | None:
        """``{"index", "count", ...}`` for one shard's file (``--hud-shard I/N``), else None."""
        shard = (self.run.get("provenance") or {}).get("shard")
        return shard if isinstance(shard, dict) else None

    def declared_episodes(self) -> dict[str, list[str]] | None:
        """Task -> the episode ids the run declared (its header); None for a file that predates it."""
        declared = self.run.get("declared")
        if not isinstance(declared, dict):
            return None
        return {str(t): [str(e) for e in eps] for t, eps in declared.items()}

    def deselected_episodes(self) -> dict[str, list[str]]:
        """Task -> the episode ids that ``-k``/``-m`` deselected in the run (its header)."""
        deselected = self.run.get("deselected")
        if not isinstance(deselected, dict):
            return {}
        return {str(t): [str(e) for e in eps] for t, eps in deselected.items()}

    def tasks(self) -> dict[str, TaskSummary]:
        declared = None
        if self.summary:
            declared = {t: s.get("declared", 0) for t, s in self.summary.get("tasks", {}).items()}
        elif self.declared_episodes() is not None:  # an incomplete file: its header says what was meant to run
            declared = {t: len(eps) for t, eps in (self.declared_episodes() or {}).items()}
        return aggregate(self.latest_episodes(), declared)

    def latest_episodes(self) -> list[EpisodeRecord]:
        """One record per (task, episode): the last one written wins (reruns, resumes)."""
        latest: dict[tuple[str, str], EpisodeRecord] = {}
        for rec in self.episodes:
            latest[(rec.task, rec.episode)] = rec
        return list(latest.values())

    @property
    def provenance(self) -> dict[str, Any]:
        if self.summary and self.summary.get("provenance"):
            return self.summary["provenance"]
        return self.run.get("provenance", {})


def gate_input_problem(results: Results, side: str, *, allow_incomplete: bool = False,
                       allow_flag: str = "--hud-allow-incomplete-baseline") -> str | None:
    """Why ``results`` cannot be one ``side`` of a gate ("baseline" or "results"); None when it can.

    One shard's file is never gated (the merged file of all shards is); a baseline without its
    summary line (a killed or still running pytest) is refused unless ``allow_incomplete``, since
    what it lacks would be compared as if it had never been declared. A results file without its
    summary is fine: its header's declared episodes count what it did not finish.
    """
    name = results.path or "the file"
    shard = results.shard
    if shard is not None:
        return (f"{name} is the results file of one shard ({shard.get('index')}/{shard.get('count')}) of a"
                f" sharded suite: a gate compares whole suites. Merge the shards first,"
                f" `python -m pytest_hud merge SHARD.jsonl ... -o ALL.jsonl`, and use ALL.jsonl as the {side}")
    if side == "baseline" and not results.complete and not allow_incomplete:
        return (f"{name} is incomplete: it has no summary line (its run was killed, or is still running), so"
                f" the episodes it lacks are unknown as a baseline. Use a finished run's file, or pass"
                f" {allow_flag} to gate against the {len(results.latest_episodes())} episodes it has")
    return None


def load_results(path: str | os.PathLike[str]) -> Results:
    """Read a results file; raises ``ValueError`` naming the line when it is not ours."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"results file {str(path)!r} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"{str(path)!r} is a directory, not a results file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read results file {str(path)!r}: {exc}") from None
    run: dict[str, Any] = {}
    episodes: list[EpisodeRecord] = []
    unknown: set[str] = set()
    summary: dict[str, Any] | None = None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            if lineno == len(text.splitlines()):
                break  # a torn last line from a killed run: everything before it stands
            raise ValueError(f"{path}:{lineno} is not JSON") from None
        kind = rec.get("record") if isinstance(rec, dict) else None
        if kind == "run":
            if rec.get("schema") != SCHEMA:
                raise ValueError(f"{path} has schema {rec.get('schema')!r}, expected {SCHEMA!r}")
            run = rec
        elif kind == "episode":
            episodes.append(EpisodeRecord.from_dict({k: v for k, v in rec.items() if k != "record"}, warn=False))
            unknown.update(episodes[-1].unknown)
        elif kind == "summary":
            summary = rec
        elif kind == "progress":
            continue  # the live progress line, for tools that tail the file
        else:
            raise ValueError(f"{path}:{lineno} is not a pytest-hud results record")
    if not run:
        raise ValueError(f"{path} is not a pytest-hud results file (no 'run' record first)")
    _warn_unknown(f"{path}: its episode records have", unknown, "kept as they are")
    return Results(run=run, episodes=episodes, summary=summary, path=str(path))


class ResultsWriter:
    """Appends records to the results file, flushing each episode as it lands and fsyncing it soon after.

    Each line is written and flushed at once, so a killed run loses nothing it finished; the
    fsync that carries it to the disk runs on a thread of its own, so the run never waits on the
    disk for it, and at most once every ``sync_interval`` seconds (lines written meanwhile share
    the next): a thread woken for every episode would contend for the GIL with the one that runs
    them (a serial run of 200 CartPole episodes took 7.2-7.9 s with an fsync per episode, 5.3 s
    with one a second). A machine that loses power may lose the last interval's lines; a killed
    run loses none. :meth:`close` waits for the last fsync."""

    sync_interval = 1.0

    def __init__(self, path: str | os.PathLike[str], provenance: Mapping[str, Any], run_id: str,
                 append: bool = False, declared: Mapping[str, Iterable[str]] | None = None,
                 deselected: Mapping[str, Iterable[str]] | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        mode = "a" if append and self.path.exists() else "w"
        if mode == "a":
            _drop_torn_tail(self.path)  # a killed run may have left half a line: never glue onto it
        self._fh = open(self.path, mode, encoding="utf-8")
        self._unsynced = threading.Condition()  # guards _dirty; wakes the syncer
        self._dirty = False
        self._closed = threading.Event()  # set by close(): also ends the syncer's pause between fsyncs
        self._syncer = threading.Thread(target=self._sync_loop, name="hud-results-fsync", daemon=True)
        self._syncer.start()
        if mode == "w":
            header: dict[str, Any] = {"record": "run", "schema": SCHEMA, "run_id": run_id,
                                      "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                                      "provenance": to_builtin(dict(provenance))}
            if declared is not None:
                header["declared"] = {str(t): [str(e) for e in eps] for t, eps in sorted(declared.items())}
                header["deselected"] = {str(t): [str(e) for e in eps] for t, eps in sorted((deselected or {}).items())}
            self._write(header)

    def _write(self, obj: Mapping[str, Any]) -> None:
        self._fh.write(json.dumps(obj, sort_keys=False) + "\n")
        self._fh.flush()
        with self._unsynced:
            if not self._dirty:
                self._dirty = True
                self._unsynced.notify()

    def _sync_loop(self) -> None:
        fd = self._fh.fileno()
        while True:
            with self._unsynced:
                while not (self._dirty or self._closed.is_set()):
                    self._unsynced.wait()
                if not self._dirty:
                    return
                self._dirty = False
            try:
                os.fsync(fd)
            except OSError:  # a file that cannot be synced (a pipe, some network mounts): written all the same
                return
            self._closed.wait(self.sync_interval)  # the next fsync after an interval, at once on close

    def episode(self, record: EpisodeRecord) -> None:
        self._write({"record": "episode", **record.to_dict()})

    def progress(self, record: Mapping[str, Any]) -> None:
        """A live progress record (``{"record": "progress", ...}``); readers skip it."""
        self._write(to_builtin(dict(record)))

    def summary(self, tasks: Mapping[str, TaskSummary], coverage: Mapping[str, Any],
                provenance: Mapping[str, Any], gate: Any = None, sensitivity: Any = None) -> None:
        self._write({
            "record": "summary",
            "schema": SCHEMA,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "tasks": {t: s.to_dict() for t, s in tasks.items()},
            "coverage": to_builtin(dict(coverage)),
            "gate": to_builtin(gate),
            **({"sensitivity": to_builtin(sensitivity)} if sensitivity else {}),
            "provenance": to_builtin(dict(provenance)),
        })

    def close(self) -> None:
        """Wait for the last fsync, then close the file."""
        if not self._fh.closed:
            self._closed.set()
            with self._unsynced:
                self._unsynced.notify()
            self._syncer.join()
            self._fh.close()


def _drop_torn_tail(path: Path) -> None:
    """Truncate a file back to just after its last newline."""
    with open(path, "rb+") as fh:
        data = fh.read()
        end = data.rfind(b"\n") + 1
        if end < len(data):
            fh.truncate(end)
