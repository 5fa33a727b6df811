"""Command line: ``python -m pytest_hud report RESULTS [--compare BASELINE] [--markdown]`` and
``python -m pytest_hud merge SHARD.jsonl ... -o ALL.jsonl``.

    python -m pytest_hud report results.jsonl                       # the per-task table
    python -m pytest_hud report results.jsonl --compare base.jsonl  # + the gate: exit 1 on regression
    python -m pytest_hud report results.jsonl --markdown >> "$GITHUB_STEP_SUMMARY"
    python -m pytest_hud report results.jsonl --html report.html    # the standalone HTML page too
    python -m pytest_hud report --history step1k.jsonl step2k.jsonl step3k.jsonl --html history.html
    python -m pytest_hud report --history --sweep checkpoint sweep.jsonl   # checkpoints inside one run

``--compare`` runs the same gate as ``pytest --hud-baseline`` (:func:`pytest_hud.gate.evaluate_gate`
with the same options and the same episode accounting), on the latest record of each episode in
both files; errored, deselected and missing episodes are not successes or failures but count
against coverage. A results file without its summary line (a killed run) is gated against the
episodes its header declared; as the baseline it is refused unless ``--allow-incomplete-baseline``.
One shard's file is refused on either side: merge the shards first. Exit status: 0, or 1 when the
gate fails (a regression, insufficient coverage, an incomparable task, nothing compared;
inconclusive too with ``--strict``), or 4 (pytest's usage error) when a file is missing, not a
pytest-hud results file, a shard's, an incomplete baseline, or an option is invalid.

``merge`` combines the results files of the shards of one suite (``pytest --hud-shard I/N``) into
one results file (rules in :mod:`pytest_hud.controller.merge`). Exit status: 0 merged; 1 a shard or an
episode is missing, or one episode has different results in two files (nothing is written unless
``--allow-missing`` / ``--allow-conflicts`` accept that); 4 a file is unreadable or not a shard's,
the files are of different suites, shard counts or policies, or the options are wrong.

    python -m pytest_hud merge shard-*.jsonl -o all.jsonl && python -m pytest_hud report all.jsonl --compare base.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

from pytest_hud.gate import GateConfig, Verdict, evaluate_gate, gate_passed
from pytest_hud.gate import outcomes_from_results as task_outcomes
from pytest_hud.report.table import gate_verdicts
from pytest_hud.core.results import Results, gate_input_problem, load_results

__all__ = ["main", "task_outcomes"]

EXIT_OK, EXIT_REGRESSION, EXIT_USAGE = 0, 1, 4  # 4: pytest's usage error, for the same mistakes


class InputError(Exception):
    """A results file that is missing or not ours, or an invalid option: exit status 4."""


class _Parser(argparse.ArgumentParser):
    """argparse, exiting with the usage-error status of the rest of the command (4, as pytest's)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _load(path: str, what: str, quiet: bool = False) -> Results:
    try:
        results = load_results(path)
    except ValueError as exc:  # load_results names the file and the line
        raise InputError(f"{what}: {exc}") from None
    except OSError as exc:  # a directory, no permission, ...
        raise InputError(f"{what}: cannot read {path!r}: {exc.strerror or exc}") from None
    if not results.complete and not quiet:
        declared = results.declared_episodes()
        counted = (f"the {sum(map(len, declared.values()))} episodes its header declared count, finished or not"
                   if declared is not None else "using the episodes it has")
        print(f"note: {path} has no summary line (a killed or running pytest?); {counted}", file=sys.stderr)
    return results


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m pytest_hud",
        description="pytest-hud tools for results files (pytest-hud/results/1).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)
    report = sub.add_parser(
        "report",
        help="Print a results file's per-task table, compare it with a baseline, render markdown",
        description="Print the per-task summary of RESULTS; with --compare, run the regression gate "
                    "against BASELINE (exit 1 when it fails).",
    )
    report.add_argument("results", metavar="RESULTS", nargs="+",
                        help="Results file written by pytest --hud-results (with --history: several, or folders)")
    report.add_argument("--history", dest="history", action="store_true",
                        help="RESULTS are a series of runs (checkpoints or commits, in order; a folder's *.jsonl "
                             "in the order they started): success per task across them, significant changes "
                             "between consecutive runs (Holm over the series), the best run")
    report.add_argument("--sweep", dest="sweep", metavar="PARAM", default=None,
                        help="With --history: one run whose tests take the checkpoint as the parameter PARAM "
                             "(e.g. checkpoint): one run per value")
    report.add_argument("--compare", dest="baseline", metavar="BASELINE", default=None,
                        help="Baseline results file to gate against (same statistics as --hud-baseline)")
    report.add_argument("--markdown", dest="markdown", action="store_true",
                        help="Print GitHub-flavoured markdown instead of the terminal table")
    report.add_argument("--alpha", dest="alpha", type=float, default=None,
                        help="Family-wise false-alarm rate of the gate across tasks (default 0.05)")
    report.add_argument("--max-drop", dest="max_drop", type=float, default=None,
                        help="Tolerated drop in success rate, as a fraction (0.05 = 5 points; default 0)")
    report.add_argument("--min-coverage", dest="min_coverage", type=float, default=None,
                        help="Fraction of declared episodes that must finish without error (default 0.9)")
    report.add_argument("--strict", dest="strict", action="store_true",
                        help="Fail on inconclusive verdicts too")
    report.add_argument("--gate", dest="gate", metavar="FILE", default=None,
                        help="YAML gate file (as --hud-gate): alpha, max_drop, min_coverage, floors; options beat it")
    report.add_argument("--accept-difference", dest="accept", metavar="FIELD", action="append", default=[],
                        help="Compare although this field of a task differs from the baseline on purpose: sim, "
                             "build, max_steps, contract or n_action_steps (repeatable)")
    report.add_argument("--allow-incomplete-baseline", dest="allow_incomplete", action="store_true",
                        help="Gate against a baseline without its summary line (a killed run's file): only the "
                             "episodes it has count")
    report.add_argument("--width", dest="width", type=int, default=None,
                        help="Table width in characters (default: the terminal's)")
    report.add_argument("--html", dest="html", metavar="PATH", default=None,
                        help="Also write the standalone HTML page (summary, chart, episodes, videos) to PATH")
    report.add_argument("--self-contained", dest="self_contained", action="store_true",
                        help="With --html: inline the videos into the page")
    merge = sub.add_parser(
        "merge",
        help="Merge the results files of a sharded suite (pytest --hud-shard I/N) into one",
        description="Check that SHARDS are the shards of one suite and one policy, report missing shards, "
                    "missing episodes and duplicate episodes, and write one results file (exit 1 when "
                    "something is missing or conflicting, 4 when the files cannot be merged).",
    )
    merge.add_argument("shards", metavar="SHARD", nargs="+", help="Results files written with --hud-shard I/N")
    merge.add_argument("-o", "--output", dest="output", metavar="ALL", required=True,
                       help="Write the merged results file here (replaced atomically)")
    merge.add_argument("--allow-missing", dest="allow_missing", action="store_true",
                       help="Write the merged file and exit 0 even if shards or episodes are missing "
                            "(the gate then counts them against coverage)")
    merge.add_argument("--allow-conflicts", dest="allow_conflicts", action="store_true",
                       help="Accept an episode with different results in two files: the later file's record wins")
    return parser


def _text_report(results: Results, verdicts: Mapping[str, Any] | None, baseline: Results | None,
                 width: int, gate: list[Verdict] | None = None, strict: bool = False) -> list[str]:
    from pytest_hud.report.table import gate_lines, sim_success_notes, summary_lines, verdict_dict

    lines = [f"results: {results.path}" + ("" if results.complete else " (incomplete)")]
    if baseline is not None:
        lines.append(f"baseline: {baseline.path}" + ("" if baseline.complete else " (incomplete)"))
    lines += summary_lines(results.tasks(), verdicts, width=width)
    lines += [f"warning: {note}" for note in sim_success_notes(results.tasks())]
    tables = _sensitivity(results)
    if tables:
        from pytest_hud.report.sensitivity import sensitivity_lines

        lines += [""] + sensitivity_lines(tables, width=width)
    if verdicts:
        lines.append("")
        for task, verdict in verdicts.items():
            v = verdict_dict(verdict) or {}
            kind, reason = v.get("verdict", "-"), v.get("reason")
            lines.append(f"{kind}: {task}: {reason}" if reason else f"{kind}: {task}")
    if gate is not None:
        lines += [text for text, _ in gate_lines(gate, strict=strict, reasons=False)]
    return lines


def _sensitivity(results: Results) -> list[Any]:
    """The pooled sensitivity tables of the results' robustness axes, from the episodes' records."""
    from pytest_hud.core.sensitivity import sensitivity_tables

    stored = (results.summary or {}).get("sensitivity") or [{}]  # the run's own alpha, when it wrote tables
    episodes = results.latest_episodes()
    scored_axes = {t.get("axis") for t in stored if t.get("metric") == "score"}  # as the run tabled them
    scored = {r.task for r in episodes if scored_axes & set(r.axes or ())}
    return sensitivity_tables(episodes, alpha=float(stored[0].get("alpha", 0.05)),
                              min_coverage=float(stored[0].get("min_coverage", 0.9)), score_tasks=scored)


def report(args: argparse.Namespace) -> int:
    """The ``report`` command; returns the exit status."""
    if args.history or args.sweep:
        return history(args)
    if len(args.results) > 1:
        raise InputError(f"{len(args.results)} results files given: one, or --history for a series of runs")
    results = _load(args.results[0], "RESULTS")
    baseline = _load(args.baseline, "BASELINE", quiet=True) if args.baseline else None
    gate: list[Verdict] | None = None
    verdicts: Mapping[str, Any] | None
    if baseline is None:
        # A run made with --hud-baseline carries its gate's verdicts: show them, decide nothing.
        verdicts = gate_verdicts((results.summary or {}).get("gate")) or None
    else:
        # Every input is checked before anything is compared, by the rules pytest's gate uses.
        for side, loaded in (("results", results), ("baseline", baseline)):
            problem = gate_input_problem(loaded, side, allow_incomplete=args.allow_incomplete,
                                         allow_flag="--allow-incomplete-baseline")
            if problem:
                raise InputError(f"{side.upper()}: {problem}")
        config = _gate_config(args, results)
        current = task_outcomes(results)
        deselected = set(results.deselected_episodes()) - {t for t, o in current.items() if o.episodes or o.n}
        gate = evaluate_gate(current, task_outcomes(baseline, as_baseline=True), config, deselected=deselected)
        verdicts = {v.task: v for v in gate}

    if args.markdown:
        from pytest_hud.report.markdown import comparison_markdown, summary_markdown

        summary = results.summary or {}
        if baseline is None:
            text = summary_markdown(results.tasks(), verdicts, coverage=summary.get("coverage"),
                                    sensitivity=_sensitivity(results))
        else:
            text = comparison_markdown(results.tasks(), baseline.tasks(), verdicts)
        sys.stdout.write(text)
    else:
        width = args.width or shutil.get_terminal_size((110, 24)).columns
        print("\n".join(_text_report(results, verdicts, baseline, width, gate, args.strict)))

    if args.html:
        from pytest_hud.report.html import write_standalone_page

        path = write_standalone_page(args.html, results, verdicts=verdicts,
                                     self_contained=args.self_contained)
        print(f"html: {path}", file=sys.stderr)

    if gate is not None:
        passed = gate_passed(gate, strict=args.strict)
        if not args.markdown:
            failing = [v for v in gate if not gate_passed([v], strict=args.strict)]
            if passed:
                print("gate: PASS")
            elif failing:
                print(f"gate: FAIL ({len(failing)} of {len(gate)} tasks)")
            else:
                print("gate: FAIL (nothing was compared)")
        return EXIT_OK if passed else EXIT_REGRESSION
    return EXIT_OK


def history(args: argparse.Namespace) -> int:
    """``report --history``: a series of runs as a page (HTML, default ``hud-history.html``), and
    markdown (``--markdown``) or a table on stdout."""
    from pathlib import Path

    from pytest_hud.report.history import build_history, history_markdown, history_text
    from pytest_hud.report.history import series_from_results, series_from_sweep
    from pytest_hud.report.history_html import history_page

    for option in ("baseline", "gate"):
        if getattr(args, option):
            raise InputError(f"--{'compare' if option == 'baseline' else option} compares two runs;"
                             f" --history shows a series (drop one of them)")
    files: list[Path] = []
    for name in args.results:
        path = Path(name)
        if path.is_dir():
            found = [_load(str(p), "RESULTS", quiet=True) for p in sorted(path.glob("*.jsonl"))]
            if not found:
                raise InputError(f"{name} holds no results file (*.jsonl)")
            found.sort(key=lambda r: (str(r.run.get("started") or ""), str(r.path)))
            files += found
        else:
            files.append(_load(name, "RESULTS", quiet=True))
    if args.sweep:
        if len(files) != 1:
            raise InputError(f"--sweep {args.sweep} reads one run whose tests take the checkpoint as a parameter;"
                             f" got {len(files)} results files")
        try:
            runs = series_from_sweep(files[0], args.sweep)
        except ValueError as exc:
            raise InputError(f"--sweep: {exc}") from None
    else:
        if len(files) < 2:
            raise InputError("--history needs two or more results files (or a folder of them), or --sweep PARAM"
                             " for a checkpoint sweep inside one run")
        runs = series_from_results(files)
    alpha = args.alpha if args.alpha is not None else 0.05
    if not 0.0 < alpha < 1.0:
        raise InputError(f"--alpha={alpha} must be strictly between 0 and 1 (e.g. 0.05)")
    built = build_history(runs, alpha=alpha)
    if args.markdown:
        sys.stdout.write(history_markdown(built))
    else:
        print("\n".join(history_text(built)))
    page = Path(args.html or "hud-history.html")
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(history_page(built), encoding="utf-8")
    print(f"html: {page}", file=sys.stderr)
    return EXIT_OK


def _gate_config(args: argparse.Namespace, results: Results) -> GateConfig:
    """The gate file, then the options, as ``--hud-gate`` and the ``--hud-*`` options combine."""
    from pathlib import Path

    from pytest_hud.gate import floors_problem
    from pytest_hud.controller.inputs import gate_config
    from pytest_hud.core.settings import SettingsError

    accept = [part.strip() for value in args.accept for part in value.split(",") if part.strip()]
    try:
        config = gate_config(Path(args.gate) if args.gate else None,
                             {key: getattr(args, key) for key in ("alpha", "max_drop", "min_coverage")},
                             accept, flags="--")
    except SettingsError as exc:
        raise InputError(str(exc)) from None
    tasks = set(results.tasks()) | set(results.deselected_episodes()) | set(results.declared_episodes() or ())
    problem = floors_problem(config.floors, tasks, flag="--gate")
    if problem:
        raise InputError(problem)
    return config


def merge(args: argparse.Namespace) -> int:
    """The ``merge`` command; returns the exit status."""
    import json
    import os
    import tempfile
    from pathlib import Path

    from pytest_hud.controller.merge import MergeError, merge_shards

    output = Path(args.output)
    for path in args.shards:
        if Path(path).exists() and output.exists() and output.resolve() == Path(path).resolve():
            raise InputError(f"-o {args.output} is one of the shard files; write the merged file elsewhere")
    files = [_load(path, "SHARD") for path in args.shards]
    try:
        found = merge_shards(files, prefer_later=args.allow_conflicts)
    except MergeError as exc:
        raise InputError(str(exc)) from None
    for note in found.notes + found.duplicates:
        print(f"note: {note}", file=sys.stderr)
    problems = []
    if found.missing_shards:
        problems.append(f"missing shard{'s' if len(found.missing_shards) > 1 else ''} "
                        f"{', '.join(f'{i}/{found.count}' for i in found.missing_shards)} (no file given for "
                        f"{'them' if len(found.missing_shards) > 1 else 'it'})")
    if found.missing_episodes:
        shown = ", ".join(f"{task} episode {ep}" for task, ep in found.missing_episodes[:10])
        more = len(found.missing_episodes) - 10
        problems.append(f"{len(found.missing_episodes)} of {found.suite_episodes} episodes of the suite are in no "
                        f"file: {shown}" + (f" and {more} more" if more > 0 else ""))
    fatal = (bool(problems) and not args.allow_missing) or (bool(found.conflicts) and not args.allow_conflicts)
    for problem in problems:
        print(f"{'error' if not args.allow_missing else 'warning'}: {problem}", file=sys.stderr)
    for conflict in found.conflicts:
        print(f"{'error' if not args.allow_conflicts else 'warning'}: {conflict}", file=sys.stderr)
    if fatal:
        flags = ([] if not problems or args.allow_missing else ["--allow-missing"]) + (
            [] if not found.conflicts or args.allow_conflicts else ["--allow-conflicts"])
        print(f"merge: nothing written; run the missing shards (or rerun the conflicting ones), or pass "
              f"{' and '.join(flags)} to write {args.output} anyway", file=sys.stderr)
        return EXIT_REGRESSION
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            for line in found.lines:
                fh.write(json.dumps(line) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, output)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    episodes = sum(1 for line in found.lines if line["record"] == "episode")
    present = ", ".join(str(i) for i in sorted(found.shards))
    print(f"merged: {len(files)} file{'s' if len(files) != 1 else ''} (shards {present} of {found.count}), "
          f"{episodes} of {found.suite_episodes} suite episodes -> {args.output}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m pytest_hud``; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "report":
            return report(args)
        if args.command == "merge":
            return merge(args)
    except InputError as exc:
        print(f"python -m pytest_hud {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `... | head` closed the pipe: not an error worth a traceback
        return EXIT_OK
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
