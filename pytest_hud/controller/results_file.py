"""The results file as the next baseline: where a run writes its results, and what becomes of them.

When ``--hud-results`` is the ``--hud-baseline`` file, the run writes a candidate beside it
(:func:`results_paths`), and only a run that passes its gate makes the candidate the baseline
(:func:`settle_baseline`); any other run leaves the baseline as it was.

The file is also the controller's memory of each episode: the controller keeps running tallies,
and reads the records back (:func:`episodes_written`) where the gate needs them episode by episode.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_hud.core.results import EpisodeRecord, ResultsWriter

__all__ = ["episodes_written", "results_paths", "settle_baseline"]

_EPISODE = '{"record": "episode"'  # how ResultsWriter starts an episode line


def episodes_written(path: Path, offset: int) -> Iterator[EpisodeRecord]:
    """The episode records of ``path`` from byte ``offset`` on (what this run appended), in order.

    Progress lines are skipped without parsing; a torn last line (a write in flight) is skipped too.
    """
    with open(path, encoding="utf-8") as fh:
        fh.seek(offset)
        for line in fh:
            if not line.startswith(_EPISODE):
                continue
            try:
                data = json.loads(line)
            except ValueError:
                continue
            data.pop("record", None)
            yield EpisodeRecord.from_dict(data)


def results_paths(results: Path, baseline: str | None, here: Path) -> tuple[Path, Path | None]:
    """Where this run writes its results, and the baseline path to replace if it passes.

    When ``--hud-results`` is the ``--hud-baseline`` file (the results of the last run judge this
    one), the run writes ``NAME.candidate.jsonl`` beside it, and only a run that passes replaces
    the baseline: a failing checkpoint's results never become the baseline it failed against, so
    running the failed job again fails again.
    """
    if baseline and (here / baseline).resolve() == results.resolve():
        return results.with_name(f"{results.stem}.candidate{results.suffix or '.jsonl'}"), results
    return results, None


def settle_baseline(writer: ResultsWriter | None, results: Path | None, baseline: Path | None,
                    exitstatus: int) -> str | None:
    """When the results file is the baseline too: a passing run's results become the baseline
    (replaced atomically); any other run leaves the baseline as it was, its results beside it.

    Returns the note the summary shows (None when the results file is not the baseline).
    """
    if baseline is None or writer is None or results is None:
        return None
    writer.close()
    if exitstatus == pytest.ExitCode.OK:
        os.replace(results, baseline)
        writer.path = baseline
        return f"the run passed its gate: its results are the new baseline {baseline}"
    return (f"the baseline {baseline} is unchanged (this run did not pass);"
            f" its results are in {results}")
