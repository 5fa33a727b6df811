"""A multi-task :class:`~.base.VectorSim`: each slot runs an episode of whichever task its claim chose.

Real benchmarks are many tasks (Meta-World MT10, LIBERO suites). Instead of one bridge per task,
each with ``width`` mostly idle slots, one bridge serves them all: a claim names its task
(``shared_sim.episode(seed=3, task="push-v3")``), and the slot it lands on runs that task's env.

Each slot keeps a small LRU cache of envs, one per task it ran recently (``cache_size``), built on
demand with ``make_env(task)``; so a slot never shares an env (its physics, RNG or GL context) with
another slot, and switching back to a cached task costs a reset, not a rebuild. The bridge prefers a
free slot that already ran the claim's task. Every task must give the contract of the first one.

Envs are plain gymnasium envs whose ``reset(seed=...)`` fixes the episode; they are stepped one by
one (a slot whose episode is over is not stepped at all, so a Meta-World env past its step cap or a
rendering env that idles costs nothing).

    sim = MultiTaskSim(8, ["reach-v3", "push-v3"], make_env=lambda task: MetaWorldTask(task))

``instructions`` (task name -> natural-language text) gives each task the instruction a
language-conditioned policy is prompted with (LeRobot's ``task``, openpi's ``prompt``); a task
without one is prompted with its name (see :mod:`pytest_hud.sim.instructions`)::

    MultiTaskSim(8, ["left", "right"], make_env, instructions={"left": "reach the left goal", ...})
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from pytest_hud.core.contract import Contract, ContractError, derive_contract, flatten_observation
from pytest_hud.sim.instructions import check_instructions
from pytest_hud.sim.renders import skip_env_renders
from pytest_hud.sim.base import (
    SUCCESS_KEYS, SlotFaults, StepBatch, VectorSim, declared_claim_rules, per_slot,
)

__all__ = ["MultiTaskSim"]


def _info_flag(info: Mapping[str, Any]) -> bool:
    return any(bool(info.get(key) or False) for key in SUCCESS_KEYS)


class MultiTaskSim(VectorSim):
    """``width`` slots over ``tasks``, each slot with an LRU cache of up to ``cache_size`` envs (one per task)."""

    supports_slot_step = True  # slots are separate envs: the bridge may step a subset (ready mode)
    isolates_slots = True  # one env raising fails its slot's episode only (its envs are rebuilt)

    def __init__(self, width: int, tasks: Sequence[str], make_env: Callable[[str], Any],
                 cache_size: int = 4, control_rate: float | None = None,
                 instructions: Mapping[str, str] | None = None) -> None:
        super().__init__(width)
        self.tasks = tuple(str(t) for t in tasks)
        if not self.tasks:
            raise ValueError("a MultiTaskSim needs at least one task")
        if len(set(self.tasks)) != len(self.tasks):
            raise ValueError(f"task names must be unique, got {list(self.tasks)}")
        self.instructions = check_instructions(instructions, self.tasks)
        if cache_size < 1:
            raise ValueError(f"cache_size must be at least 1 env per slot, got {cache_size}")
        self.make_env = make_env
        self.cache_size = int(cache_size)
        self._caches: list[OrderedDict[str, Any]] = [OrderedDict() for _ in range(self.width)]
        self._current: list[Any] = [None] * self.width  # the env each slot's episode runs in
        self._active = np.zeros(self.width, bool)  # an episode is running: step this slot's env
        self.builds = self.switches = 0
        # The first task's env (kept as slot 0's) defines the contract every task must match.
        probe = self._build(self.tasks[0])
        self._caches[0][self.tasks[0]] = probe
        obs, _ = probe.reset(seed=None)
        self._contract = derive_contract(probe.observation_space, probe.action_space, obs,
                                         getattr(probe, "metadata", None), control_rate)
        self._obs = {
            name: np.zeros((self.width, *feat.shape), dtype=np.dtype(feat.dtype))
            for name, feat in self._contract.observation_features.items()
        }
        self._write(0, obs)
        self.claim_rules = declared_claim_rules(probe) or self.claim_rules

    def contract(self) -> Contract:
        return self._contract

    # ------------------------------------------------------------------ envs
    def _build(self, task: str) -> Any:
        env = self.make_env(task)
        self.builds += 1
        return env

    def _check(self, task: str, env: Any) -> None:
        obs, _ = env.reset(seed=None)
        derived = derive_contract(env.observation_space, env.action_space, obs,
                                  getattr(env, "metadata", None))
        try:
            self._contract.check_matches(derived)
            if derived.action.shape != self._contract.action.shape or derived.action.dtype != self._contract.action.dtype:
                raise ContractError(f"action {derived.action.dtype}{list(derived.action.shape)} vs "
                                    f"{self._contract.action.dtype}{list(self._contract.action.shape)}")
        except ContractError as exc:
            raise ContractError(
                f"task {task!r} does not share the contract of task {self.tasks[0]!r} ({exc}); "
                "every task of a multi-task bridge must give the same observation features and action"
            ) from None

    def env_for(self, slot: int, task: str) -> Any:
        """Slot ``slot``'s env for ``task``: from its cache, else built (evicting its least recent env)."""
        cache = self._caches[slot]
        env = cache.get(task)
        if env is not None:
            cache.move_to_end(task)
            return env
        if task not in self.tasks:
            raise KeyError(f"task {task!r} is not one of this sim's tasks {list(self.tasks)}")
        env = self._build(task)
        if task != self.tasks[0]:
            try:
                self._check(task, env)
            except ContractError:
                env.close()
                raise
        cache[task] = env
        while len(cache) > self.cache_size:
            _, old = cache.popitem(last=False)
            old.close()
        return env

    def _write(self, slot: int, obs: Any) -> None:
        flat = flatten_observation(obs)
        for name, buf in self._obs.items():
            buf[slot] = flat[name]

    # ------------------------------------------------------------- VectorSim
    def reset_slots(self, indices: Sequence[int], seeds: Sequence[int | None],
                    options: Sequence[Mapping[str, Any] | None],
                    tasks: Sequence[str | None] | None = None) -> np.ndarray:
        flags = np.zeros(len(indices), bool)
        refused: set[int] = set()

        def reset(k: int) -> None:
            i, seed, opts = indices[k], seeds[k], options[k]
            if tasks is not None and tasks[k] is None:
                self._active[i] = False  # the episode is over: idle until the next claim, unstepped
                return
            task = tasks[k] if tasks is not None else self._task_of(i)
            self._active[i] = False  # stepped only once its reset has worked
            try:
                env = self.env_for(i, task)
            except ContractError:
                refused.add(i)  # the claim's task cannot be served; the slot's envs are as they were
                raise
            if env is not self._current[i]:
                self.switches += self._current[i] is not None
                self._current[i] = env
            obs, info = env.reset(seed=seed, options=dict(opts) if opts else None)
            self._write(i, obs)
            self._active[i] = True
            flags[k] = _info_flag(info)

        failed: dict[int, str] = {}
        per_slot(reset, range(len(indices)), failed)
        faults = {indices[k]: tb for k, tb in failed.items()}
        if faults:
            raise SlotFaults(faults, flags, intact=refused)
        return flags

    def _task_of(self, slot: int) -> str:
        current = self._current[slot]
        for task, env in self._caches[slot].items():
            if env is current:
                return task
        return self.tasks[0]

    def skip_renders(self, unread: np.ndarray) -> None:
        skip_env_renders(self._current, unread)  # each slot's env decides (see pytest_hud.sim.renders)

    def step(self, actions: np.ndarray) -> StepBatch:
        return self.step_slots(actions, np.ones(self.width, bool))

    def step_slots(self, actions: np.ndarray, mask: np.ndarray) -> StepBatch:
        """Step the slots in ``mask`` whose episode runs (each slot is its own env: ready mode works)."""
        n = self.width
        rewards = np.zeros(n)
        terminated = np.zeros(n, bool)
        truncated = np.zeros(n, bool)
        success = np.zeros(n, bool)
        score = np.full(n, np.nan)
        rows, faults = np.flatnonzero(self._active & np.asarray(mask, bool)).tolist(), {}
        for i, out in zip(rows, per_slot(lambda i: self._current[i].step(actions[i]), rows, faults)):
            if out is None:
                self._active[i] = False  # its env raised: never stepped again until rebuilt and reset
                continue
            obs, reward, term, trunc, info = out
            self._write(i, obs)
            rewards[i], terminated[i], truncated[i] = float(reward), bool(term), bool(trunc)
            success[i] = _info_flag(info)
            if "score" in info:
                score[i] = float(info["score"])
            if term or trunc:
                self._active[i] = False  # never step a finished env (some refuse to)
        batch = StepBatch(rewards, terminated, truncated, success, score)
        if faults:
            raise SlotFaults(faults, batch)
        return batch

    def rebuild_slot(self, index: int) -> None:
        """Drop every env slot ``index`` has cached (the one that raised among them): its next claim
        builds its task's env afresh. Nothing is built now, so a rebuild cannot fail here."""
        cache = self._caches[index]
        for env in cache.values():
            try:
                env.close()
            except Exception:  # noqa: BLE001 - the env that raised may not close cleanly
                pass
        cache.clear()
        self._current[index] = None
        self._active[index] = False

    def observe(self) -> dict[str, np.ndarray]:
        return self._obs

    def stats(self) -> dict[str, Any]:
        """Env builds and task switches so far, and each slot's cached tasks (most recent last)."""
        return {"builds": self.builds, "switches": self.switches,
                "cached": [list(cache) for cache in self._caches]}

    def close(self) -> None:
        for cache in self._caches:
            for env in cache.values():
                try:
                    env.close()
                except Exception:  # noqa: BLE001 - best effort on the way out
                    pass
            cache.clear()
