"""Repository-level pytest configuration: the scaffold shared by the project's own test suites.

- ``pytester`` is loaded here (not in every test module), since most end-to-end tests drive a real
  pytest run in a subprocess;
- the suite is laid out by kind: ``tests/unit/`` holds the in-process tests (pure logic, seconds),
  ``tests/e2e/`` the end-to-end ones (pytest runs, bridges and policy servers in subprocesses; the
  LeRobot, Meta-World and Ray suites in their own folders). The ``slow`` marker comes from that
  folder, so a test cannot be unmarked by its name or its fixtures. So

      pytest tests/unit -n 2               # pure logic in seconds (or: pytest tests -m "not slow")
      pytest tests -n 2                    # everything (what .ci/run runs)

The example suites in ``evals/`` keep their own ``pytest.ini`` (as a user's project would) and are
not configured from here.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

#: Fixtures that start processes: a test in tests/unit that uses one is in the wrong folder.
_PROCESS_FIXTURES = frozenset({"pytester", "bridge", "testdir"})


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: end-to-end test (subprocesses, real bridges); deselect with -m 'not slow'")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    e2e = config.rootpath / "tests" / "e2e"
    unit = config.rootpath / "tests" / "unit"
    for item in items:
        if item.path.is_relative_to(e2e):
            item.add_marker(pytest.mark.slow)
        elif item.path.is_relative_to(unit) and _PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            raise pytest.UsageError(f"{item.nodeid} starts processes ({', '.join(sorted(_PROCESS_FIXTURES & set(item.fixturenames)))}): "
                                    "move it to tests/e2e/, where end-to-end tests live")
