"""The terminal's pytest-hud summary: the per-task table, coverage, the sensitivity tables, recordings, the gate."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pytest_hud.report.table import gate_lines, sim_success_notes, summary_lines

__all__ = ["write_progress", "write_summary"]


def write_progress(tr: Any, line: str) -> None:
    """The live progress line on a line of its own (no-op without a terminal reporter)."""
    if tr is None:
        return
    # Start a fresh line (under xdist the dots row has no file path, so write_line alone would
    # not) so pytest's own progress dots and percentages stay intact around ours.
    if getattr(tr._tw, "width_of_current_line", 0):
        tr._tw.line()
    tr.write_line(line, cyan=True)


def write_summary(tr: Any, tasks: Mapping[str, Any], verdicts: list[Any] | None, coverage: Mapping[str, Any],
                  *, results: str | None = None, recording: Mapping[str, Any] | None = None,
                  baseline: str | None = None, other_failures: int = 0, notes: list[str] | None = None,
                  strict: bool = False, baseline_note: str | None = None,
                  sensitivity: list[Any] | None = None) -> None:
    """Write the summary section with pytest's terminal reporter ``tr``."""
    from pytest_hud.gate import gate_passed

    tr.write_sep("=", "pytest-hud summary")
    verdict_dicts = None if verdicts is None else {v.task: v.to_dict() for v in verdicts}
    for line in summary_lines(tasks, verdict_dicts):
        tr.write_line(line)
    for note in sim_success_notes(tasks):
        tr.write_line(f"warning: {note}", yellow=True, bold=True)
    cov = coverage
    text = (f"coverage: {cov['reported']}/{cov['declared']} declared episodes reported, "
            f"{cov['graded']} graded, {cov['errors']} errors, {cov['skipped']} skipped")
    if cov["missing"]:
        text += f"; MISSING {len(cov['missing'])}: " + ", ".join(cov["missing"][:5])
        tr.write_line(text, red=True, bold=True)
    else:
        tr.write_line(text, yellow=bool(cov["errors"]))
    if sensitivity:
        from pytest_hud.report.sensitivity import sensitivity_lines

        for line in sensitivity_lines(sensitivity):
            tr.write_line(line, red=line.endswith("WORSE"), yellow=line.endswith("LOW COVERAGE"))
    if results is not None:
        tr.write_line(f"results: {results}")
    for note in notes or ():
        tr.write_line(f"note: {note}", yellow=True)
    if recording is not None:
        for ds in recording["datasets"]:
            tr.write_line(f"recorded: {ds['episodes']} episodes, {ds['frames']} frames -> {ds['path']} "
                          "(LeRobot v3 dataset)")
        for text in list(recording.get("warnings", [])) + ([recording["error"]] if recording.get("error") else []):
            tr.write_line(f"recording: {text}", yellow=True)
    if verdicts is None:
        return
    for line, fails in gate_lines(verdicts, strict=strict):
        tr.write_line(line, red=fails, yellow=not fails)
    ok = gate_passed(verdicts, strict=strict)
    against = f" against {baseline}" if baseline else ""
    kinds: dict[str, int] = {}
    for v in verdicts:
        kinds[v.verdict] = kinds.get(v.verdict, 0) + 1
    counts = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items()))
    tr.write_line(f"gate{against}: {'PASSED' if ok else 'FAILED'} ({counts})"
                  + ("; other tests failed" if other_failures else ""),
                  green=ok and not other_failures, red=not ok or bool(other_failures), bold=True)
    if baseline_note:
        tr.write_line(f"results: {baseline_note}", yellow="unchanged" in baseline_note)
