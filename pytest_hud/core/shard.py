"""Shards: which episodes of a suite ``--hud-shard I/N`` runs. Pure (no pytest, no I/O).

The partition is a function of the suite alone (the set of ``(task, episode id)`` pairs that the
run collected, after ``-k``/``-m``), so every job of a sharded suite computes the same one without
talking to the others:

- each pair gets a stable key, ``sha256(task + NUL + episode)`` (never Python's ``hash``, which is
  salted per process);
- tasks are taken in name order, each task's episodes in key order, and dealt round-robin to shards
  1..N, the deal continuing from task to task.

So the union of the N shards is the suite, no episode is in two shards, shard sizes differ by at
most one, and so do each task's episode counts across shards (every shard sees every task that has
at least N episodes, which keeps each shard's own gate meaningful). Ordering by key rather than by
seed keeps consecutive seeds apart. The same ``(task, episode)`` collected twice stays one unit.

    >>> parse_shard("2/3")
    Shard(index=2, count=3)
    >>> sorted(partition([("t", "0"), ("t", "1"), ("t", "2")], 3).values())
    [1, 2, 3]
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = ["Shard", "episode_key", "parse_shard", "partition", "suite_fingerprint", "suite_tasks"]


@dataclass(frozen=True)
class Shard:
    """Shard ``index`` (1-based) of ``count``."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """``"I/N"`` as a :class:`Shard`; raises ``ValueError`` naming the problem and the fix."""
    raw = str(text).strip()
    head, sep, tail = raw.partition("/")
    usage = "give it as I/N with whole numbers 1 <= I <= N, e.g. --hud-shard 2/4 for the second of four"
    try:
        if not sep:
            raise ValueError
        index, count = int(head), int(tail)
    except ValueError:
        raise ValueError(f"--hud-shard {raw!r} is not I/N: {usage}") from None
    if count < 1:
        raise ValueError(f"--hud-shard {raw!r}: N (the number of shards) must be at least 1; {usage}")
    if not 1 <= index <= count:
        raise ValueError(f"--hud-shard {raw!r}: I must be between 1 and N={count} (shards count from 1); {usage}")
    return Shard(index, count)


def episode_key(task: str, episode: str) -> str:
    """The stable key that orders an episode within its task (the same in every process)."""
    return hashlib.sha256(f"{task}\0{episode}".encode()).hexdigest()


def partition(episodes: Iterable[tuple[str, str]], count: int) -> dict[tuple[str, str], int]:
    """The shard (1..count) of each ``(task, episode)``; see the module docstring for the rule."""
    if count < 1:
        raise ValueError(f"the number of shards must be at least 1, got {count}")
    by_task: dict[str, set[str]] = {}
    for task, episode in episodes:
        by_task.setdefault(str(task), set()).add(str(episode))
    out: dict[tuple[str, str], int] = {}
    dealt = 0
    for task in sorted(by_task):
        for episode in sorted(by_task[task], key=lambda ep: (episode_key(task, ep), ep)):
            out[(task, episode)] = dealt % count + 1
            dealt += 1
    return out


def suite_tasks(episodes: Iterable[tuple[str, str]]) -> dict[str, list[str]]:
    """The suite as ``{task: [episode ids]}``, sorted (what a shard's results file records)."""
    by_task: dict[str, set[str]] = {}
    for task, episode in episodes:
        by_task.setdefault(str(task), set()).add(str(episode))
    return {task: sorted(eps) for task, eps in sorted(by_task.items())}


def suite_fingerprint(tasks: Mapping[str, Iterable[str]]) -> str:
    """One hash of a whole suite (``{task: [episode ids]}``): equal for the shards of one suite."""
    h = hashlib.sha256()
    for task in sorted(tasks):
        for episode in sorted(str(ep) for ep in tasks[task]):
            h.update(f"{task}\0{episode}\n".encode())
    return "sha256:" + h.hexdigest()
