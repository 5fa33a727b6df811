"""The run's settings as one frozen object: one table of options, one precedence rule, one set of timeouts.

Pure (no pytest, no I/O): the plugin reads the command line and the ini file into two dicts of raw
values and calls :meth:`HudSettings.build`; workers get :meth:`HudSettings.to_dict` through xdist and
rebuild it with :meth:`HudSettings.from_dict`. Per test, :meth:`HudSettings.for_item` applies the
``hud`` marker with the one precedence rule of the whole plugin:

- ``policy``: command line > marker > ini > default (``--hud-policy`` evaluates another checkpoint
  on a suite as it is);
- every other per-test key (``sim``, ``max_steps``, ``build``, ``min_success``): marker > command
  line > ini > default (the options give a default to tests that don't say);
- ``rename``: the marker's map merged over ``--hud-policy-rename`` / ``hud_policy_rename`` (the
  marker wins for an observation key both name).

Timeouts and the margins that clients add on top of the bridge's own timeouts are derived here only
(:class:`Timeouts`), so a client never gives up before the server it waits for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from pytest_hud.core.shard import Shard, parse_shard

__all__ = ["OPTIONS", "Option", "SettingsError", "HudSettings", "ItemSettings", "Timeouts", "marker_rename", "rename_problem"]


class SettingsError(ValueError):
    """A setting with a bad value; the message names the option and what it accepts."""


@dataclass(frozen=True)
class Option:
    type: type
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    repeat: bool = False  # the flag may be given several times; the values join with commas


OPTIONS: dict[str, Option] = {
    "width": Option(int, None, "Slots per bridge (default: the number of xdist workers, 1 without xdist)"),
    "sim": Option(str, None, "Default sim target: a gymnasium id, 'module:factory' or 'path.py:factory'"),
    "policy": Option(str, None, "Policy: 'module:factory', a LeRobot checkpoint directory or a ws:// URL"),
    "results": Option(str, None, "Write the results file (JSON Lines, pytest-hud/results/1) here"),
    "sim_url": Option(str, None, "Attach to a bridge someone else started: the path of its announce file"),
    "boot_timeout": Option(float, 120.0, "Seconds a bridge may take to start"),
    "first_action_timeout": Option(float, 300.0, "Seconds for an episode's first action (model warm-up)"),
    "step_timeout": Option(float, 30.0, "Seconds for each later action"),
    "max_steps": Option(int, None, "Stop and grade an episode after this many steps"),
    "n_action_steps": Option(int, None, "Actions executed from each predicted chunk before re-planning"),
    "policy_rename": Option(str, None, "Feed an observation key to a LeRobot checkpoint as another input "
                            "feature: OBS=FEATURE, e.g. agentview_image=observation.images.image (repeat the "
                            "flag or separate with commas)", repeat=True),
    "policy_server": Option(bool, False, "Serve the policy from one batched policy server per run (workers load no model)"),
    "vectorization": Option(str, "auto", "How bridges vectorize single envs: auto (processes when an env's "
                            "step takes 1 ms or more and there are several slots and cores, else sync), sync "
                            "(one thread), async (a process per env), processes (one process per core, each a "
                            "block of slots) or threads (one thread per core; only for envs safe on threads, "
                            "see --check-threads)", ("auto", "sync", "async", "processes", "threads")),
    "inline": Option(str, "auto", "Where a sim's envs run: auto (in each worker itself when one env-step costs "
                     "less than a round trip to a bridge, both measured when its bridge starts, or when the sim "
                     "renders no camera; else in the shared bridge; an explicit --hud-vectorization, --hud-tick "
                     "or --hud-io-thread keeps the bridge), always (in each worker, never a bridge) or never "
                     "(always the shared bridge)",
                     ("auto", "always", "never")),
    "tick": Option(str, "auto", "How bridges step their slots: lockstep (when every episode has acted), ready "
                   "(the slots whose actions are in; independent envs only), lanes (each env process in "
                   "lockstep on its own, while the others step; processes vectorization only) or auto "
                   "(with --hud-policy-server and parallel vectorization: lanes where the envs run in "
                   "processes, else lockstep, so the server's batches fill; else ready where the sim "
                   "supports it)",
                   ("auto", "lockstep", "ready", "lanes")),
    "tick_window": Option(float, 0.001, "Ready mode: seconds a tick waits for more actions after the first one arrives"),
    "io_thread": Option(bool, False, "Bridges serve their sockets on a thread apart from the sim's: they keep "
                        "answering while one sim call runs for many seconds, at more CPU per step"),
    "baseline": Option(str, None, "Gate against this results file from an earlier run (the last good checkpoint)"),
    "gate": Option(str, None, "YAML gate file: alpha, max_drop, min_coverage, per-task min_success floors"),
    "alpha": Option(float, None, "Family-wise false-alarm rate of the gate across tasks (default 0.05)"),
    "max_drop": Option(float, None, "Tolerated drop in success rate; smaller drops never fail (default 0)"),
    "min_coverage": Option(float, None, "Fraction of declared episodes that must finish without error (default 0.9)"),
    "sequential": Option(bool, False, "Stop running a task's episodes once the gate has decided it (anytime-valid)"),
    "strict": Option(bool, False, "Fail the gate on inconclusive tasks too (not enough episodes to see a drop)"),
    "accept_difference": Option(str, None, "Compare with the baseline although this field of the task differs on "
                                "purpose: sim, build, max_steps, contract or n_action_steps (repeat the flag or "
                                "separate with commas)", repeat=True),
    "allow_incomplete_baseline": Option(bool, False, "Gate against a baseline without its summary line (a killed "
                                        "run's file): only the episodes it has count"),
    "resume": Option(str, None, "Reuse finished episodes of this results file instead of running them again"),
    "video": Option(str, "failed", "MP4 videos of episodes with cameras: none, failed or all", ("none", "failed", "all")),
    "video_max": Option(int, None, "At most this many videos per task, for the first of its episodes to start "
                        "(a video a successful episode did not need goes to a later one); default: no limit"),
    "video_dir": Option(str, None, "Directory for videos (default: hud-videos beside --html, --hud-html or --hud-results)"),
    "trace_dir": Option(str, None, "Write one trace file (.npz: actions, states, rewards, timings) per episode here"),
    "html": Option(str, None, "Write a standalone HTML summary page here (works without pytest-html)"),
    "progress_interval": Option(float, 10.0, "Seconds between live per-task progress lines (0 turns them off)"),
    "record": Option(str, None, "Record every graded episode into a LeRobot v3 dataset in this new directory"),
    "ray": Option(str, None, "Place bridges and policy servers on this Ray cluster: 'auto', 'ray://HOST:10001' "
                  "or a 'ray start' address HOST:PORT (needs pytest-hud[ray])"),
    "bridge_resources": Option(str, None, "Ray resources each bridge reserves, as JSON (default '{\"CPU\": 1}'); "
                               "custom ones such as '{\"sim\": 1}' choose the nodes"),
    "policy_resources": Option(str, None, "Ray resources each policy-server replica reserves, as JSON "
                               "(default '{\"CPU\": 1}'), e.g. '{\"GPU\": 1}'"),
    "policy_replicas": Option(int, 1, "Policy-server replicas (with --hud-policy-server); workers are spread over them"),
    "lease": Option(float, 10.0, "Seconds a bridge or policy server on a Ray node outlives silence from this run "
                    "(renewed four times as often)"),
    "axis": Option(str, None, "A test parameter whose values are robustness levels, as NAME or NAME=REFERENCE "
                              "(the unperturbed level; default: the parameter's first value): the summary gets "
                              "a sensitivity table per axis (like the hud_axis marker)", repeat=True),
    "shard": Option(str, None, "Run only shard I of N of the suite's episodes (e.g. 2/4); combine the shards' "
                               "results files with: python -m pytest_hud merge"),
}

#: What a Ray-placed bridge or policy server reserves when its option is not given.
DEFAULT_RESOURCES = {"CPU": 1.0}

_POSITIVE = ("boot_timeout", "first_action_timeout", "step_timeout", "lease")
_AT_LEAST_ONE = ("width", "max_steps", "n_action_steps", "policy_replicas", "video_max")
_NON_NEGATIVE = ("tick_window",)


def flag(name: str) -> str:
    """The command-line flag of an option: ``first_action_timeout`` -> ``--hud-first-action-timeout``."""
    return "--hud-" + name.replace("_", "-")


def _convert(name: str, value: Any, source: str) -> Any:
    opt = OPTIONS[name]
    if opt.type is bool:
        if isinstance(value, str):
            if value.strip().lower() in ("1", "true", "yes", "on"):
                return True
            if value.strip().lower() in ("0", "false", "no", "off", ""):
                return False
            raise SettingsError(f"{source} = {value!r} is not a boolean (true or false)")
        return bool(value)
    try:
        return opt.type(value)
    except (TypeError, ValueError):
        raise SettingsError(f"{source} = {value!r} is not a valid {opt.type.__name__}") from None


@dataclass(frozen=True)
class Timeouts:
    """Every timeout of a run, and the margins of the clients that wait on the bridge's own timeouts."""

    boot: float = OPTIONS["boot_timeout"].default
    claim: float = 30.0
    first_action: float = OPTIONS["first_action_timeout"].default
    step: float = OPTIONS["step_timeout"].default
    wait_slot: float = 600.0  # a claim waiting for a free slot or the next wave

    #: What a client adds to the bridge's timeout it waits on: the bridge's verdict arrives first.
    MARGIN = 30.0

    @property
    def recv(self) -> float:
        """How long an agent waits for an observation (the bridge fails a silent slot earlier)."""
        return self.first_action + self.step + self.MARGIN

    @property
    def pool_call(self) -> float:
        """How long a worker waits for the pool (which may be starting a bridge)."""
        return self.boot + self.MARGIN


@dataclass(frozen=True)
class ItemSettings:
    """What one test runs with, after the marker is applied."""

    sim: str | None
    policy: str | None
    max_steps: int | None
    build: dict[str, Any]
    min_success: float | None
    metric: str | None = None  # hud(metric="score"): the gate compares this test's scores
    #: hud(graded=False): the test's outcome is not a success grade (a smoke test), so the summary
    #: does not warn that it passed where the sim reported no success
    graded: Any = True
    rename: dict[str, str] = field(default_factory=dict)  # observation key -> LeRobot input feature


@dataclass(frozen=True)
class HudSettings:
    """Every pytest-hud option of a run, typed and validated. Build with :meth:`build`."""

    width: int | None = None
    sim: str | None = None
    policy: str | None = None
    results: str | None = None
    sim_url: str | None = None
    boot_timeout: float = 120.0
    first_action_timeout: float = 300.0
    step_timeout: float = 30.0
    max_steps: int | None = None
    n_action_steps: int | None = None
    policy_rename: str | None = None  # "OBS=FEATURE,..."; see the rename property
    policy_server: bool = False
    vectorization: str = "auto"
    inline: str = "auto"
    tick: str = "auto"
    tick_window: float = 0.001
    io_thread: bool = False
    baseline: str | None = None
    gate: str | None = None
    alpha: float | None = None
    max_drop: float | None = None
    min_coverage: float | None = None
    sequential: bool = False
    strict: bool = False
    accept_difference: str | None = None
    allow_incomplete_baseline: bool = False
    resume: str | None = None
    video: str = "failed"
    video_max: int | None = None
    video_dir: str | None = None
    trace_dir: str | None = None
    html: str | None = None
    progress_interval: float = 10.0
    record: str | None = None
    ray: str | None = None
    bridge_resources: str | None = None
    policy_resources: str | None = None
    policy_replicas: int = 1
    lease: float = 10.0
    shard: str | None = None  # "I/N"; see pytest_hud.core.shard
    axis: str | None = None  # "NAME[=REFERENCE],..." (repeatable flag); see the axes property
    # Not options: facts of the run, set by the controller.
    policy_cli: str | None = None  # --hud-policy as given on the command line (beats the marker)
    axis_cli: bool = False  # the axes came from the command line (a name no test has is a typo there)
    workers: int = 1
    distributed: bool = False

    @classmethod
    def build(cls, cli: Mapping[str, Any], ini: Mapping[str, Any], *, workers: int = 1,
              distributed: bool = False) -> HudSettings:
        """Command line, else ini, else the default; converted, checked. Raises :class:`SettingsError`.

        ``cli`` maps option names to parsed values (None = not given); ``ini`` to raw ini values
        (None or "" = not set).
        """
        values: dict[str, Any] = {}
        for name, opt in OPTIONS.items():
            given = cli.get(name)
            if given is not None:
                values[name] = _convert(name, given, flag(name))
            elif ini.get(name) not in (None, "", []):
                values[name] = _convert(name, ini[name], f"ini key hud_{name}")
            else:
                values[name] = opt.default
        settings = cls(**values, policy_cli=cli.get("policy"), axis_cli=cli.get("axis") is not None,
                       workers=max(1, workers), distributed=distributed)
        settings.check()
        return settings

    def check(self) -> None:
        """Ranges and choices; raises :class:`SettingsError` naming the option and the fix."""
        for name in _AT_LEAST_ONE:
            value = getattr(self, name)
            if value is not None and value < 1:
                raise SettingsError(f"{flag(name)} must be at least 1, got {value}")
        for name in _POSITIVE:
            if getattr(self, name) <= 0:
                raise SettingsError(f"{flag(name)} must be positive, got {getattr(self, name)}")
        for name in _NON_NEGATIVE:
            if not getattr(self, name) >= 0:
                raise SettingsError(f"{flag(name)} must be zero or more, got {getattr(self, name)}")
        for name, opt in OPTIONS.items():
            if opt.choices and getattr(self, name) not in opt.choices:
                raise SettingsError(f"{flag(name)} must be {_either(opt.choices)}, got {getattr(self, name)!r}")
        for name in ("bridge_resources", "policy_resources"):
            if getattr(self, name) is not None and not self.ray:
                raise SettingsError(f"{flag(name)} places services on a Ray cluster: add --hud-ray ADDRESS")
            parse_resources(getattr(self, name), flag(name))
        if self.ray is not None and not self.ray.strip():
            raise SettingsError("--hud-ray needs an address: 'auto', 'ray://HOST:10001' or HOST:PORT")
        if self.ray and self.sim_url:
            raise SettingsError("--hud-ray and --hud-sim-url both say where the bridge is: pass one of them")
        if not self.policy_server and (self.policy_replicas > 1 or self.policy_resources is not None):
            given = "--hud-policy-replicas" if self.policy_replicas > 1 else "--hud-policy-resources"
            raise SettingsError(f"{given} is about policy servers: add --hud-policy-server "
                                "(without it each worker loads the policy itself)")
        if self.shard is not None:
            self.shard_spec  # noqa: B018 - raises SettingsError for a bad I/N
        if self.allow_incomplete_baseline and not self.baseline:
            raise SettingsError("--hud-allow-incomplete-baseline is about --hud-baseline: add --hud-baseline FILE")
        self.axes  # noqa: B018 - raises SettingsError for an axis without a name
        self.rename  # noqa: B018 - raises SettingsError for a pair without '='
        if self.accept_difference is not None and not self.accepted_differences:
            raise SettingsError("--hud-accept-difference needs a field name: sim, build, max_steps, contract or "
                                "n_action_steps")

    @property
    def axes(self) -> dict[str, str | None]:
        """``--hud-axis`` as axis name -> reference level (None: the parameter's first value)."""
        out: dict[str, str | None] = {}
        for part in (self.axis or "").split(","):
            name, sep, reference = part.strip().partition("=")
            if not name.strip():
                if part.strip():
                    raise SettingsError(f"--hud-axis {part.strip()!r} names no parameter: give NAME or NAME=REFERENCE")
                continue
            out[name.strip()] = reference.strip() if sep else None
        return out

    @property
    def rename(self) -> dict[str, str]:
        """``--hud-policy-rename`` as observation key -> the LeRobot input feature it feeds.

        >>> HudSettings(policy_rename="agentview_image=observation.images.image").rename
        {'agentview_image': 'observation.images.image'}
        """
        out: dict[str, str] = {}
        for part in (self.policy_rename or "").split(","):
            key, sep, feature = (p.strip() for p in part.partition("="))
            if not part.strip():
                continue
            if not (sep and key and feature):
                raise SettingsError(f"--hud-policy-rename {part.strip()!r} is not OBS=FEATURE, e.g. "
                                    "agentview_image=observation.images.image")
            out[key] = feature
        return out

    @property
    def accepted_differences(self) -> tuple[str, ...]:
        """``--hud-accept-difference`` as field names (checked against the gate's task fields there)."""
        return tuple(part.strip() for part in (self.accept_difference or "").split(",") if part.strip())

    @property
    def resources(self) -> dict[str, dict[str, float]]:
        """What each Ray-placed bridge and policy-server replica reserves."""
        return {"bridge": parse_resources(self.bridge_resources, flag("bridge_resources")),
                "policy": parse_resources(self.policy_resources, flag("policy_resources"))}

    @property
    def shard_spec(self) -> Shard | None:
        """``--hud-shard`` parsed (None: the whole suite)."""
        if self.shard is None:
            return None
        try:
            return parse_shard(self.shard)
        except ValueError as exc:
            raise SettingsError(f"{exc} (ini key: hud_shard)") from None

    @property
    def slots(self) -> int:
        """Slots per bridge: ``--hud-width``, else one per worker."""
        return self.width or self.workers

    @property
    def timeouts(self) -> Timeouts:
        return Timeouts(boot=self.boot_timeout, first_action=self.first_action_timeout, step=self.step_timeout)

    def for_item(self, marks: Mapping[str, Any]) -> ItemSettings:
        """This run's settings for a test whose ``hud`` markers merge to ``marks`` (closest wins).
        A ``rename`` that is not a map of names is left out here and reported by :func:`rename_problem`."""
        max_steps = marks.get("max_steps", self.max_steps)
        floor = marks.get("min_success")
        return ItemSettings(
            sim=marks.get("sim") or self.sim,
            policy=self.policy_cli or marks.get("policy") or self.policy,
            max_steps=int(max_steps) if max_steps else None,
            build=dict(marks.get("build") or {}),
            min_success=None if floor is None else float(floor),
            metric=marks.get("metric"),
            graded=marks.get("graded", True),
            rename={**self.rename, **marker_rename(marks.get("rename"))},
        )

    def replace(self, **changes: Any) -> HudSettings:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Builtin types only: crosses the xdist channel and lands in the results' provenance."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HudSettings:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def parse_resources(text: str | None, option: str) -> dict[str, float]:
    """``'{"CPU": 2, "sim": 1}'`` -> ``{"CPU": 2.0, "sim": 1.0}``; None -> the default; errors name ``option``.

    >>> parse_resources('{"GPU": 1}', "--hud-policy-resources")
    {'GPU': 1.0}
    """
    import json

    if text is None:
        return dict(DEFAULT_RESOURCES)
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SettingsError(f"{option} must be a JSON object such as '{{\"CPU\": 2, \"sim\": 1}}' ({exc})") from None
    if not isinstance(data, dict):
        raise SettingsError(f"{option} must be a JSON object of resource names to amounts, got {text!r}")
    out = {}
    for name, amount in data.items():
        if isinstance(amount, bool) or not isinstance(amount, (int, float)) or amount < 0:
            raise SettingsError(f"{option}: resource {name!r} needs a non-negative number, got {amount!r}")
        out[str(name)] = float(amount)
    return out


def _either(choices: tuple[str, ...]) -> str:
    return ", ".join(choices[:-1]) + f" or {choices[-1]}"



def marker_rename(value: Any) -> dict[str, str]:
    """``hud(rename={...})``: observation key -> the LeRobot input feature it feeds ({} for a bad
    value, which :func:`rename_problem` reports).

    >>> marker_rename({"agentview_image": "observation.images.image"})
    {'agentview_image': 'observation.images.image'}
    >>> marker_rename(None)
    {}
    """
    if value is None or rename_problem(value):
        return {}
    return {key.strip(): feature.strip() for key, feature in value.items()}


def rename_problem(value: Any) -> str | None:
    """Why a ``hud(rename=...)`` value is not a map of names (None when it is, or is unset)."""
    example = "e.g. rename={'agentview_image': 'observation.images.image'}"
    if value is None:
        return None
    if not isinstance(value, Mapping):
        return f"hud(rename={value!r}) must be a dict of observation key -> LeRobot input feature, {example}"
    for key, feature in value.items():
        if not (isinstance(key, str) and key.strip() and isinstance(feature, str) and feature.strip()):
            return (f"hud(rename=...): {key!r}: {feature!r} is not a pair of names (observation key -> LeRobot "
                    f"input feature, both non-empty strings), {example}")
    return None


def metric_problem(metric: str | None) -> str | None:
    """Why a ``hud(metric=...)`` value is not one (None for ``"success"``, ``"score"`` or unset)."""
    if metric is None or metric in ("success", "score"):
        return None
    return (f"hud(metric={metric!r}): the metric must be 'success' (the test's outcome) or 'score' (the sim's"
            " graded score per episode)")


def graded_problem(graded: Any) -> str | None:
    """Why a ``hud(graded=...)`` value is not one (None for True or False)."""
    if isinstance(graded, bool):
        return None
    return (f"hud(graded={graded!r}): graded must be True (the test asserts the task's success, the default)"
            " or False (a smoke test whose outcome is not a success grade)")
