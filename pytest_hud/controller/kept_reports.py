"""What pytest keeps of an episode's reports once every plugin has seen them.

pytest holds every test report until the run ends (the terminal's statistics). An episode's
reports carry its whole record (``hud_episode``) and the properties mirrored from it for JUnit XML;
the controller has them in its tallies and its results file by then, so :class:`ReportLightener`
drops them: a report keeps only its outcome (the short summary's ERROR/FAILED reads it). It waits
for the test's teardown report, since pytest-html reads the call report's episode then (videos).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

__all__ = ["ReportLightener"]

#: what an episode's report keeps of its record (shared and read-only: nothing per report)
_KEPT = {outcome: MappingProxyType({"outcome": outcome}) for outcome in ("passed", "failed", "error", "skipped")}
#: the properties a worker mirrors from the record (JUnit XML has read them by then)
_EPISODE_PROPERTIES = frozenset({"task", "episode", "seed", "outcome", "success", "score", "total_reward", "steps",
                                 "duration_s", "slot"})


class ReportLightener:
    """Call :meth:`seen` with each report after every plugin has logged it."""

    def __init__(self) -> None:
        self._in_flight: dict[str, Any] = {}  # nodeid -> its episode's report, until its teardown

    def seen(self, report: Any) -> None:
        if isinstance(getattr(report, "hud_episode", None), dict):
            if report.when in ("setup", "call"):
                self._in_flight[report.nodeid] = report
                return
            _lighten(report)  # xdist's report of a crashed worker: no teardown follows
        if report.when == "teardown":
            carrier = self._in_flight.pop(report.nodeid, None)
            if carrier is not None:
                _lighten(carrier)
                _lighten(report)


def _lighten(report: Any) -> None:
    data = getattr(report, "hud_episode", None)
    if isinstance(data, dict):
        report.hud_episode = _KEPT.get(data.get("outcome"), _KEPT["error"])
    if report.user_properties:
        report.user_properties = [p for p in report.user_properties if p[0] not in _EPISODE_PROPERTIES]
