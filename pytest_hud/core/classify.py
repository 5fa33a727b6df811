"""What an episode test's outcome is, and the record a worker sends for it.

Pure (no pytest, no I/O): the worker's hooks pass in the test's phase, its exception and what the
episode reported. The rules:

- the bridge's own verdict (a timeout, a disconnect, a sim exception) makes an episode an **error**,
  whatever the test asserted afterwards or whoever interrupted it;
- an ``AssertionError`` in the call phase (or ``pytest.fail``) is a **failed** episode: the policy
  did not succeed;
- every other exception, and any problem outside the call phase, is an **error**: nothing was
  learned about the policy, so the episode counts against coverage, not against the success rate;
- pytest-timeout raises pytest's own ``Failed`` (the type ``pytest.fail`` raises too), so its
  ``Timeout >Ns`` message is the only thing that tells it apart: that one case reads the message.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from pytest_hud.core.results import EpisodeRecord, EpisodeResult, to_builtin

__all__ = ["classify", "episode_identity", "episode_record", "episode_teststatus", "is_episode_error", "skip_reason"]


def episode_identity(nodeid: str, params: Mapping[str, Any] | None, callspec_id: str | None = None) -> dict[str, Any]:
    """Task (test function + non-episode parameters), episode id and seed of a test.

        >>> episode_identity("t.py::test_x[3-a]", {"seed": 3, "arm": "a"})["task"]
        't.py::test_x[arm=a]'
    """
    params = dict(params or {})
    key = "episode" if "episode" in params else "seed" if "seed" in params else None
    base = nodeid.split("[", 1)[0]
    others = {k: v for k, v in params.items() if k != key}
    task = base + (f"[{','.join(f'{k}={_short(v)}' for k, v in sorted(others.items()))}]" if others else "")
    if key is not None:
        episode = str(params[key])
    else:
        episode = callspec_id if callspec_id is not None else "0"
    seed = params.get("seed")
    seed = int(seed) if isinstance(seed, int) or (hasattr(seed, "__index__") and not isinstance(seed, bool)) else None
    return {"task": task, "episode": episode, "seed": seed, "nodeid": nodeid}


def _short(value: Any) -> str:
    """A parameter value as it appears in a task id: up to 40 characters as they are; a longer one
    is cut and ends in a digest of its whole text, so two values that share a long prefix stay two
    tasks (the gate pairs episodes by task id).

        >>> _short("x" * 50)
        'xxxxxxxxxxxxxxxxxxxxxxxxxxxxx...77cf1206'
    """
    text = str(value)
    if len(text) <= 40:
        return text
    return text[:29] + "..." + hashlib.sha256(text.encode()).hexdigest()[:8]


def classify(*, when: str, passed: bool, skipped: bool, exc: BaseException | None, bridge_error: str | None,
             failure_types: tuple[type[BaseException], ...] = (AssertionError,)) -> str:
    """``passed``, ``failed``, ``error`` or ``skipped`` (see the module docstring).

    ``failure_types``: the exceptions that mean "the policy failed" (the plugin adds pytest's
    ``Failed``, so ``pytest.fail`` is a failure too).
    """
    if skipped:
        return "skipped"
    if passed and not bridge_error:
        return "passed"
    if (when == "call" and exc is not None and isinstance(exc, failure_types) and not bridge_error
            and not _is_pytest_timeout(exc)):
        return "failed"
    return "error"


def _is_pytest_timeout(exc: BaseException) -> bool:
    return str(exc).startswith("Timeout")


def skip_reason(longrepr: Any) -> str | None:
    """The reason of a skipped report (its longrepr is ``(path, line, "Skipped: reason")``)."""
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr or "")
    text = str(text).strip()
    return (text[len("Skipped: "):] if text.startswith("Skipped: ") else text)[:500] or None


def episode_record(ident: Mapping[str, Any], *, outcome: str, identity: Mapping[str, Any], worker: str,
                   duration_s: float, exc: BaseException | None = None, bridge_error: str | None = None,
                   skipped_because: str | None = None, result: EpisodeResult | None = None,
                   grade: Mapping[str, Any] | None = None) -> EpisodeRecord:
    """The record of an episode test (``ident``: :func:`episode_identity`), which a worker sends on
    the test's report (``hud_episode``, as :meth:`~pytest_hud.core.results.EpisodeRecord.to_dict`).

    ``result`` is the :class:`~pytest_hud.core.results.EpisodeResult` when the agent finished the episode;
    ``grade`` the bridge's grade when only that is known (the test failed before the agent returned).
    """
    error = None
    if outcome == "error":
        if bridge_error:
            error = str(bridge_error)[:2000]
        elif exc is not None:
            error = f"{type(exc).__name__}: {exc}"[:2000]
    record = EpisodeRecord(
        task=ident["task"], episode=ident["episode"], nodeid=ident["nodeid"], seed=ident.get("seed"),
        outcome=outcome, success={"passed": True, "failed": False}.get(outcome), worker=worker,
        duration_s=float(duration_s), error=error, skip_reason=skipped_because if outcome == "skipped" else None,
        identity=to_builtin(dict(identity)),
    )
    if result is not None:
        record.take_result(result)
    elif grade is not None:
        record.take_result(EpisodeResult.from_dict(grade), graded_only=True)
    return record


def is_episode_error(report: Any) -> bool:
    """An episode test's report that is an error (a crash, timeout or sim error), not a failed episode."""
    data = getattr(report, "hud_episode", None)
    return bool(data) and data.get("outcome") == "error" and report.failed


def episode_teststatus(report: Any):
    """A crash, timeout or sim error is an *error* (E), not a failed episode (F)."""
    if is_episode_error(report) and report.when not in ("setup", "teardown"):  # call, or xdist's crash
        return "error", "E", "ERROR"
    return None
