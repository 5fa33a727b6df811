"""Everything a run reads before it writes: checked and loaded in one step, with no side effects.

:func:`load_inputs` takes the run's :class:`~pytest_hud.core.settings.HudSettings` and the directory the
run was invoked from, checks what the settings name (sim targets, policies, announce files, the
recording directory, PyAV for videos) and loads the input files completely (gate file, baseline,
resume file). It returns the settings with paths made absolute, plus the loaded :class:`RunInputs`.
Nothing is created: a bad input raises :class:`~pytest_hud.core.settings.SettingsError` (the plugin turns
it into a usage error) and leaves the filesystem as it was; and a results file that is also the
baseline is read before the run truncates it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_hud.core.results import EpisodeRecord, Results, gate_input_problem, load_results
from pytest_hud.core.settings import HudSettings, SettingsError

__all__ = ["RunInputs", "gate_config", "load_inputs"]


@dataclass
class RunInputs:
    """The gate's settings, the baseline, and the resumable episodes of a run."""

    gate_config: Any  # pytest_hud.gate.GateConfig
    baseline: Results | None = None
    resumable: dict[tuple[str, str], EpisodeRecord] = field(default_factory=dict)


def load_inputs(settings: HudSettings, here: Path, *, video_explicit: bool = False,
                report_html: str | None = None, test_dirs: Sequence[Path] = ()) -> tuple[HudSettings, RunInputs]:
    """Check ``settings`` against the environment and load every input file.

    ``video_explicit``: the user asked for videos (without PyAV that is an error; the default
    quietly turns them off). ``report_html``: pytest-html's ``--html`` path (videos go beside it).
    ``test_dirs``: the folders of the run's test paths, which pytest puts on ``sys.path`` when it
    collects them, so ``--hud-sim=sims:my_task`` may name a module beside the tests.
    """
    settings = _check_environment(settings, here, video_explicit, test_dirs)
    settings = _absolute_paths(settings, here, report_html)
    loaded: dict[str, Results] = {}
    for key in ("baseline", "resume"):
        if getattr(settings, key):
            try:
                loaded[key] = load_results(getattr(settings, key))
            except ValueError as exc:
                raise SettingsError(f"--hud-{key}: {exc}") from None
    if "baseline" in loaded:
        problem = gate_input_problem(loaded["baseline"], "baseline",
                                     allow_incomplete=settings.allow_incomplete_baseline)
        if problem:
            raise SettingsError(f"--hud-baseline: {problem}")
    resumable = {}
    if "resume" in loaded:  # finished episodes (passed or failed; errors run again) by (task, episode)
        resumable = {(r.task, str(r.episode)): r for r in loaded["resume"].latest_episodes()
                     if r.outcome in ("passed", "failed")}
    return settings, RunInputs(_gate_config(settings, here), loaded.get("baseline"), resumable)


def _check_environment(settings: HudSettings, here: Path, video_explicit: bool,
                       test_dirs: Sequence[Path] = ()) -> HudSettings:
    if settings.video != "none":
        from pytest_hud.recording import video_available

        if not video_available():
            if video_explicit:
                raise SettingsError(f"--hud-video {settings.video} needs PyAV: pip install 'pytest-hud[video]' "
                                    "(or pass --hud-video none)")
            settings = settings.replace(video="none")  # the default asks for videos only where they can be made
    if settings.record:
        from pytest_hud.recording.dataset import check_record_dir, recording_available

        if not recording_available():
            raise SettingsError("--hud-record writes LeRobot datasets: pip install 'pytest-hud[lerobot]'")
        settings = settings.replace(record=str((here / settings.record).resolve()))
        try:
            check_record_dir(settings.record)
        except FileExistsError as exc:
            raise SettingsError(f"--hud-record: {exc}") from None
    if settings.sim:
        from pytest_hud.sim.target import TargetError, describe_target  # (numpy: only for a sim named here)

        try:
            with _beside_tests(test_dirs):
                describe_target(settings.sim)
        except (TargetError, ImportError) as exc:
            raise SettingsError(f"--hud-sim: {exc}") from None
    if settings.policy:
        from pytest_hud.agent.model import PolicyError, check_policy_spec

        try:
            with _beside_tests(test_dirs):
                check_policy_spec(settings.policy, here)
        except PolicyError as exc:
            raise SettingsError(f"--hud-policy: {exc}") from None
    if settings.results and (here / settings.results).is_dir():
        raise SettingsError(f"--hud-results {settings.results!r} is a directory: name the results file, e.g. "
                            f"{str(Path(settings.results) / 'hud-results.jsonl')!r}")
    if settings.sim_url and not Path(settings.sim_url).is_file():
        raise SettingsError(
            f"--hud-sim-url {settings.sim_url!r}: no such announce file; start a bridge with "
            "`python -m pytest_hud.bridge TARGET --width N --announce PATH` and pass that PATH"
        )
    return settings


@contextlib.contextmanager
def _beside_tests(test_dirs: Sequence[Path]) -> Iterator[None]:
    """The test folders on ``sys.path`` meanwhile, as collection puts them: a module beside the tests resolves."""
    added = [str(d) for d in test_dirs if str(d) not in sys.path]
    sys.path[:0] = added
    try:
        yield
    finally:
        for d in added:
            sys.path.remove(d)


def _absolute_paths(settings: HudSettings, here: Path, report_html: str | None) -> HudSettings:
    """Absolute paths for workers (they may run elsewhere in the tree): videos go beside the report."""
    changes: dict[str, str] = {}
    if settings.video != "none" and not settings.video_dir:
        anchor = report_html or settings.html or settings.results
        changes["video_dir"] = str(((here / anchor).parent if anchor else here) / "hud-videos")
    for key in ("video_dir", "trace_dir", "html"):
        value = changes.get(key, getattr(settings, key))
        if value:
            changes[key] = str((here / value).resolve())
    return settings.replace(**changes)


def _gate_config(settings: HudSettings, here: Path):
    """The gate's settings: the YAML gate file, then command-line/ini overrides."""
    return gate_config(here / settings.gate if settings.gate else None,
                       {key: getattr(settings, key) for key in ("alpha", "max_drop", "min_coverage")},
                       settings.accepted_differences)


def gate_config(gate_file: Path | None, options: Mapping[str, float | None], accept: Sequence[str] = (), *,
                flags: str = "--hud-"):
    """A :class:`~pytest_hud.gate.GateConfig` from a YAML gate file, then the options that are set
    (``alpha``, ``max_drop``, ``min_coverage``) and the accepted differences on top; pytest and
    ``python -m pytest_hud report`` build theirs here. ``flags`` is how the errors name the options
    (``--hud-gate`` or ``--gate``). Raises :class:`~pytest_hud.core.settings.SettingsError`."""
    from pytest_hud.gate import GateConfig, load_gate_file

    data: dict[str, Any] = {}
    if gate_file is not None:
        try:
            data = load_gate_file(gate_file.read_text(encoding="utf-8"), source=str(gate_file))
        except FileNotFoundError:
            raise SettingsError(f"{flags}gate: {gate_file} does not exist") from None
        except (OSError, ValueError) as exc:
            raise SettingsError(f"{flags}gate: {exc}") from None
    data.update({key: value for key, value in options.items() if value is not None})
    if accept:
        try:
            GateConfig(accept=tuple(accept))
        except ValueError as exc:
            raise SettingsError(f"{flags}accept-difference: {exc}") from None
        data["accept"] = tuple(dict.fromkeys((*data.get("accept", ()), *accept)))
    try:
        return GateConfig(**data)
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"gate settings: {exc}") from None
