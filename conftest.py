"""Repository-level pytest configuration: the scaffold shared by the project's own test suites.

- ``pytester`` is loaded here (not in every test module), since most end-to-end tests drive a real
  pytest run in a subprocess;
- the ``slow`` marker is given to every end-to-end test: a test that starts pytest runs, bridges or
  policy servers in subprocesses (it uses ``pytester``, ``bridge``, or lives in a drill module). So

      pytest tests -m "not slow" -n 2      # pure logic in seconds
      pytest tests -n 2                    # everything (what .ci/run runs)

The example suites in ``evals/`` keep their own ``pytest.ini`` (as a user's project would) and are
not configured from here.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

#: Fixtures that start processes: a test using one is end to end.
_PROCESS_FIXTURES = frozenset({"pytester", "bridge", "testdir"})
#: Modules that are end to end as a whole (drills, the browser, the example evals).
_SLOW_MODULES = ("test_drills_", "test_evals", "test_report_html_browser", "test_policy_server", "test_bridge")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: end-to-end test (subprocesses, real bridges); deselect with -m 'not slow'")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = item.path.name
        if _PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())) or module.startswith(_SLOW_MODULES):
            item.add_marker(pytest.mark.slow)
