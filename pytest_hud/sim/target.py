"""Resolve a sim target (``CartPole-v1``, ``module:factory``, ``path/to/file.py:factory``).

A factory that accepts ``num_envs`` returns a vector env (or a :class:`VectorSim`) itself;
otherwise it returns one env and the bridge vectorizes ``width`` copies with autoreset disabled.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from pytest_hud.core.specs import Spec, SpecError, as_spec, resolve, unimportable
from pytest_hud.sim.base import GymSim, VectorSim

__all__ = ["TargetError", "resolve_factory", "load_sim", "describe_target", "unimportable"]


#: A sim target that cannot be found or built (the core's :class:`~pytest_hud.core.specs.SpecError`).
TargetError = SpecError


def resolve_factory(target: Spec | str, what: str = "sim target") -> Callable[..., Any] | None:
    """The callable a ``module:attr`` or ``file.py:attr`` target names, or None for a gym id (or a
    module that is not importable here): :func:`pytest_hud.core.specs.resolve` for a sim spec."""
    spec = as_spec(target, "sim")
    return resolve(spec) if spec.is_factory else None


def _check_gym_id(target: str) -> None:
    """Raise :class:`TargetError` unless gymnasium knows ``target`` (a ``gym`` spec, or a ``module``
    spec whose module is not importable here, which gymnasium may still know)."""
    import gymnasium as gym

    try:
        gym.spec(target)
    except Exception as exc:  # gymnasium raises several error types for unknown ids
        module = target.rpartition(":")[0]
        where = f"{unimportable(module)}, and it is " if ":" in target and "/" not in module else ""
        raise TargetError(
            f"unknown sim target {target!r}: {where}not a registered gymnasium id ({exc}); "
            "use a gymnasium id such as CartPole-v1, 'module:factory' with the module on the import "
            "path, or 'path/to/file.py:factory'"
        ) from None


def describe_target(target: Spec | str) -> str:
    """Validate a target cheaply (no env is built) and say what it is; raise :class:`TargetError`."""
    spec = as_spec(target, "sim")
    factory = resolve_factory(spec)
    if factory is None:
        _check_gym_id(spec.text)
        return f"gymnasium id {spec.text}"
    if not callable(factory):
        raise TargetError(f"sim target {spec.text!r} is not callable")
    return f"factory {spec.text}"


def _accepts_num_envs(factory: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return "num_envs" in params


def load_sim(
    target: str,
    width: int,
    vectorization: str = "sync",
    build_args: Mapping[str, Any] | None = None,
    control_rate: float | None = None,
) -> VectorSim:
    """Build the vectorized sim a bridge serves; its ``vectorization`` says how its slots run."""
    import gymnasium as gym
    from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv

    kwargs = dict(build_args or {})
    asked = vectorization
    # auto is settled below for a factory of single envs; a sim the factory vectorizes runs as it is
    # unless the factory declares its layout (_declared_layout)
    factory = resolve_factory(target)
    declared = _declared_layout(factory, width) if vectorization == "auto" else None
    if vectorization == "auto":
        vectorization = "processes" if declared else "sync"
    if factory is None:
        _check_gym_id(target)
    elif declared:  # built once, in its processes (the declaration says its slots are independent envs)
        sim = _in_processes(target, width, kwargs, control_rate)
        sim.auto_choice = declared
        return sim
    elif _accepts_num_envs(factory) or (isinstance(factory, type) and issubclass(factory, VectorSim)):
        built = factory(num_envs=width, **kwargs) if _accepts_num_envs(factory) else factory(width, **kwargs)
        sim = _as_vector_sim(built, width, control_rate)
        if vectorization == "processes" and sim.supports_slot_step and width > 1:
            # Independent envs (a multi-task sim, a SyncVectorEnv): split them across processes, each
            # building the factory's sim for its block. A natively batched sim keeps its one process.
            sim.close()
            return _in_processes(target, width, kwargs, control_rate)
        sim.splittable = sim.supports_slot_step and width > 1
        if vectorization == "processes" and width > 1:
            sim.vectorization_note = (
                "processes does not apply: the sim steps all its slots in one call (it is not made of "
                "independent envs), so it runs in the bridge's process as it is")
        elif vectorization in ("async", "threads"):
            sim.vectorization_note = (
                f"{vectorization} does not apply: the factory takes num_envs and vectorizes its envs "
                f"itself ({vectorization} wraps a factory of single envs; processes splits a sim made of "
                "independent envs), so its sim runs as it is")
        return sim
    make_one = EnvMaker(target, kwargs, factory)
    probe = make_one()
    if isinstance(probe, VectorSim | VectorEnv):
        sim = _as_vector_sim(probe, width, control_rate)
        if vectorization != "sync":
            sim.vectorization_note = (
                f"{vectorization} does not apply: the factory returns a vectorized sim itself, not one "
                "env, so that sim runs as it is (a factory of single envs gets the vectorization asked for)")
        return sim
    if not isinstance(probe, gym.Env):
        raise TargetError(
            f"sim target {target!r} returned {type(probe).__name__}; expected a gymnasium Env, "
            "a gymnasium VectorEnv or a pytest_hud.sim.VectorSim"
        )
    auto_note = None
    step_s = None  # auto's timing of one env-step: a worker may run such a cheap env itself (--hud-inline)
    if asked == "auto":
        try:
            step_s = _env_step_seconds(probe)
            why = _auto_processes(probe, width, step_s)
        except Exception as exc:  # noqa: BLE001 - e.g. an env that refuses random actions: a fresh one, on sync
            probe.close()
            probe, why, step_s = make_one(), None, None
            auto_note = (f"auto could not time the env ({type(exc).__name__}: {exc}), so its envs step one "
                         "after another in the bridge's process (processes spreads them over the cores)")
        if why is not None:
            # what sync would refuse (an unsupported space) is refused here, as readably, not in a block process
            from pytest_hud.core.contract import derive_contract

            derive_contract(probe.observation_space, probe.action_space, probe.reset(seed=0)[0],
                            getattr(probe, "metadata", None), control_rate)
            probe.close()  # each process builds its own envs
            sim = _in_processes(target, width, kwargs, control_rate)
            sim.auto_choice = why
            sim.env_step_s = step_s
            return sim
    if vectorization == "async":
        probe.close()  # sub-processes build their own; spawn avoids forking a GL context
        env = AsyncVectorEnv([make_one] * width, autoreset_mode=AutoresetMode.DISABLED, context="spawn")
    elif vectorization == "sync":
        makers = [lambda p=probe: p] + [make_one] * (width - 1)
        sim = GymSim(SyncVectorEnv(makers, autoreset_mode=AutoresetMode.DISABLED), control_rate)
        sim.splittable = width > 1
        sim.auto_choice = auto_note
        sim.vectorization = "sync"
        sim.env_step_s = step_s
        return sim
    elif vectorization == "threads":
        from pytest_hud.sim.threads import EnvThreads, default_threads

        probe.close()  # every env is built on the thread that will step it
        threads = EnvThreads(default_threads(width))
        try:
            built = threads.map(lambda i: make_one(), range(width))
            env = SyncVectorEnv([lambda e=e: e for e in built], autoreset_mode=AutoresetMode.DISABLED)
            sim = GymSim(env, control_rate, threads)
            sim.vectorization = "threads"
            return sim
        except BaseException:
            threads.close()
            raise
    elif vectorization == "processes":
        probe.close()  # each process builds its own envs
        return _in_processes(target, width, kwargs, control_rate)
    else:
        raise TargetError(
            f"vectorization must be 'sync', 'async', 'threads' or 'processes', got {vectorization!r}")
    sim = GymSim(env, control_rate)
    sim.vectorization = "async"
    return sim


def _declared_layout(factory: Callable[..., Any] | None, width: int) -> str | None:
    """``auto`` for a ``num_envs`` factory that declares ``hud_vectorization = "processes"``: its sim is
    made of independent envs that step slowly and each hold a GL context (LIBERO's): why they go to
    processes, or None (no declaration, one slot, or one core). Its envs are then built once, in
    their processes. A ``num_envs`` factory that declares nothing runs as it is (``sync``): timing a
    multi-task sim's slot and splitting it measured slower for a whole Meta-World suite."""
    from pytest_hud.sim.threads import default_threads

    if getattr(factory, "hud_vectorization", None) != "processes" or not _accepts_num_envs(factory):
        return None
    cores = default_threads(width)
    if width < 2 or cores < 2:
        return None
    return (f"auto chose processes: the sim declares slow, rendering envs (hud_vectorization), so its "
            f"{width} envs step on {cores} cores as separate processes would (sync keeps them in the "
            f"bridge's process)")


#: ``auto`` spreads a bridge's envs over processes when one env's step takes this long or longer:
#: then stepping dominates a tick, and a block process's pipe round trip (~0.1 ms) is small beside it.
AUTO_PROCESSES_STEP_S = 1e-3


def _auto_processes(env: Any, width: int, per_step: float | None = None) -> str | None:
    """``--hud-vectorization=auto`` for a factory of single envs: why they go to ``processes``
    (``env``'s step costs :data:`AUTO_PROCESSES_STEP_S` or more, and the bridge has several slots
    and cores), or None to keep them in this process.

    The timing steps the factory's first env with a few seeded random actions, the first step not
    counted (it may set up a renderer). Every episode resets its env with its own seed before it
    starts, so these steps leave no trace in any episode. What the timing raises is the caller's to
    handle (it keeps the bridge on ``sync``, with a fresh env).
    """
    from pytest_hud.sim.threads import default_threads

    cores = default_threads(width)
    if cores < 2:
        return None
    if per_step is None:
        per_step = _env_step_seconds(env)
    if per_step < AUTO_PROCESSES_STEP_S:
        return None
    return (f"auto chose processes: {per_step * 1e3:.1f} ms per env-step, so the {width} envs step on "
            f"{cores} cores (sync keeps them in the bridge's process)")


def _env_step_seconds(env: Any, budget_s: float = 0.25, steps: int = 8) -> float:
    """The median wall time of one ``env.step`` with seeded random actions (from a copy of its
    action space) over up to ``steps`` steps after a first one that is not counted, or until
    ``budget_s`` has passed."""
    import copy
    import statistics
    import time
    import warnings

    space = copy.deepcopy(env.action_space)  # the env's own space keeps its random state
    space.seed(0)
    times: list[float] = []
    end = None
    with warnings.catch_warnings():  # an env checker's warnings: said when the episodes step it
        warnings.simplefilter("ignore")
        env.reset(seed=0)
        for i in range(steps + 1):
            t0 = time.perf_counter()
            _, _, terminated, truncated, _ = env.step(space.sample())
            t1 = time.perf_counter()
            if end is None:
                end = t1 + budget_s  # the first step is not counted
            else:
                times.append(t1 - t0)
                if t1 > end:
                    break
            if terminated or truncated:
                env.reset(seed=i + 1)
    return statistics.median(times)


def _in_processes(target: str, width: int, kwargs: Mapping[str, Any], control_rate: float | None) -> VectorSim:
    """``target``'s slots split across one process per core (``--hud-vectorization=processes``)."""
    from pytest_hud.sim.processes import ProcessSim
    from pytest_hud.sim.threads import default_threads

    return ProcessSim(target, width, kwargs, control_rate, default_threads(width), build=build_sync)


def build_sync(target: str, width: int, build_args: dict[str, Any], control_rate: float | None) -> VectorSim:
    """``target``'s sim of ``width`` slots in this process (``sync``): what each process of
    ``processes`` builds for its block."""
    return load_sim(target, width, "sync", build_args, control_rate)


class EnvMaker:
    """Builds one env of ``target``, here or in an ``AsyncVectorEnv`` worker process.

    Picklable by value: a worker re-resolves the target itself, since a factory loaded from a file
    lives in a module only this process has (pickled by reference, it could not be imported there).
    """

    def __init__(self, target: str, kwargs: Mapping[str, Any], factory: Callable[..., Any] | None = None) -> None:
        self.target = target
        self.kwargs = dict(kwargs)
        self._factory = factory

    def __getstate__(self) -> dict[str, Any]:
        return {"target": self.target, "kwargs": self.kwargs, "_factory": None}

    def __call__(self) -> Any:
        if self._factory is None:
            self._factory = resolve_factory(self.target)
        if self._factory is None:
            import gymnasium as gym

            return gym.make(self.target, **self.kwargs)
        return self._factory(**self.kwargs)


def _as_vector_sim(built: Any, width: int, control_rate: float | None) -> VectorSim:
    from gymnasium.vector import VectorEnv

    if isinstance(built, VectorSim):
        sim = built
    elif isinstance(built, VectorEnv):
        sim = GymSim(built, control_rate)
    else:
        raise TargetError(
            f"a factory that takes num_envs must return a VectorEnv or VectorSim, "
            f"got {type(built).__name__}"
        )
    if sim.width != width:
        raise TargetError(f"sim has {sim.width} slots but the bridge was asked for width {width}")
    return sim
