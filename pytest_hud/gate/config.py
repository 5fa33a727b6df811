"""The gate's configuration: how strict it is (:class:`GateConfig`), the YAML gate file, and floors.

Pure logic (no pytest, no I/O): :func:`load_gate_file` parses a gate file's text into
:class:`GateConfig` arguments with error messages that name the offending key and the fix;
:func:`floor_for` finds the floor that applies to a task, and :func:`floors_problem` is the usage
error for floors that match no task of the run.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pytest_hud.gate.outcomes import TASK_FIELDS

__all__ = [
    "METRICS",
    "GateConfig",
    "metric_for",
    "floor_for",
    "floors_problem",
    "load_gate_file",
    "unmatched_floors",
]


#: What a task can be gated on: its test outcomes, or the sim's graded score per episode.
METRICS: tuple[str, ...] = ("success", "score")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass
class GateConfig:
    """How strict the gate is. All rates and drops are absolute fractions (0.05 = 5 points).

    ``alpha``: family-wise false-alarm rate across tasks. ``max_drop``: drops up to this are
    tolerated. ``floors``: minimum success per task id or glob (exact ids win, then the first
    matching glob in insertion order). ``min_coverage``: fraction of declared episodes that must
    finish without error. ``power``/``detect_drop``: a non-significant task passes only when a drop
    of ``detect_drop`` (default ``max_drop + 0.10``) would have been flagged with this probability.
    ``accept``: fields of :data:`TASK_FIELDS` whose difference from the baseline is accepted on
    purpose (the task is compared anyway). ``metrics``: task id or glob -> ``"success"`` (the
    default) or ``"score"`` (the sim's graded score, compared with rank tests; ``max_drop`` and
    ``detect_drop`` are then in score units).
    """

    alpha: float = 0.05
    max_drop: float = 0.0
    floors: dict[str, float] = field(default_factory=dict)
    min_coverage: float = 0.9
    power: float = 0.8
    detect_drop: float | None = None
    accept: tuple[str, ...] = ()
    metrics: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.accept = tuple(self.accept)
        for pattern, metric in self.metrics.items():
            if metric not in METRICS:
                raise ValueError(f"metric for {pattern!r} is {metric!r}; it must be one of {', '.join(METRICS)}")
        for name in self.accept:
            if name not in TASK_FIELDS:
                raise ValueError(
                    f"cannot accept a difference in {name!r}{_did_you_mean(name, TASK_FIELDS)}: the fields that"
                    f" define a task are {', '.join(TASK_FIELDS)}"
                )
        for name in ("alpha", "max_drop", "min_coverage", "power"):
            if not _is_number(getattr(self, name)):
                raise ValueError(f"{name} must be a number, got {getattr(self, name)!r}")
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha={self.alpha} must be strictly between 0 and 1 (e.g. 0.05)")
        if not 0.0 <= self.max_drop < 1.0:
            raise ValueError(f"max_drop={self.max_drop} must be in [0, 1) (e.g. 0.05 tolerates 5 points)")
        if not 0.0 <= self.min_coverage <= 1.0:
            raise ValueError(f"min_coverage={self.min_coverage} must be in [0, 1] (e.g. 0.9)")
        if not 0.0 < self.power < 1.0:
            raise ValueError(f"power={self.power} must be strictly between 0 and 1 (e.g. 0.8)")
        if self.detect_drop is not None:
            if not _is_number(self.detect_drop):
                raise ValueError(f"detect_drop must be a number, got {self.detect_drop!r}")
            if not self.max_drop < self.detect_drop < 1.0:
                raise ValueError(
                    f"detect_drop={self.detect_drop} must be above max_drop={self.max_drop} and below 1:"
                    " the gate cannot be asked to catch drops it tolerates"
                )
        for pattern, floor in self.floors.items():
            if not isinstance(pattern, str):
                raise ValueError(f"floor keys must be task ids or globs (strings), got {pattern!r}")
            if not _is_number(floor) or not 0.0 <= floor <= 1.0:
                raise ValueError(
                    f"floor for {pattern!r} is {floor!r}; min_success must be a number in [0, 1]"
                )

    @property
    def target_drop(self) -> float:
        """The drop a passing task must have been able to detect."""
        if self.detect_drop is not None:
            return self.detect_drop
        return min(0.99, self.max_drop + 0.10)


# --------------------------------------------------------------------------------------------------
# gate file
# --------------------------------------------------------------------------------------------------

_TOP_KEYS = ("alpha", "max_drop", "min_coverage", "power", "detect_drop", "accept_differences", "tasks")
_NUMBER_KEYS = ("alpha", "max_drop", "min_coverage", "power", "detect_drop")
_TASK_KEYS = ("min_success", "metric")


def _did_you_mean(key: object, known: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(str(key), known, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def load_gate_file(text: str, *, source: str = "gate file") -> dict[str, Any]:
    """Parse a YAML gate file into keyword arguments for :class:`GateConfig`.

    Example::

        alpha: 0.05
        max_drop: 0.05
        min_coverage: 0.9
        tasks:
          "evals/test_pusht.py::test_push": {min_success: 0.6}
          "evals/test_aloha.py::*": {min_success: 0.3}
          "evals/test_pusht.py::*": {metric: score}

    Returns only the keys the file sets, with ``tasks`` turned into ``floors`` (pattern -> floor), so
    the caller can lay it over options: ``GateConfig(**{**from_options, **load_gate_file(text)})``.
    Raises ``ValueError`` naming the offending key for unknown keys, wrong types and bad ranges.
    """
    import yaml  # only the gate file needs it

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{source} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(
            f"{source} must be a mapping of settings (alpha, max_drop, ...), got {type(data).__name__}"
        )
    unknown = [key for key in data if key not in _TOP_KEYS]
    if unknown:
        raise ValueError(
            f"{source}: unknown key {unknown[0]!r}{_did_you_mean(unknown[0], _TOP_KEYS)};"
            f" known keys are {', '.join(_TOP_KEYS)}"
        )
    out: dict[str, Any] = {}
    if "accept_differences" in data:
        accept = data["accept_differences"]
        if isinstance(accept, str):
            accept = [accept]
        if not isinstance(accept, list) or not all(isinstance(a, str) for a in accept):
            raise ValueError(f"{source}: accept_differences must be a list of field names, e.g. [build],"
                             f" got {accept!r}")
        out_accept = tuple(accept)
    else:
        out_accept = None
    for key in _NUMBER_KEYS:
        if key in data:
            value = data[key]
            if not _is_number(value):
                raise ValueError(f"{source}: {key} must be a number, got {type(value).__name__} {value!r}")
            out[key] = float(value)
    if "tasks" in data:
        tasks = data["tasks"]
        if not isinstance(tasks, dict):
            raise ValueError(
                f"{source}: tasks must map task ids or globs to settings, e.g."
                f" {{'evals/test_x.py::test_y': {{min_success: 0.6}}}}; got {type(tasks).__name__}"
            )
        floors: dict[str, float] = {}
        metrics: dict[str, str] = {}
        for pattern, settings in tasks.items():
            if not isinstance(pattern, str):
                raise ValueError(f"{source}: task key {pattern!r} must be a string (a task id or a glob)")
            if not isinstance(settings, dict):
                raise ValueError(
                    f"{source}: tasks[{pattern!r}] must be a mapping like {{min_success: 0.6}},"
                    f" got {type(settings).__name__} {settings!r}"
                )
            bad = [key for key in settings if key not in _TASK_KEYS]
            if bad:
                raise ValueError(
                    f"{source}: tasks[{pattern!r}]: unknown key {bad[0]!r}"
                    f"{_did_you_mean(bad[0], _TASK_KEYS)};"
                    f" known keys are {', '.join(_TASK_KEYS)}"
                )
            if "min_success" in settings:
                value = settings["min_success"]
                if not _is_number(value):
                    raise ValueError(
                        f"{source}: tasks[{pattern!r}].min_success must be a number,"
                        f" got {type(value).__name__} {value!r}"
                    )
                floors[pattern] = float(value)
            if "metric" in settings:
                if settings["metric"] not in METRICS:
                    raise ValueError(f"{source}: tasks[{pattern!r}].metric must be one of {', '.join(METRICS)},"
                                     f" got {settings['metric']!r}")
                metrics[pattern] = str(settings["metric"])
        out["floors"] = floors
        if metrics:
            out["metrics"] = metrics
    if out_accept is not None:
        out["accept"] = out_accept
    try:
        GateConfig(**out)  # one place for the range rules
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None
    return out


# --------------------------------------------------------------------------------------------------
# floors
# --------------------------------------------------------------------------------------------------


def floor_for(task: str, floors: Mapping[str, float]) -> float | None:
    """The floor that applies to ``task``: its exact id first, else the first glob that matches."""
    if task in floors:
        return float(floors[task])
    for pattern, floor in floors.items():
        if fnmatch.fnmatchcase(task, pattern):
            return float(floor)
    return None


def metric_for(task: str, metrics: Mapping[str, str]) -> str:
    """The metric ``task`` is gated on: its exact id first, else the first glob that matches, else success."""
    if task in metrics:
        return metrics[task]
    return next((m for pattern, m in metrics.items() if fnmatch.fnmatchcase(task, pattern)), "success")


def unmatched_floors(floors: Mapping[str, float], tasks: Iterable[str]) -> list[str]:
    """The floor patterns (task ids or globs) that match none of ``tasks``."""
    tasks = list(tasks)
    return [pattern for pattern in floors
            if pattern not in tasks and not any(fnmatch.fnmatchcase(task, pattern) for task in tasks)]


def floors_problem(floors: Mapping[str, float], tasks: Iterable[str], flag: str = "--hud-gate") -> str | None:
    """The usage error for gate-file floors that match none of ``tasks`` (None when all match)."""
    tasks = sorted(tasks)
    unmatched = unmatched_floors(floors, tasks)
    if not unmatched:
        return None
    shown = ", ".join(tasks[:5]) + (f" and {len(tasks) - 5} more" if len(tasks) > 5 else "")
    many = len(unmatched) > 1
    return (f"{flag}: the floor{'s' if many else ''} for {', '.join(map(repr, unmatched))} match{'' if many else 'es'}"
            f" no task of this run (a typo, or a renamed test?); its tasks are: {shown or 'none'}")
