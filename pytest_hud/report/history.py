"""A series of runs as one picture: success per task across checkpoints, what changed, which is best.

Pure (no I/O): :func:`series_from_results` turns results files (one per checkpoint, in order) into
labelled runs, :func:`series_from_sweep` does the same for one run whose tests take the checkpoint
as a parameter (``@pytest.mark.parametrize("checkpoint", [...])``: one bridge serves every
checkpoint), and :func:`build_history` gives each task's rate and Wilson interval per run, the
significant changes between consecutive runs, and the best run with a statement that accounts for
having compared many.

The statistics are the gate's own (:mod:`pytest_hud.gate`, :mod:`pytest_hud.stats`):

- **a change** between consecutive runs of a task is tested as the gate tests a regression:
  paired exact McNemar when the episode ids overlap as much as the gate requires
  (:data:`~pytest_hud.gate.PAIRED_MIN_OVERLAP`), else Boschloo's exact test; both directions
  (a drop and a rise) are one-sided tests, and **Holm** adjusts all of them, every task and every
  step of the series, so the chance of marking any change that is not there is at most ``alpha``;
- **the best run** is the one with the highest success pooled over the tasks every run has. It is
  compared with every other run by the same tests, and Holm adjusts over *every ordered pair* of
  runs (``k (k - 1)`` tests), not only the ``k - 1`` comparisons with the winner: the winner was
  picked after looking at all of them, so only a family that contains every comparison one could
  have made keeps the false-claim rate at ``alpha``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pytest_hud.gate import TaskOutcomes, outcomes_from_results
from pytest_hud.report.markdown import md_code
from pytest_hud.stats import wilson_interval
from pytest_hud.stats.levels import shared_pairs
from pytest_hud.stats.rates import boschloo_exact_one_sided, holm_adjusted, mcnemar_exact_one_sided

__all__ = ["Change", "History", "Point", "Run", "build_history", "run_label", "series_from_results",
           "series_from_sweep"]


@dataclass
class Run:
    """One point of the series: a label (checkpoint or commit), its tasks' outcomes, where it came from."""

    label: str
    tasks: dict[str, TaskOutcomes]
    source: str = ""
    details: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Point:
    """One task in one run."""

    successes: int
    n: int
    errors: int
    low: float
    high: float

    @property
    def rate(self) -> float | None:
        return self.successes / self.n if self.n else None


@dataclass(frozen=True)
class Change:
    """A tested change of one task between two consecutive runs (``direction``: ``up`` or ``down``)."""

    task: str
    before: int  # run index
    after: int
    direction: str
    test: str  # paired-mcnemar | boschloo
    p: float
    p_holm: float
    significant: bool


@dataclass
class History:
    runs: list[Run]
    tasks: list[str]
    points: dict[tuple[str, int], Point]  # (task, run index) -> point
    changes: list[Change]  # every tested change; ``significant`` marks the ones to show
    alpha: float
    best: int | None = None  # run index
    best_statement: str = ""
    best_tests: list[tuple[int, float, bool]] = field(default_factory=list)  # (other run, Holm p, better)

    def significant(self) -> list[Change]:
        return [c for c in self.changes if c.significant]


# ------------------------------------------------------------------------------------ the series


def run_label(results: Any, fallback: str) -> str:
    """A run's label from its provenance: the policy (checkpoint) it evaluated, else the commit."""
    prov = results.provenance or {}
    policies = [p.get("policy") for p in prov.get("policies") or [] if p.get("policy")]
    policy = prov.get("policy") or (policies[0] if len(set(policies)) == 1 else None)
    if policy:
        parts = [p for p in re.split(r"[/\\]", str(policy)) if p]
        return "/".join(parts[-2:]) if len(parts) > 1 else parts[0]
    git = prov.get("git") or {}
    if git.get("revision"):
        return str(git["revision"])[:10] + ("+" if git.get("dirty") else "")
    return fallback


def series_from_results(files: Sequence[Any]) -> list[Run]:
    """One run per results file, in the order given, labelled from its provenance (made unique)."""
    runs = []
    for i, results in enumerate(files):
        name = str(results.path or f"run {i + 1}").rsplit("/", 1)[-1]
        label = run_label(results, name)
        prov = results.provenance or {}
        git = (prov.get("git") or {}).get("revision")
        details = {"file": str(results.path or ""), "commit": git[:10] if git else None,
                   "policy_hash": _short_hash(prov.get("policy_hash")), "started": results.run.get("started")}
        runs.append(Run(label, outcomes_from_results(results), str(results.path or ""), details))
    _unique_labels(runs)
    return runs


def series_from_sweep(results: Any, param: str) -> list[Run]:
    """The runs inside one run whose tasks take the checkpoint as the parameter ``param``.

    ``test_x[checkpoint=step_1000,task=push]`` becomes task ``test_x[task=push]`` of run
    ``step_1000``; runs are ordered by their values in natural order (``step_200`` before
    ``step_1000``). Raises ``ValueError`` when no task has the parameter.
    """
    by_value: dict[str, dict[str, TaskOutcomes]] = {}
    for task, outcomes in outcomes_from_results(results).items():
        value, rest = _split_param(task, param)
        if value is None:
            continue
        by_value.setdefault(value, {})[rest] = outcomes
    if not by_value:
        raise ValueError(f"no task of {results.path} has the parameter {param!r}; its tasks are: "
                         + ", ".join(sorted(outcomes_from_results(results))[:5]))
    return [Run(value, by_value[value], str(results.path or ""), {"parameter": f"{param}={value}"})
            for value in sorted(by_value, key=_natural)]


def _split_param(task: str, param: str) -> tuple[str | None, str]:
    base, sep, params = task.partition("[")
    if not sep:
        return None, task
    items = params.rstrip("]").split(",")
    value, rest = None, []
    for item in items:
        key, eq, val = item.partition("=")
        if eq and key == param:
            value = val
        else:
            rest.append(item)
    return value, base + (f"[{','.join(rest)}]" if rest else "")


def _natural(text: str) -> list[Any]:
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text)]


def _short_hash(value: Any) -> str | None:
    return str(value).split(":", 1)[-1][:12] if value else None


def _unique_labels(runs: list[Run]) -> None:
    seen: dict[str, int] = {}
    for run in runs:
        seen[run.label] = seen.get(run.label, 0) + 1
    counts: dict[str, int] = {}
    for run in runs:
        if seen[run.label] > 1:
            counts[run.label] = counts.get(run.label, 0) + 1
            run.label = f"{run.label} #{counts[run.label]}"


# ----------------------------------------------------------------------------------- statistics


def _test(new: Mapping[str, bool], base: Mapping[str, bool]) -> tuple[str, float, float]:
    """The gate's test between two sides: (test name, p of a drop, p of a rise)."""
    shared = shared_pairs(new, base)
    if shared:
        worse = sum(1 for e in shared if base[e] and not new[e])
        better = sum(1 for e in shared if new[e] and not base[e])
        return "paired-mcnemar", mcnemar_exact_one_sided(worse, better), mcnemar_exact_one_sided(better, worse)
    s_new, s_base = sum(new.values()), sum(base.values())
    drop = boschloo_exact_one_sided(s_new, len(new), s_base, len(base))
    rise = boschloo_exact_one_sided(s_base, len(base), s_new, len(new))
    return "boschloo", drop, rise


def build_history(runs: Sequence[Run], alpha: float = 0.05) -> History:
    """Rates, intervals, Holm-adjusted changes between consecutive runs, and the best run."""
    tasks = sorted({task for run in runs for task in run.tasks})
    points = {}
    for i, run in enumerate(runs):
        for task, out in run.tasks.items():
            s = out.n_success
            low, high = wilson_interval(s, out.n)
            points[(task, i)] = Point(s, out.n, out.errors, low, high)
    raw: dict[str, tuple[str, int, int, str, str]] = {}
    pvalues: dict[str, float] = {}
    for task in tasks:
        present = [i for i, run in enumerate(runs) if task in run.tasks and run.tasks[task].n]
        for before, after in zip(present, present[1:]):
            name, drop, rise = _test(runs[after].tasks[task].successes, runs[before].tasks[task].successes)
            for direction, p in (("down", drop), ("up", rise)):
                key = f"{task}\0{before}\0{direction}"
                raw[key] = (task, before, after, direction, name)
                pvalues[key] = p
    adjusted = holm_adjusted(pvalues) if pvalues else {}
    changes = [Change(task, before, after, direction, name, pvalues[key], adjusted[key], adjusted[key] <= alpha)
               for key, (task, before, after, direction, name) in raw.items()]
    history = History(list(runs), tasks, points, changes, alpha)
    if len(runs) > 1:
        _best(history)
    return history


def _pooled(run: Run, tasks: Iterable[str]) -> dict[str, bool]:
    return {f"{task}\0{ep}": ok for task in tasks for ep, ok in run.tasks[task].successes.items()}


def _best(history: History) -> None:
    runs = history.runs
    common = [t for t in history.tasks if all(t in run.tasks for run in runs)]
    pooled = [_pooled(run, common) for run in runs]
    if not common or not all(pooled):
        history.best_statement = "no task was graded in every run: no best run to name"
        return
    rates = [sum(p.values()) / len(p) for p in pooled]
    best = max(range(len(runs)), key=lambda i: (rates[i], i))  # ties: the later run
    pvalues = {}
    for i in range(len(runs)):
        for j in range(len(runs)):
            if i != j:  # "run j is worse than run i", every ordered pair: the family the choice came from
                pvalues[f"{i}\0{j}"] = _test(pooled[j], pooled[i])[1]
    adjusted = holm_adjusted(pvalues)
    history.best = best
    history.best_tests = [(j, adjusted[f"{best}\0{j}"], adjusted[f"{best}\0{j}"] <= history.alpha)
                          for j in range(len(runs)) if j != best]
    beaten = [runs[j].label for j, _, better in history.best_tests if better]
    tied = [(runs[j].label, p) for j, p, better in history.best_tests if not better]
    s, n = sum(pooled[best].values()), len(pooled[best])
    family = len(pvalues)
    text = (f"Best: {runs[best].label}, {s}/{n} = {100 * s / n:.1f}% over the {len(common)} task"
            f"{'s' if len(common) != 1 else ''} every run has. Each run was compared with every other"
            f" ({family} one-sided exact tests, Holm-adjusted over all of them, alpha {history.alpha:g}, since"
            f" the best was picked after looking at all {len(runs)}): ")
    if beaten:
        text += f"{runs[best].label} is significantly better than {', '.join(beaten)}"
        text += "; " if tied else "."
    if tied:
        names = ", ".join(f"{label} (adjusted p={p:.2g})" for label, p in tied)
        text += (f"{'it' if beaten else runs[best].label} is not distinguishable from {names}, so the data"
                 f" do not single out {runs[best].label} among {', '.join([runs[best].label] + [t[0] for t in tied])}.")
    history.best_statement = text


# ---------------------------------------------------------------------------------------- text


def _cell(history: History, task: str, i: int) -> str:
    point = history.points.get((task, i))
    if point is None or not point.n:
        return "-"
    mark = "".join("▲" if c.direction == "up" else "▼" for c in history.significant()
                   if c.task == task and c.after == i)
    return f"{100 * point.rate:.0f}% ({point.successes}/{point.n}){(' ' + mark) if mark else ''}"


def history_markdown(history: History, title: str = "pytest-hud: success across runs") -> str:
    """GitHub-flavoured markdown (a CI job summary): the table, the marked changes, the best run."""
    runs = history.runs
    lines = [f"### {title}", "",
             "| task | " + " | ".join(_md(r.label) for r in runs) + " |",
             "|---|" + "---:|" * len(runs)]
    for task in history.tasks:
        lines.append(f"| {md_code(task)} | " + " | ".join(_cell(history, task, i) for i in range(len(runs))) + " |")
    lines.append("")
    lines += [f"- {line}" for line in change_lines(history)] or ["- no significant change between consecutive runs"]
    if history.best_statement:
        lines += ["", history.best_statement]
    return "\n".join(lines) + "\n"


def change_lines(history: History) -> list[str]:
    """One sentence per significant change (▲ a rise, ▼ a drop, Holm-adjusted over the series)."""
    out = []
    for c in history.significant():
        a, b = history.points[(c.task, c.before)], history.points[(c.task, c.after)]
        out.append(f"{'▲' if c.direction == 'up' else '▼'} {c.task}: {history.runs[c.before].label} "
                   f"{100 * a.rate:.0f}% -> {history.runs[c.after].label} {100 * b.rate:.0f}% "
                   f"({c.test}, p={c.p:.2g}, Holm p={c.p_holm:.2g})")
    return out


def history_text(history: History) -> list[str]:
    """The terminal version: one row per task, one column per run."""
    runs = history.runs
    cells = [[task] + [_cell(history, task, i) for i in range(len(runs))] for task in history.tasks]
    head = ["task"] + [r.label for r in runs]
    widths = [max(len(row[k]) for row in cells + [head]) for k in range(len(head))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells]
    changes = change_lines(history)
    lines += [""] + (changes or ["no significant change between consecutive runs"
                                 f" (Holm over {len(history.changes)} one-sided tests, alpha {history.alpha:g})"])
    if history.best_statement:
        lines += ["", history.best_statement]
    return lines


def _md(text: str) -> str:
    """A run's label in a table cell (its ``|`` escaped; paths and names stay as they read)."""
    return str(text).replace("|", "\\|")
