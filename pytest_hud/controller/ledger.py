"""The controller's books: declared episodes, episode records, coverage, sequential tests, verdicts.

Pure (no pytest, no I/O, no threads): the controller feeds it what workers declare and what their
reports carry, and asks it for the per-task table, the coverage line, resume matches, sequential
decisions and the gate's verdicts. Every rule about *which* episodes count lives here, so it is
unit-tested with plain function calls.

Its memory does not grow with episode records: per task it keeps running tallies (the summary
table, coverage, the progress line), per episode only the id it was declared and reported under.
Where the records themselves are needed (the gate's pairs, sensitivity tables, the HTML page) it
reads them back from ``read_back``, the controller's reader of the results file it writes; without
one (plain use, unit tests) it keeps them itself.
"""

from __future__ import annotations

import json
import sys
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from pytest_hud.gate import COMPARED, GateConfig, Verdict, outcomes_from_records, outcomes_from_results
from pytest_hud.controller.progress import Progress
from pytest_hud.core.results import EpisodeRecord, Results, TaskSummary, aggregate, to_builtin
from pytest_hud.stats.wilson import wilson_interval

__all__ = ["Ledger"]


class _Tally:
    """One task's running aggregates: what :func:`pytest_hud.core.results.aggregate` computes from
    its records, kept as the records arrive."""

    __slots__ = ("records", "n", "successes", "errors", "skipped", "reused", "returns", "n_returns",
                 "steps", "n_steps", "ran", "stamped", "first_start", "last_finish", "busy", "sim_checked",
                 "sim_successes")

    def __init__(self) -> None:
        self.records = self.n = self.successes = self.errors = self.skipped = self.reused = 0
        self.returns = 0.0
        self.n_returns = self.steps = self.n_steps = self.ran = self.stamped = 0
        self.sim_checked = self.sim_successes = 0  # passed episodes the sim graded, and its successes
        self.first_start: float | None = None
        self.last_finish: float | None = None
        self.busy = 0.0  # summed durations of the episodes that ran

    def add(self, rec: EpisodeRecord) -> None:
        self.records += 1
        self.reused += bool(rec.reused)
        if rec.outcome == "error":
            self.errors += 1
        elif rec.outcome == "skipped":
            self.skipped += 1
        if rec.outcome in ("passed", "failed") and rec.success is not None:
            self.n += 1
            self.successes += bool(rec.success)
            if rec.sim_checked:
                self.sim_checked += 1
                self.sim_successes += bool(rec.sim_success)
            if rec.total_reward is not None:
                self.returns += rec.total_reward
                self.n_returns += 1
            if rec.steps is not None:
                self.steps += rec.steps
                self.n_steps += 1
        if not rec.reused and rec.outcome != "skipped":
            self.ran += 1
            self.busy += rec.duration_s or 0.0
            if (start := rec.started_at) is not None:
                self.stamped += 1
                self.first_start = start if self.first_start is None else min(self.first_start, start)
                self.last_finish = rec.finished_at if self.last_finish is None else max(self.last_finish,
                                                                                         rec.finished_at)

    def summary(self, task: str, declared: int, wall_s: float | None) -> TaskSummary:
        low, high = wilson_interval(self.successes, self.n)
        if self.stamped and self.stamped == self.ran:
            busy = self.last_finish - self.first_start
        else:
            busy = wall_s if wall_s else self.busy
        return TaskSummary(
            task=task, n=self.n, successes=self.successes, errors=self.errors, skipped=self.skipped,
            declared=max(declared, self.records), success_rate=self.successes / self.n if self.n else None,
            ci_low=low, ci_high=high, mean_return=self.returns / self.n_returns if self.n_returns else None,
            mean_steps=self.steps / self.n_steps if self.n_steps else None,
            episodes_per_hour=self.ran * 3600.0 / busy if busy and self.ran and self.n else None,
            reused=self.reused, sim_checked=self.sim_checked, sim_successes=self.sim_successes)


class Ledger:
    """What a run declared and what it reported, and what follows from it.

    ``read_back``: a callable that returns the records this run has written so far (its results
    file read back); given, the ledger keeps no record in memory.
    """

    def __init__(self, gate_config: GateConfig | None = None, baseline: Results | None = None,
                 resumable: Mapping[tuple[str, str], EpisodeRecord] | None = None,
                 sequential: bool = False, gated_by_file: bool = False,
                 read_back: Callable[[], Iterable[EpisodeRecord]] | None = None) -> None:
        self.gate_config = gate_config or GateConfig()
        self.baseline = baseline
        self.baseline_successes: dict[str, dict[str, bool]] = {}  # task -> episode -> success
        if baseline is not None:
            self.baseline_successes = {t: o.successes for t, o in outcomes_from_results(baseline).items()}
        self.resumable = dict(resumable or {})
        self.sequential = sequential
        self.gated_by_file = gated_by_file
        # What each declared episode is, compactly (a run may declare 100,000): nodeid -> index into
        # the task, episode id and (when the seed is not the episode id, or it has axes) seed and axes.
        self.declared: dict[str, int] = {}
        self._task_names: list[str] = []
        self._task_index: dict[str, int] = {}
        self._task_of = array("I")
        self._episode_of: list[str] = []
        self._seed_axes: dict[int, tuple[Any, dict[str, Any] | None]] = {}
        self._declared_counts: dict[str, int] = {}  # task -> declared episodes
        self.deselected_episodes: dict[str, set[str]] = {}  # task -> episode ids deselected with -k/-m
        self._reported = bytearray()  # by declared index: 1 once the episode has a record
        # the sim each declared episode's test steps on a bridge, and how many of each sim's are unreported
        self._sim_of = array("i")  # by declared index: an index into _sim_keys, or -1 (none)
        self._sim_keys: list[tuple[str, str]] = []  # (target, build as sorted JSON)
        self._sim_index: dict[tuple[str, str], int] = {}
        self._sim_left: list[int] = []
        self._reported_other: set[str] = set()  # nodeids with a record that were never declared
        self.reported = 0  # episodes (distinct nodeids) with a record
        self._tallies: dict[str, _Tally] = {}  # task -> running aggregates
        self._stale: set[str] = set()  # tasks whose tallies a replaced record outdated
        self._read_back = read_back
        self._kept: dict[str, EpisodeRecord] | None = None if read_back is not None else {}
        self._read: dict[str, EpisodeRecord] | None = None  # the last read-back, until a record arrives
        self._policies: dict[tuple[Any, Any], dict[str, Any]] = {}
        self._sims: dict[str, dict[str, Any]] = {}
        self._axes = False  # some record has robustness axes
        self.floors: dict[str, float] = {}  # task -> min_success from markers
        self.metrics: dict[str, str] = {}  # task -> hud(metric=...) from markers
        self.shard: dict[str, Any] | None = None  # --hud-shard: {"index", "count", "suite": {task: [episodes]}}
        self._sequential_tests: dict[str, Any] = {}
        self.ran = 0  # episodes that ran here (not skipped, not reused from a resumed file)
        self.first_start: float | None = None  # epoch seconds when the first of them started

    @property
    def records(self) -> dict[str, EpisodeRecord]:
        """Nodeid -> this run's record of it (the last one wins); read back when not kept."""
        if self._kept is not None:
            return dict(self._kept)
        if self._read is None:  # read once for the gate, the tables and the HTML page at the end
            self._read = {}
            for rec in self._read_back():
                self._read[rec.nodeid] = rec
        return dict(self._read)

    @property
    def has_axes(self) -> bool:
        """Some episode's test has robustness axes (``hud_axis``): sensitivity tables exist."""
        return self._axes

    @property
    def deselected(self) -> set[str]:
        """The tasks ``-k``/``-m`` deselected episodes of."""
        return set(self.deselected_episodes)

    # ----------------------------------------------------------------- input
    def declare(self, episodes: Iterable[Mapping[str, Any]],
                deselected: Mapping[str, Iterable[str]] | Iterable[str] = (),
                shard: Mapping[str, Any] | None = None, sims: Sequence[Sequence[Any]] = ()) -> int:
        """Episodes this run will run (after deselection); a worker may declare the same ones again.

        ``deselected``: what ``-k``/``-m`` left out, as task -> episode ids (or just task names).
        ``shard`` (``--hud-shard``): this shard's index and count and the whole suite, so that the
        gate leaves the other shards' episodes out instead of calling them missing.
        ``sims``: ``[target, build]`` of the sims the episodes step on a bridge, an episode's
        ``"sim"`` its index here: :meth:`add` says when the last of a sim's episodes is reported.
        """
        keys = [(str(target), json.dumps(build or {}, sort_keys=True)) for target, build in sims]
        by_task = deselected if isinstance(deselected, Mapping) else {task: () for task in deselected}
        for task, ids in by_task.items():
            self.deselected_episodes.setdefault(str(task), set()).update(str(e) for e in ids)
        if shard is not None and self.shard is None:
            self.shard = {"index": int(shard["index"]), "count": int(shard["count"]),
                          "suite": {str(t): [str(e) for e in eps] for t, eps in dict(shard["suite"]).items()}}
        for ep in episodes:
            nodeid = sys.intern(str(ep["nodeid"]))
            if nodeid not in self.declared:
                task, episode, seed = str(ep["task"]), str(ep["episode"]), ep.get("seed")
                index = len(self._episode_of)
                self.declared[nodeid] = index
                if task not in self._task_index:
                    self._task_index[task] = len(self._task_names)
                    self._task_names.append(task)
                self._task_of.append(self._task_index[task])
                self._episode_of.append(episode)
                self._reported.append(0)
                self._sim_of.append(self._sim_number(keys[ep["sim"]]) if ep.get("sim") is not None else -1)
                if ep.get("axes") or seed is None or str(seed) != episode:
                    self._seed_axes[index] = (seed, dict(ep["axes"]) if ep.get("axes") else None)
                self._declared_counts[task] = self._declared_counts.get(task, 0) + 1
            if ep.get("min_success") is not None:
                self.floors[ep["task"]] = float(ep["min_success"])
            if ep.get("metric") is not None:
                self.metrics[ep["task"]] = str(ep["metric"])
        return len(self.declared)

    def _sim_number(self, key: tuple[str, str]) -> int:
        number = self._sim_index.get(key)
        if number is None:
            number = self._sim_index[key] = len(self._sim_keys)
            self._sim_keys.append(key)
            self._sim_left.append(0)
        self._sim_left[number] += 1
        return number

    def add(self, record: EpisodeRecord) -> tuple[str, str] | None:
        """An episode's record (the last one of a test id wins); feeds its task's sequential test.
        Returns the sim (target, build as sorted JSON) whose last declared episode this was: its
        bridges have nothing left to run."""
        self._read = None
        nodeid = sys.intern(record.nodeid)
        finished = None
        if self._was_reported(nodeid):
            self._stale.add(record.task)  # a rerun: its task's tallies are recounted from the records
        else:
            self.reported += 1
            index = self.declared.get(nodeid)
            if index is None:
                self._reported_other.add(nodeid)
            else:
                self._reported[index] = 1
                sim = self._sim_of[index]
                if sim >= 0:
                    self._sim_left[sim] -= 1
                    finished = self._sim_keys[sim] if not self._sim_left[sim] else None
        if self._kept is not None:
            self._kept[nodeid] = record
        self._tallies.setdefault(sys.intern(record.task), _Tally()).add(record)
        if not record.reused and record.outcome != "skipped" and record.finished_at is not None:
            self.ran += 1
            start = record.finished_at - record.before_report_s
            self.first_start = start if self.first_start is None else min(self.first_start, start)
        ident = record.identity or {}
        if ident.get("policy"):
            self._policies.setdefault((ident["policy"], ident.get("policy_hash")), {
                "policy": ident["policy"], "policy_hash": ident.get("policy_hash")})
        if ident.get("sim"):
            self._sims.setdefault(f"{ident['sim']} {ident.get('build') or ''}",
                                  {"sim": ident["sim"], "build": ident.get("build") or {}})
        self._axes = self._axes or bool(record.axes)
        self._feed_sequential(record)
        return finished

    def crashed(self, nodeid: str, message: str) -> EpisodeRecord | None:
        """The record of a declared episode whose worker died mid-test (None if not an episode)."""
        index = self.declared.get(nodeid)
        if index is None:
            return None
        task, episode, seed, axes = self._ident(index)
        return EpisodeRecord(task=task, episode=episode, nodeid=nodeid, outcome="error", seed=seed,
                             error=(message or "worker crashed")[:2000], axes=dict(axes or {}))

    def _ident(self, index: int) -> tuple[str, str, Any, dict[str, Any] | None]:
        """(task, episode, seed, axes) of the declared episode at ``index``."""
        episode = self._episode_of[index]
        seed, axes = self._seed_axes.get(index, (None, None))
        if index not in self._seed_axes:
            seed = int(episode)
        return self._task_names[self._task_of[index]], episode, seed, axes

    def _was_reported(self, nodeid: str) -> bool:
        index = self.declared.get(nodeid)
        return bool(self._reported[index]) if index is not None else nodeid in self._reported_other

    def is_declared(self, nodeid: str) -> bool:
        return nodeid in self.declared

    def other_shards(self) -> set[tuple[str, str]]:
        """The suite's ``(task, episode)`` pairs that other shards run (empty when not sharded)."""
        if self.shard is None:
            return set()
        from pytest_hud.core.shard import partition

        suite = [(task, ep) for task, eps in self.shard["suite"].items() for ep in eps]
        return {key for key, index in partition(suite, self.shard["count"]).items() if index != self.shard["index"]}

    # ----------------------------------------------------------------- resume
    def resume_lookup(self, task: str, episode: str, identity: Mapping[str, Any]) -> dict[str, Any] | None:
        """The earlier record of this episode, if it ran with exactly this identity (policy, sim, ...)."""
        record = self.resumable.get((task, str(episode)))
        if record is None or to_builtin(record.identity) != to_builtin(dict(identity)):
            return None
        return record.to_dict()

    # ------------------------------------------------------------- sequential
    def decision(self, task: str) -> str:
        """The sequential test's decision for ``task``: regression, pass or undecided."""
        test = self._sequential_tests.get(task)
        return test.decide() if test is not None else "undecided"

    def _feed_sequential(self, record: EpisodeRecord) -> None:
        """Paired, in declared order: each finished episode updates its task's anytime-valid test."""
        base = self.baseline_successes.get(record.task)
        if not self.sequential or base is None or record.outcome == "skipped":
            return
        test = self._sequential_tests.get(record.task)
        if test is None:
            from pytest_hud.stats import SequentialTest

            wanted = self._task_index.get(record.task)
            order = [ep for ix, ep in zip(self._task_of, self._episode_of) if ix == wanted and ep in base]
            tasks = set(self._declared_counts) & set(self.baseline_successes)
            cfg = self.gate_config
            # Bonferroni across the compared tasks keeps the family-wise rate <= alpha.
            test = SequentialTest(alpha=cfg.alpha / max(1, len(tasks)), max_drop=cfg.max_drop,
                                  detect_drop=cfg.detect_drop, paired=True, order=order)
            self._sequential_tests[record.task] = test
        if record.episode in base:
            current = None if record.outcome == "error" else bool(record.success)
            test.record(record.episode, current, base[record.episode])

    # ---------------------------------------------------------------- summary
    def declared_ids(self) -> dict[str, list[str]]:
        """Task -> the episode ids this run declared, in declaration order (the results header)."""
        out: dict[str, list[str]] = {}
        for ix, episode in zip(self._task_of, self._episode_of):
            out.setdefault(self._task_names[ix], []).append(episode)
        return out

    def deselected_ids(self) -> dict[str, list[str]]:
        """Task -> the episode ids ``-k``/``-m`` deselected (the results header)."""
        return {task: sorted(ids) for task, ids in sorted(self.deselected_episodes.items())}

    def collected_tasks(self) -> set[str]:
        """Every task the run collected: declared, deselected, or in another shard."""
        tasks = set(self._declared_counts) | set(self.deselected)
        if self.shard is not None:
            tasks |= set(self.shard["suite"])
        return tasks

    def declared_by_task(self) -> dict[str, int]:
        return dict(self._declared_counts)

    def tasks(self, wall_s: float | None = None) -> dict[str, TaskSummary]:
        """Per task: n, successes, the Wilson interval, errors, throughput (from the running tallies)."""
        if self._stale:
            stale, self._stale = self._stale, set()
            recounted = {task: _Tally() for task in stale}
            for rec in self.records.values():
                if rec.task in recounted:
                    recounted[rec.task].add(rec)
            self._tallies.update(recounted)
        declared = self._declared_counts
        return {task: self._tallies[task].summary(task, declared.get(task, 0), wall_s) if task in self._tallies
                else aggregate((), {task: declared[task]}, wall_s)[task]
                for task in sorted(set(self._tallies) | set(declared))}

    def progress(self, now: float) -> Progress:
        """Where the run stands at epoch time ``now`` (the live progress line)."""
        elapsed = 0.0 if self.first_start is None else max(0.0, now - self.first_start)
        done = self.reported
        return Progress(done=done, total=max(len(self.declared), done), ran=self.ran, elapsed_s=elapsed,
                        tasks=self.tasks())

    def coverage(self) -> dict[str, Any]:
        tallies = [self._tallies[t] for t in self.tasks() if t in self._tallies]  # (recounts stale tasks)
        declared = self.declared
        return {
            "declared": len(declared),
            "reported": sum(self._reported) if declared else self.reported,
            "graded": sum(t.n for t in tallies),
            "errors": sum(t.errors for t in tallies),
            "skipped": sum(t.skipped for t in tallies),
            "missing": sorted(n for n, index in declared.items() if not self._reported[index]),
        }

    @property
    def gated(self) -> bool:
        """A baseline, a gate file or a floor is configured: the gate decides the exit status."""
        return bool(self.baseline is not None or self.gated_by_file or self.floors)

    def verdicts(self) -> list[Verdict] | None:
        """Verdicts per task (None when no baseline, gate file or floor is configured)."""
        if not self.gated:
            return None
        from pytest_hud.gate import evaluate_gate  # the statistics, with numpy: only where there is a gate

        current = outcomes_from_records(self.records.values(), episodes=self.declared_ids(),
                                        deselected=self.deselected_ids())
        base = outcomes_from_results(self.baseline, as_baseline=True) if self.baseline is not None else None
        others = self.other_shards()
        if base is not None and others:
            # A shard is gated against the same episodes of the baseline; the other shards'
            # episodes are theirs to gate (and the merged file's), not missing here.
            kept = [r for r in self.baseline.latest_episodes() if (r.task, str(r.episode)) not in others]
            declared = self.baseline.declared_episodes() if self.baseline.complete else None
            if declared is not None:
                declared = {t: kept_eps for t, eps in declared.items()
                            if (kept_eps := [e for e in eps if (t, e) not in others])}
            base = outcomes_from_records(kept, episodes=declared)
        floors = {**self.gate_config.floors, **self.floors}  # marker floors are exact task ids: they win
        metrics = {**self.gate_config.metrics, **self.metrics}  # and so do marker metrics
        verdicts = evaluate_gate(current, base, replace(self.gate_config, floors=floors, metrics=metrics),
                                 deselected=self.deselected - set(current))
        for i, v in enumerate(verdicts):
            test = self._sequential_tests.get(v.task)
            decision = test.decide() if test is not None else "undecided"
            if decision != "undecided" and v.verdict in COMPARED:
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

    def used(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Every (policy, content hash) and (sim, build) the recorded episodes actually used."""
        return list(self._policies.values()), list(self._sims.values())
