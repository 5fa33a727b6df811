"""What pytest keeps of an episode's reports once every plugin has seen them.

pytest holds every test report until the run ends (the terminal's statistics). An episode's
reports carry its whole record (``hud_episode``) and the properties mirrored from it for JUnit XML;
the controller has them in its tallies and its results file by then, so :class:`ReportLightener`
drops them: a report keeps only its outcome (the short summary's ERROR/FAILED reads it). It waits
for the test's teardown report, since pytest-html reads the call report's episode then (videos).
"""

from __future__ import annotations

from typing import Any

from pytest_hud.worker.reports import lighten_report

__all__ = ["ReportLightener"]


class ReportLightener:
    """Call :meth:`seen` with each report after every plugin has logged it."""

    def __init__(self) -> None:
        self._in_flight: dict[str, Any] = {}  # nodeid -> its episode's report, until its teardown

    def seen(self, report: Any) -> None:
        if isinstance(getattr(report, "hud_episode", None), dict):
            if report.when in ("setup", "call"):
                self._in_flight[report.nodeid] = report
                return
            lighten_report(report)  # xdist's report of a crashed worker: no teardown follows
        if report.when == "teardown":
            carrier = self._in_flight.pop(report.nodeid, None)
            if carrier is not None:
                lighten_report(carrier)
                lighten_report(report)

