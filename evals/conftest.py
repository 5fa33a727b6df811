"""Preparation the example suites need before the run declares its episodes.

pytest-hud checks every marker's policy when the run declares its episodes, at the end of
collection, before any fixture runs: a checkpoint a suite builds on first use (PushT's) has to exist
by then. A test module that defines ``prepare(config)`` gets it called here once, after -k/-m
selection, when one of its tests is selected.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(trylast=True)  # after -k/-m: only suites that will run are prepared
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    prepared = set()
    for item in items:
        module = getattr(item, "module", None)
        prepare = getattr(module, "prepare", None)
        if callable(prepare) and module.__name__ not in prepared:
            prepared.add(module.__name__)
            prepare(config)
