"""JUnit XML for pytest-hud: errored episodes as ``<error>``, and one testcase per gate verdict.

Both work on pytest's own junitxml plugin (``--junitxml``) and do nothing without it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from pytest_hud.core.classify import is_episode_error

__all__ = ["JunitErrors", "add_gate_cases"]


class JunitErrors:
    """Runs after junitxml: an errored episode's call report becomes a JUnit ``<error>``.

    junitxml writes every failed call report as ``<failure>``; for an episode that crashed, timed out
    or met a sim error the right element is ``<error>`` (counted as such in the testsuite).
    """

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call" or not is_episode_error(report):
            return
        from _pytest.junitxml import xml_key

        xml = self.config.stash.get(xml_key, None)
        if xml is None:
            return
        for node in xml.node_reporter(report).nodes:
            if node.tag == "failure":
                node.tag = "error"
                xml.stats["failure"] = xml.stats.get("failure", 1) - 1
                xml.stats["error"] = xml.stats.get("error", 0) + 1


def add_gate_cases(config: pytest.Config, verdicts: Iterable[Any], *, strict: bool = False) -> None:
    """One JUnit testcase per task for the gate's verdict (``hud-gate.<task>``; CI dashboards show them).

    A verdict that fails the gate (with ``strict``, an inconclusive one too) is a failed testcase."""
    from _pytest.junitxml import xml_key
    from _pytest.reports import TestReport

    from pytest_hud.gate import gate_passed

    xml = config.stash.get(xml_key, None)
    if xml is None:
        return
    for v in verdicts:
        failed = not gate_passed([v], strict=strict)
        nodeid = f"hud-gate::{v.task}"
        props = [(k, val) for k, val in v.to_dict().items() if val is not None and not isinstance(val, (list, dict))]
        for when in ("setup", "call", "teardown"):
            report = TestReport(nodeid, ("hud-gate", None, v.task), {},
                                "failed" if failed and when == "call" else "passed",
                                f"{v.verdict}: {v.reason}" if failed and when == "call" else None,
                                when, [], 0.0, user_properties=props if when == "teardown" else [])
            xml.pytest_runtest_logreport(report)
