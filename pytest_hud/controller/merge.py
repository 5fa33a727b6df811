"""Merge the results files of a sharded suite (``--hud-shard I/N``) into one. Pure: no I/O.

``python -m pytest_hud merge A.jsonl B.jsonl ... -o ALL.jsonl`` (see :mod:`pytest_hud.__main__`)
loads the files and calls :func:`merge_shards`, which checks and combines them:

- **Mergeable at all** (else :class:`MergeError`, exit status 2): every file comes from a sharded
  run (its header records the shard), all with the same number of shards and the same suite (the
  fingerprint of the collected ``(task, episode)`` pairs), and the same policy: the plugin version,
  policy, policy content hash and sim of each run, and the identity of every episode of a task
  (policy, content hash, sim, build, max steps: what ``--hud-resume`` matches on) agree. No
  episode outside the suite.
- **Complete** (else a problem, exit status 1 unless allowed): every shard 1..N present, and every
  episode of the suite reported by some file (an errored episode is reported: it counts against
  coverage in the gate, not here).
- **No conflicting duplicates**: an episode reported by two files with the same outcome, success,
  score, return, steps and seed is kept once (a note says where; e.g. a shard file passed twice);
  with different results it is a conflict naming the episode and both files (exit status 1 unless
  allowed; then the later file on the command line wins, as a rerun's record does in one file).

Within one file the last record of an episode counts (reruns and ``--hud-resume`` append), as
everywhere else. The merged file is an ordinary results file: a run header whose provenance names
every shard file, the episodes, and a summary whose declared counts are the whole suite's, so
``report --compare`` and ``--hud-baseline`` treat it like the file of one unsharded run.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_hud.core.results import SCHEMA, EpisodeRecord, Results, aggregate, to_builtin
from pytest_hud.core.shard import suite_fingerprint

__all__ = ["MergeError", "MergeReport", "merge_shards"]

#: Fields that must agree across the runs of one suite.
RUN_IDENTITY = ("plugin_version", "policy", "policy_hash", "sim")
#: What an episode's result is: two records of one episode that agree on these are duplicates.
RESULT_FIELDS = ("outcome", "success", "score", "total_reward", "steps", "seed")


class MergeError(ValueError):
    """Files that cannot be merged (not shards, other suites or policies); the message says which."""


@dataclass
class MergeReport:
    """What the merge found, and the merged file as its lines (builtin types)."""

    count: int
    shards: dict[int, list[str]]  # shard index -> the files that hold it
    suite_episodes: int
    missing_shards: list[int] = field(default_factory=list)
    missing_episodes: list[tuple[str, str]] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)  # identical records in several files (kept once)
    conflicts: list[str] = field(default_factory=list)  # different records of one episode
    notes: list[str] = field(default_factory=list)
    lines: list[dict[str, Any]] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return not self.missing_shards and not self.missing_episodes


def _name(results: Results) -> str:
    return str(results.path or "<results>")


def _shard_of(results: Results) -> dict[str, Any]:
    shard = (results.run.get("provenance") or {}).get("shard")
    if not isinstance(shard, dict) or not isinstance((shard.get("suite") or {}).get("tasks"), dict):
        raise MergeError(
            f"{_name(results)} is not a shard's results file (its run was not made with --hud-shard I/N); "
            "merge takes the results files of the shards of one suite"
        )
    return shard


def _check_same(files: Sequence[Results], what: str, value_of) -> None:
    values: dict[str, list[str]] = {}
    for results in files:
        values.setdefault(repr(value_of(results)), []).append(_name(results))
    if len(values) > 1:
        listing = "; ".join(f"{value} in {', '.join(names)}" for value, names in values.items())
        raise MergeError(f"the files are not shards of one run: their {what} differ ({listing})")


def _identity(record: EpisodeRecord) -> dict[str, Any]:
    return to_builtin(dict(record.identity or {}))


def merge_shards(files: Sequence[Results], *, prefer_later: bool = False) -> MergeReport:
    """Check ``files`` (in command-line order) and merge them; raises :class:`MergeError`."""
    if not files:
        raise MergeError("no results files to merge")
    shards = [_shard_of(r) for r in files]
    _check_same(files, "shard counts (N of --hud-shard I/N)", lambda r: _shard_of(r).get("count"))
    _check_same(files, "suites (the collected episodes: same commit, same -k/-m?)",
                lambda r: _shard_of(r)["suite"].get("fingerprint"))
    for name in RUN_IDENTITY:
        _check_same(files, name.replace("_", " "), lambda r, name=name: (r.run.get("provenance") or {}).get(name))
    suite: dict[str, list[str]] = shards[0]["suite"]["tasks"]
    if suite_fingerprint(suite) != shards[0]["suite"].get("fingerprint"):
        raise MergeError(f"{_name(files[0])}: its suite does not match its own fingerprint (an edited file?)")
    in_suite = {(task, str(ep)) for task, eps in suite.items() for ep in eps}
    count = int(shards[0]["count"])

    report = MergeReport(count=count, shards={}, suite_episodes=len(in_suite))
    for results, shard in zip(files, shards):
        report.shards.setdefault(int(shard["index"]), []).append(_name(results))
    report.missing_shards = [i for i in range(1, count + 1) if i not in report.shards]
    for index, names in sorted(report.shards.items()):
        if len(names) > 1:
            report.notes.append(f"shard {index}/{count} is given {len(names)} times: {', '.join(names)}")

    chosen: dict[tuple[str, str], tuple[EpisodeRecord, str]] = {}
    identities: dict[str, tuple[dict[str, Any], str]] = {}  # task -> (identity, file)
    for results in files:
        for record in results.latest_episodes():
            key = (record.task, str(record.episode))
            if key not in in_suite:
                raise MergeError(f"{_name(results)}: episode {record.episode} of {record.task} is not in the suite "
                                 "its header declares (an edited or concatenated file?)")
            ident = _identity(record)
            if record.outcome != "skipped" and ident:
                first = identities.setdefault(record.task, (ident, _name(results)))
                if first[0] != ident:
                    diff = sorted(k for k in set(ident) | set(first[0]) if ident.get(k) != first[0].get(k))
                    raise MergeError(
                        f"{record.task}: episodes ran with a different {', '.join(diff)} in {first[1]} "
                        f"({', '.join(f'{k}={first[0].get(k)!r}' for k in diff)}) and in {_name(results)} "
                        f"({', '.join(f'{k}={ident.get(k)!r}' for k in diff)}); merge only shards of one policy")
            earlier = chosen.get(key)
            if earlier is None:
                chosen[key] = (record, _name(results))
                continue
            where = f"episode {record.episode} of {record.task} is in {earlier[1]} and {_name(results)}"
            old, new = earlier[0].to_dict(), record.to_dict()
            different = [k for k in RESULT_FIELDS if old.get(k) != new.get(k)]
            if not different:
                report.duplicates.append(f"{where} with the same result (kept once)")
                continue
            report.conflicts.append(
                f"{where} with different results: "
                + ", ".join(f"{k} {old.get(k)!r} vs {new.get(k)!r}" for k in different)
                + (" (the later file's record is kept)" if prefer_later else ""))
            if prefer_later:
                chosen[key] = (record, _name(results))
    report.missing_episodes = sorted(in_suite - set(chosen))
    report.lines = _merged_lines(files, shards, suite, [rec for rec, _ in chosen.values()], report)
    return report


def _merged_lines(files: Sequence[Results], shards: list[dict[str, Any]], suite: dict[str, list[str]],
                  records: list[EpisodeRecord], report: MergeReport) -> list[dict[str, Any]]:
    first = dict(files[0].run.get("provenance") or {})
    first.pop("shard", None)
    for key in ("args", "options"):  # one shard's command line is not the merged run's
        first.pop(key, None)
    provenance = dict(first, merged={
        "shards": report.count,
        "suite": {"episodes": report.suite_episodes, "fingerprint": shards[0]["suite"].get("fingerprint")},
        "files": [{"path": _name(r), "shard": int(s["index"]), "run_id": r.run.get("run_id"),
                   "started": r.run.get("started"), "complete": r.complete,
                   "git": (r.run.get("provenance") or {}).get("git"),
                   "args": (r.run.get("provenance") or {}).get("args")} for r, s in zip(files, shards)],
    })
    declared = {task: len(eps) for task, eps in suite.items()}
    tasks = aggregate(records, declared)
    reported = {(r.task, str(r.episode)) for r in records}
    coverage = {
        "declared": report.suite_episodes,
        "reported": len(reported),
        "graded": sum(1 for r in records if r.outcome in ("passed", "failed")),
        "errors": sum(1 for r in records if r.outcome == "error"),
        "skipped": sum(1 for r in records if r.outcome == "skipped"),
        "missing": [f"{task} episode {ep}" for task, ep in report.missing_episodes],
    }
    policies: dict[str, Any] = {}
    sims: dict[str, Any] = {}
    for results in files:
        for entry in (results.summary or {}).get("provenance", {}).get("policies") or []:
            policies[repr(sorted(entry.items()))] = entry
        for entry in (results.summary or {}).get("provenance", {}).get("sims") or []:
            sims[repr(sorted(entry.items()))] = entry
    starts = sorted(str(r.run.get("started")) for r in files if r.run.get("started"))
    finishes = sorted(str(r.summary.get("finished")) for r in files if r.summary and r.summary.get("finished"))
    return [
        {"record": "run", "schema": SCHEMA, "run_id": secrets.token_hex(8),
         "started": starts[0] if starts else None, "provenance": to_builtin(provenance),
         "declared": {task: list(eps) for task, eps in suite.items()}, "deselected": {}},
        *({"record": "episode", **r.to_dict()} for r in records),
        {"record": "summary", "schema": SCHEMA, "finished": finishes[-1] if finishes else None,
         "tasks": {t: s.to_dict() for t, s in tasks.items()}, "coverage": to_builtin(coverage), "gate": None,
         "provenance": to_builtin(dict(provenance, policies=list(policies.values()), sims=list(sims.values())))},
    ]
