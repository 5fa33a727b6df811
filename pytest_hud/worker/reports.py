"""What an episode leaves on its test item and its reports, and when a worker drops it.

pytest keeps every test item and every report until the run ends (the terminal's statistics, in
xdist workers too). An episode's record rides on its reports (``hud_episode``) and is mirrored into
``user_properties`` for JUnit XML; once the reports are made and sent, the worker keeps none of it,
so a worker does not grow with the episodes it ran. The controller drops the same from the reports
it keeps once every plugin has read them (:mod:`pytest_hud.controller.kept_reports`).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest

from pytest_hud.worker.keys import EPISODES_KEY

__all__ = ["EPISODE_PROPERTIES", "forget_episode", "lighten_report"]

#: the record's fields a worker mirrors into the test's ``user_properties`` (JUnit XML reads them)
EPISODE_PROPERTIES = ("task", "episode", "seed", "outcome", "success", "score", "total_reward", "steps",
                      "duration_s", "slot")
#: what an episode's report keeps of its record once it is sent (shared and read-only: nothing per report)
_KEPT = {outcome: MappingProxyType({"outcome": outcome}) for outcome in ("passed", "failed", "error", "skipped")}
_NO_KEYWORDS: Any = MappingProxyType({})


def lighten_report(report: Any) -> None:
    """Drop an episode's record, mirrored properties and keywords from a report every plugin has logged.

    pytest keeps every report until the run ends (the terminal's statistics, in workers too); the
    report keeps only its outcome (the short summary's ERROR/FAILED reads it). Its keywords (the
    test's markers and names, a dict per report) are read while the report is logged, not after.
    """
    data = getattr(report, "hud_episode", None)
    if isinstance(data, dict):
        report.hud_episode = _KEPT.get(data.get("outcome"), _KEPT["error"])
        report.keywords = _NO_KEYWORDS
    if report.user_properties:
        report.user_properties = [p for p in report.user_properties if p[0] not in EPISODE_PROPERTIES]


def forget_episode(item: pytest.Item) -> None:
    """Drop what an episode left on its test item once its teardown report is made.

    pytest keeps every item until the run ends; the episode (its result, grade and claim) and the
    properties mirrored from its record would make a worker grow with every episode it ran.
    The teardown report already holds its own copy of the properties (for JUnit XML).
    """
    if EPISODES_KEY in item.stash:
        del item.stash[EPISODES_KEY]
    if item.user_properties:
        item.user_properties[:] = [p for p in item.user_properties if p[0] not in EPISODE_PROPERTIES]
