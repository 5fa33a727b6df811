"""The gate's input: each task's episodes on one side of the comparison, and what defines a task.

Pure logic (no pytest, no I/O): :func:`outcomes_from_records` and :func:`outcomes_from_results` turn
episode records or a loaded results file into one :class:`TaskOutcomes` per task, with the
episode-level accounting (declared, errored, skipped, decided, deselected ids) and the identity
(:data:`TASK_FIELDS`) that the gate's rules read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "SEQUENTIAL_SKIP",
    "TASK_FIELDS",
    "TaskOutcomes",
    "outcomes_from_records",
    "outcomes_from_results",
]

#: What defines a task, from each episode record's ``identity``: equal on both sides, or incomparable.
TASK_FIELDS: tuple[str, ...] = ("sim", "build", "max_steps", "contract", "n_action_steps")

#: How a worker's skip reason starts when the sequential test had already decided the task.
SEQUENTIAL_SKIP = "sequential gate already decided"


@dataclass
class TaskOutcomes:
    """One task's episodes on one side of the comparison.

    ``successes`` maps episode id to success for episodes that finished without error; ``errors``
    counts the errored ones; ``declared`` is how many episodes the task declares (its parameters)
    less the skipped ones; ``skipped`` counts skipped episodes and ``skip_reason`` is one of their
    reasons (``skip``/``skipif``, or a sequential decision).

    The episode-level accounting (empty or None where unknown, e.g. for outcomes built by hand):
    ``episodes`` the ids the run declared for the task (after ``-k``/``-m``; None: unknown, the
    records stand in); ``errored`` the errored ids; ``skipped_ids`` each skipped id with its reason;
    ``decided`` the ids a sequential decision skipped; ``deselected`` the ids ``-k``/``-m`` left out;
    ``identity`` each of :data:`TASK_FIELDS` with the values its records carry (canonical JSON);
    ``policies`` the policies (with content hashes) that ran it; ``scores`` each graded episode's
    score (the sim's graded outcome in [0, 1]), for a task gated on its score.
    """

    successes: dict[str, bool]
    errors: int = 0
    declared: int = 0
    skipped: int = 0
    skip_reason: str | None = None
    episodes: frozenset[str] | None = None
    errored: frozenset[str] = frozenset()
    skipped_ids: dict[str, str | None] = field(default_factory=dict)
    decided: frozenset[str] = frozenset()
    deselected: frozenset[str] = frozenset()
    identity: dict[str, frozenset[str]] = field(default_factory=dict)
    policies: frozenset[str] = frozenset()
    scores: dict[str, float] = field(default_factory=dict)  # episode id -> the sim's score (graded episodes)

    @property
    def n(self) -> int:
        """Episodes that finished without error."""
        return len(self.successes)

    @property
    def n_success(self) -> int:
        """Successful episodes."""
        return sum(1 for ok in self.successes.values() if ok)

    @property
    def all_skipped(self) -> bool:
        """Every episode of the task was skipped (none ran)."""
        return self.skipped > 0 and self.n == 0 and self.errors == 0

    @property
    def coverage(self) -> float:
        """Fraction of declared episodes that finished without error.

        When ``declared`` is unknown (0), finished + errored episodes stand in for it.
        """
        declared = self.declared if self.declared > 0 else self.n + self.errors
        return self.n / declared if declared > 0 else 0.0

    def ran(self) -> set[str]:
        """The ids this side meant to run: declared (or, unknown, reported), less the skipped ones."""
        if self.episodes is not None:
            ids = set(self.episodes)
        else:
            ids = set(self.successes) | set(self.errored) | set(self.skipped_ids) | set(self.decided)
        return ids - set(self.skipped_ids) - set(self.decided)


def outcomes_from_records(records: Iterable[Any], declared: Mapping[str, int] | None = None, *,
                          episodes: Mapping[str, Iterable[str]] | None = None,
                          deselected: Mapping[str, Iterable[str]] | None = None) -> dict[str, TaskOutcomes]:
    """The gate's view of episode records (anything with task, episode, outcome, success, identity).

    Only the last record of each (task, episode) counts (reruns and resumes append). Errored
    episodes are left out of the success map and counted as errors; skipped episodes (a task that
    sequential mode decided early) count as neither and are not expected in ``declared`` either.
    ``episodes`` (task -> the episode ids the run declared) and ``deselected`` (task -> the ids
    ``-k``/``-m`` left out) give the episode-level accounting; without ``episodes`` the records
    stand in for what was declared, and ``declared`` (task -> count) for how many.
    """
    latest: dict[tuple[str, str], Any] = {}
    for rec in records:
        latest[(rec.task, str(rec.episode))] = rec
    tasks = set(declared or ()) | set(episodes or ()) | {task for task, _ in latest}
    out = {task: TaskOutcomes({}, 0, int((declared or {}).get(task, 0))) for task in sorted(tasks)}
    for task, ids in (episodes or {}).items():
        out[task].episodes = frozenset(str(e) for e in ids)
    for task, ids in (deselected or {}).items():
        if task in out:
            out[task].deselected = frozenset(str(e) for e in ids)
    errored: dict[str, set[str]] = {}
    decided: dict[str, set[str]] = {}
    identity: dict[str, dict[str, set[str]]] = {}
    policies: dict[str, set[str]] = {}
    for (task, episode), rec in latest.items():
        outcomes = out[task]
        if rec.outcome == "error":
            outcomes.errors += 1
            errored.setdefault(task, set()).add(episode)
        elif rec.outcome == "skipped":
            outcomes.skipped += 1
            reason = getattr(rec, "skip_reason", None)
            outcomes.skip_reason = outcomes.skip_reason or reason
            if str(reason or "").startswith(SEQUENTIAL_SKIP):
                decided.setdefault(task, set()).add(episode)
            else:
                outcomes.skipped_ids[episode] = reason
        elif rec.outcome in ("passed", "failed") and rec.success is not None:
            outcomes.successes[episode] = bool(rec.success)
            if getattr(rec, "score", None) is not None:
                outcomes.scores[episode] = float(rec.score)
        ident = dict(getattr(rec, "identity", None) or {})
        if getattr(rec, "contract", None):
            ident["contract"] = rec.contract
        if rec.outcome != "skipped" and ident:
            fields = identity.setdefault(task, {})
            for name in TASK_FIELDS:
                if name in ident:
                    fields.setdefault(name, set()).add(_canonical(ident[name]))
            if ident.get("policy"):
                digest = str(ident.get("policy_hash") or "")
                digest = digest.split(":", 1)[-1][:12]
                policies.setdefault(task, set()).add(f"{ident['policy']}" + (f" (hash {digest})" if digest else ""))
    for task, outcomes in out.items():
        outcomes.errored = frozenset(errored.get(task, ()))
        outcomes.decided = frozenset(decided.get(task, ()))
        outcomes.identity = {name: frozenset(values) for name, values in identity.get(task, {}).items()}
        outcomes.policies = frozenset(policies.get(task, ()))
        if outcomes.episodes is not None:
            outcomes.declared = len(outcomes.episodes)
        outcomes.declared = max(outcomes.declared, outcomes.n + outcomes.errors + outcomes.skipped)
        outcomes.declared -= outcomes.skipped
    return out


def _canonical(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True, default=str)


def outcomes_from_results(results: Any, *, as_baseline: bool = False) -> dict[str, TaskOutcomes]:
    """The gate's view of a loaded results file (a :class:`pytest_hud.core.results.Results`).

    Its header's declared episodes are what the run meant to run, so an incomplete file (a killed
    run) still counts every episode it did not finish. As a baseline (``as_baseline``) an
    incomplete file counts only the episodes it has: the user accepted it knowingly.
    """
    declared = {task: summary.declared for task, summary in results.tasks().items()}
    episodes = results.declared_episodes()
    if as_baseline and not results.complete:
        episodes, declared = None, {}
    return outcomes_from_records(results.latest_episodes(), declared, episodes=episodes,
                                 deselected=results.deselected_episodes())
