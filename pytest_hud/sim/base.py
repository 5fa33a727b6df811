"""What a bridge serves: a vectorized sim with ``width`` slots, driven by batched calls.

:class:`VectorSim` is the seam for sims that are not gym-shaped (write a subclass, point the bridge
at it); :class:`GymSim` adapts any gymnasium vector env. Every array crossing this boundary has the
batch (slot) dimension first: ``[N, ...]`` with ``N == width``.

These objects are touched from the bridge's main thread only (with ``--hud-vectorization=threads``
a :class:`GymSim` hands each sub-env's calls to that env's owner thread, see :mod:`.threads`).
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from pytest_hud.core.contract import Contract, derive_contract, flatten_observation
from pytest_hud.sim.claims import ClaimRules
from pytest_hud.sim.instructions import declared_instruction
from pytest_hud.sim.renders import skip_env_renders

if TYPE_CHECKING:
    from pytest_hud.sim.threads import EnvThreads

__all__ = ["SUCCESS_KEYS", "GymSim", "SlotFaults", "StepBatch", "VectorSim", "info_success"]

#: ``info`` keys read (in this order) to latch an episode's success.
SUCCESS_KEYS = ("is_success", "success", "task_success")


class StepBatch:
    """One batched step's outcome: per-slot reward, termination, success and optional score."""

    __slots__ = ("rewards", "score", "success", "terminated", "truncated")

    def __init__(self, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
                 success: np.ndarray | None = None, score: np.ndarray | None = None) -> None:
        self.rewards = np.asarray(rewards, dtype=np.float64).reshape(-1)
        self.terminated = np.asarray(terminated, dtype=bool).reshape(-1)
        self.truncated = np.asarray(truncated, dtype=bool).reshape(-1)
        n = self.rewards.shape[0]
        self.success = np.zeros(n, bool) if success is None else np.asarray(success, bool)
        self.score = score  # [N] float, NaN where the sim gives none


def last_line(trace: str) -> str:
    """The exception line of a traceback's text (its last non-empty line): what a message leads with."""
    lines = [line for line in str(trace).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no message)"


class SlotFaults(Exception):
    """Some slots' envs raised in a call of a sim whose slots are independent envs (``isolates_slots``).

    ``faults`` maps each such slot to its traceback text; ``result`` is what the call returns for the
    other slots (a step's :class:`StepBatch`, a reset's flags in ``indices`` order), whose rows of the
    faulted slots are ignored. The bridge fails only the faulted slots' episodes and rebuilds their
    envs (:meth:`VectorSim.rebuild_slot`); every other slot goes on as if nothing happened.

    ``intact`` names faulted slots whose env is unharmed (the claim itself could not be served, such
    as a task whose env does not match the contract): their episodes fail, nothing is rebuilt.
    """

    def __init__(self, faults: Mapping[int, str], result: Any, intact: Any = ()) -> None:
        self.faults = {int(i): str(tb) for i, tb in faults.items()}
        self.result = result
        self.intact = {int(i) for i in intact}
        super().__init__("; ".join(f"slot {i}: {last_line(tb)}" for i, tb in sorted(self.faults.items())))


class FaultLog(dict):
    """Slot faults gathered over a few sim calls: ``{slot: traceback}``, plus ``intact`` (see
    :class:`SlotFaults`)."""

    def __init__(self) -> None:
        super().__init__()
        self.intact: set[int] = set()

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``; a :class:`SlotFaults` it raises is logged here and gives its result."""
        try:
            return fn(*args, **kwargs)
        except SlotFaults as exc:
            self.add(exc.faults, exc.intact)
            return exc.result

    def add(self, faults: Mapping[int, str], intact: Any = (), offset: int = 0) -> None:
        self.update({offset + int(i): tb for i, tb in faults.items()})
        self.intact.update(offset + int(i) for i in intact)


def per_slot(fn: Callable[[int], Any], rows: Sequence[int], faults: dict[int, str]) -> list[Any]:
    """``fn(i)`` for each slot ``i`` of ``rows``; a slot whose call raises gets None, and its
    traceback in ``faults`` (the other slots' calls still run)."""
    out = []
    for i in rows:
        try:
            out.append(fn(i))
        except Exception:  # noqa: BLE001 - one env's fault is that slot's, reported with its traceback
            faults[i] = traceback.format_exc()
            out.append(None)
    return out


class VectorSim:
    """Base class for a sim served by a bridge. Override the four hooks.

    - :meth:`contract` — features of one slot's observation and action.
    - :meth:`reset_slots` — reset the given slots with their own seeds and options; return the
      per-slot success flags at reset (``[len(indices)]`` bool).
    - :meth:`step` — advance all ``width`` slots with ``actions`` (``[N, *action_shape]``).
    - :meth:`observe` — the current observation of every slot, ``{feature: [N, ...]}``.

    Set ``isolates_slots = True`` when one slot's env raising leaves the others' envs untouched
    (independent envs): :meth:`reset_slots`, :meth:`step` and :meth:`step_slots` then raise
    :class:`SlotFaults` naming the slots whose envs raised, with the other slots' outcome, and
    :meth:`rebuild_slot` replaces a faulted slot's env. The bridge fails only those slots' episodes.
    Elsewhere any exception breaks the bridge: every live episode fails at once, and the pytest
    plugin's pool replaces it.

    ``claim_rules`` (:class:`~pytest_hud.sim.claims.ClaimRules`) declares what a claim may carry
    (the largest seed, the option keys); the bridge refuses other claims before touching an env.

    Set ``supports_slot_reset = False`` when the sim can only reset all slots at once; the bridge
    then gathers claims into waves, and steps a finished slot with hold actions until the next wave
    (never ``reset_slots`` on it alone).

    Set ``supports_slot_step = True`` and override :meth:`step_slots` when the slots are independent
    envs that can be stepped one subset at a time; the bridge then ticks in *ready* mode (steps the
    slots whose actions are in, so a slow policy does not set its peers' pace). Natively batched
    sims leave it False and tick in *lockstep*.

    **Multi-task sims** declare ``tasks`` (names; the first is the default). A claim may then choose
    one (``reset(task="push-v3", seed=3)``, checked against the list), and the bridge calls
    ``reset_slots(indices, seeds, options, tasks=[...])`` with each slot's task; a ``None`` task
    means the slot's episode is over and it idles until its next claim (the sim may skip that
    reset, and must not step the idle env). Every task shares the one contract.
    :class:`~pytest_hud.sim.multitask.MultiTaskSim` builds such a sim from ``make_env(task)``. Sims
    that declare no tasks are never passed ``tasks``, and a claim that names a task is refused.

    **Instructions**: a sim tells language-conditioned policies what to do with ``instructions``
    (task name -> text) or, without tasks, ``instruction``; the bridge makes it the prompt of every
    claim that brings none (the rule: :mod:`pytest_hud.sim.instructions`).
    """

    supports_slot_reset: bool = True
    supports_slot_step: bool = False
    #: One slot's env raising leaves the others untouched: calls raise :class:`SlotFaults` for it.
    isolates_slots: bool = False
    #: What a claim may carry (seeds, option keys); checked by the bridge at claim time.
    claim_rules: ClaimRules = ClaimRules()
    #: Task names a claim may choose from (empty: the sim has one env, chosen by build arguments).
    tasks: tuple[str, ...] = ()
    #: Each task's natural-language instruction (task name -> text); a task without one is
    #: prompted with its name.
    instructions: Mapping[str, str] = {}
    #: The instruction of a sim without tasks (a gymnasium env's ``hud_instruction``,
    #: ``task_description``, ...).
    instruction: str | None = None
    #: Set by the bridge's loader when the vectorization asked for did not apply to this sim: why,
    #: and what runs instead (the bridge announces it; the pytest plugin shows it in its summary).
    vectorization_note: str | None = None
    #: Set by the loader when ``--hud-vectorization=auto`` chose something other than ``sync``: what
    #: it chose and why (the bridge announces it; the pytest plugin shows it in its summary).
    auto_choice: str | None = None
    #: ``--vectorization auto``'s timing of one env-step of a factory of single envs (seconds; None
    #: when not timed): how the pool decides whether a worker runs such an env itself (``--hud-inline``)
    env_step_s: float | None = None
    #: How this sim's slots run (the bridge announces it: what ``auto`` chose): ``native`` (it
    #: vectorizes its envs itself), ``processes`` (:class:`~pytest_hud.sim.processes.ProcessSim`), or
    #: what the loader set on the gymnasium envs it wrapped: ``sync``, ``async`` or ``threads``.
    vectorization: str = "native"
    #: Set by the loader when this sim's slots are independent envs stepped one after another in
    #: this process, which ``--hud-vectorization=processes`` would spread over the cores.
    splittable: bool = False
    #: Which parallel lane (process, thread) steps each slot, when slots step in parallel; claims
    #: then go to the least busy lane first, so that a few episodes do not share one lane.
    lanes: tuple[int, ...] | None = None
    #: The sim can step one lane's slots while another lane's step is under way (``--hud-tick=lanes``):
    #: it has :meth:`lane_begin`, :meth:`lane_fileno` and :meth:`lane_end`
    #: (:class:`~pytest_hud.sim.processes.ProcessSim`).
    supports_lane_ticks: bool = False

    def __init__(self, width: int) -> None:
        self.width = int(width)

    def contract(self) -> Contract:  # pragma: no cover - interface
        raise NotImplementedError

    def reset_slots(self, indices: Sequence[int], seeds: Sequence[int | None],
                    options: Sequence[Mapping[str, Any] | None]) -> np.ndarray:  # pragma: no cover - interface
        raise NotImplementedError

    def step(self, actions: np.ndarray) -> StepBatch:  # pragma: no cover - interface
        raise NotImplementedError

    def step_slots(self, actions: np.ndarray, mask: np.ndarray) -> StepBatch:  # pragma: no cover - interface
        """Advance only the slots where ``mask`` (``[N]`` bool) is True, with their rows of ``actions``
        (``[N, *action_shape]``; the other rows are to be ignored). The other slots must not change
        at all; their rows of the returned ``[N]`` batch are ignored (report zeros and False)."""
        raise NotImplementedError

    def observe(self) -> dict[str, np.ndarray]:  # pragma: no cover - interface
        raise NotImplementedError

    def rebuild_slot(self, index: int) -> None:  # pragma: no cover - interface
        """Replace slot ``index``'s env after it raised (``isolates_slots`` sims): close the old one
        (best effort), build a new one and leave it steppable; its next claim resets it with its seed."""
        raise NotImplementedError

    def skip_renders(self, unread: np.ndarray) -> None:
        """Before a step: ``unread`` (``[N]`` bool) marks the slots whose next images no one reads;
        a sim may leave them as they were (:mod:`pytest_hud.sim.renders`). Default: render all."""

    def hold_action(self) -> np.ndarray:
        """The action given to free, finished and disconnected slots (a no-op where declared)."""
        feat = self.contract().action
        if feat.type == "discrete":
            return np.asarray(int(feat.low[0]), dtype=np.int64)
        return np.zeros(feat.shape, dtype=feat.dtype)

    def close(self) -> None:
        pass


def declared_claim_rules(env: Any) -> ClaimRules | None:
    """The :class:`ClaimRules` a gymnasium env declares as ``hud_claims`` (through its wrappers), or None."""
    try:
        declared = env.get_wrapper_attr("hud_claims")
    except AttributeError:
        return None
    return ClaimRules.of(declared, f"{type(env.unwrapped).__name__}.hud_claims")


def _per_slot_info(infos: Mapping[str, Any], key: str, n: int) -> np.ndarray | None:
    """Read ``infos[key]`` from a gymnasium vector info dict as an ``[N]`` array (None if absent)."""
    if key not in infos:
        return None
    values = np.asarray(infos[key])
    mask = np.asarray(infos.get(f"_{key}", np.ones(n, bool)), dtype=bool)
    if values.shape[:1] != (n,):
        return None
    if values.dtype == object:
        values = np.array([bool(v) if v is not None else False for v in values])
    return np.where(mask, values, False)


def info_success(info: Mapping[str, Any]) -> bool:
    """One env's ``info`` says the episode succeeded."""
    for key in SUCCESS_KEYS:  # a loop, not any(): the bridge and the inline worker ask every step
        value = info.get(key)
        if value is not None and value:
            return True
    return False


def success_from_infos(infos: Mapping[str, Any], n: int) -> np.ndarray:
    out = np.zeros(n, bool)
    for key in SUCCESS_KEYS:
        flags = _per_slot_info(infos, key, n)
        if flags is not None:
            out |= flags.astype(bool)
    return out


def sim_stats(sim: VectorSim) -> Any:
    """The sim's own counters when it keeps any (``stats()``, e.g. a multi-task sim's env builds)."""
    stats = getattr(sim, "stats", None)
    try:
        return stats() if callable(stats) else None
    except Exception:  # noqa: BLE001 - counters are informational
        return None


def stepping_hint(sim: VectorSim, ticks: int, env_steps: int, step_s: float, ticking_s: float,
                  cores: int) -> str | None:
    """Why ``--hud-vectorization=processes`` would help this bridge, or None.

    ``step_s`` is the time the bridge spent in the sim's ``ticks`` steps, ``ticking_s`` the span
    from its first tick to its last. Said only of a sim whose independent envs step one after
    another in this process, more than one to a tick on average (one at a time gains nothing),
    when an env's step costs a millisecond or more and stepping took a quarter of the span or
    more, with more than one core to spread the envs over.
    """
    if not sim.splittable or cores < 2 or ticks <= 0 or env_steps < 1.5 * ticks or ticking_s <= 0:
        return None
    per_step, busy = step_s / env_steps, step_s / ticking_s
    if per_step < 1e-3 or busy < 0.25:
        return None
    return (f"its {sim.width} envs stepped one after another in one process ({per_step * 1e3:.1f} ms per "
            f"env-step, {busy:.0%} of the time it ran episodes); --hud-vectorization=processes steps them "
            f"on {cores} cores, with the same episodes")


class GymSim(VectorSim):
    """A gymnasium vector env with autoreset disabled, reset per slot through ``reset_mask``.

    A ``SyncVectorEnv`` (one independent env per slot) is also stepped per slot: :meth:`step_slots`
    steps the chosen sub-envs themselves, and this adapter keeps every slot's observation row, since
    the vector env's own buffer is only refreshed by its (unused) batched ``step``.
    """

    def __init__(self, env: Any, control_rate: float | None = None,
                 threads: EnvThreads | None = None) -> None:
        from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

        super().__init__(env.num_envs)
        self.env = env
        # A natively batched env (one object steps every slot) takes one int seed for all its slots.
        self._per_slot_seeds = isinstance(env, (SyncVectorEnv, AsyncVectorEnv))
        mode = env.metadata.get("autoreset_mode")
        self.supports_slot_reset = getattr(mode, "value", mode) == "Disabled"
        self.supports_slot_step = self.supports_slot_reset and isinstance(env, SyncVectorEnv)
        # one env per slot, reset and stepped one by one: one env's exception is its slot's alone
        self.isolates_slots = self.supports_slot_step
        if not self._per_slot_seeds and self.width > 1:
            self.claim_rules = ClaimRules(seeded=False)
        elif isinstance(env, SyncVectorEnv):
            self.claim_rules = declared_claim_rules(env.envs[0]) or self.claim_rules
        # --hud-vectorization=threads: each sub-env is reset, stepped and closed on its owner thread
        if threads is not None and not self.supports_slot_step:
            raise ValueError("env threads need a SyncVectorEnv with autoreset disabled (one env per slot)")
        self._threads = threads
        if threads is not None:  # env i lives on thread i % threads
            self.lanes = tuple(i % threads.threads for i in range(self.width))
        # One global reset gives the sample observation the contract is derived from, and leaves
        # every sub-env in a steppable state.
        obs = env.reset()[0] if threads is None else self._reset_everywhere()
        self._obs = self._flatten(obs)
        # read after the first reset (some envs set it there); an async env's workers would
        # die asking for an attribute their env lacks: not read there
        if not isinstance(env, AsyncVectorEnv):
            self.instruction = declared_instruction(env.envs[0] if isinstance(env, SyncVectorEnv) else env)
        sample = {k: v[0] for k, v in self._obs.items()}
        single = env.single_observation_space
        if not isinstance(obs, Mapping):
            sample = next(iter(sample.values()))
        self._contract = derive_contract(
            single, env.single_action_space, sample, env.metadata, control_rate
        )
        if not isinstance(obs, Mapping):
            self._bare_key = next(iter(self._contract.observation_features))
            self._obs = {self._bare_key: np.asarray(obs)}
        if self.supports_slot_step:  # rows are written one slot at a time: own writable copies
            self._obs = {k: np.array(v) for k, v in self._obs.items()}

    _bare_key: str | None = None

    def _reset_everywhere(self) -> Any:
        """The global first reset, each env on its owner thread; the batch as ``env.reset()`` builds it."""
        from gymnasium.vector.utils import concatenate, create_empty_array

        envs = self.env.envs
        single = [obs for obs, _ in self._threads.map(lambda i: envs[i].reset(), range(self.width))]
        space = self.env.single_observation_space
        return concatenate(space, single, create_empty_array(space, self.width))

    def _write_row(self, i: int, obs: Any) -> None:
        """Slot ``i``'s observation row (slot-wise calls: the vector env's own buffer is not used)."""
        if self._bare_key is not None:
            self._obs[self._bare_key][i] = obs
        else:
            for key, value in flatten_observation(obs).items():
                self._obs[key][i] = value

    def _flatten(self, obs: Any) -> dict[str, np.ndarray]:
        if isinstance(obs, Mapping):
            return flatten_observation(obs)
        return {self._bare_key or "state": np.asarray(obs)}

    def contract(self) -> Contract:
        return self._contract

    def reset_slots(self, indices, seeds, options) -> np.ndarray:
        n = self.width
        seed_list: list[int | None] = [None] * n
        for i, s in zip(indices, seeds):
            seed_list[i] = s
        # Options are per call: the server resets slots whose options differ in separate calls.
        opts = dict(next((o for o in options if o), None) or {})
        if self.isolates_slots:  # what SyncVectorEnv.reset does per env (on the env's thread with threads)
            envs, rows, faults = self.env.envs, list(indices), {}
            outs = self._each(lambda i: envs[i].reset(seed=seed_list[i], options=dict(opts)), rows, faults)
            flags = np.zeros(len(rows), bool)
            for k, (i, out) in enumerate(zip(rows, outs)):
                if out is not None:
                    self._write_row(i, out[0])
                    flags[k] = info_success(out[1])
            if faults:
                raise SlotFaults(faults, flags)
            return flags
        if self.supports_slot_reset:
            mask = np.zeros(n, bool)
            mask[list(indices)] = True
            opts["reset_mask"] = mask
        obs, infos = self.env.reset(seed=self._seed_arg(seed_list), options=opts or None)
        flat = self._flatten(obs)
        if self.supports_slot_reset:  # only the reset rows: the others are ours (see step_slots)
            rows = list(indices)
            for key, value in flat.items():
                self._obs[key][rows] = value[rows]
        else:
            self._obs = flat
        return success_from_infos(infos, n)[list(indices)]

    def _seed_arg(self, seed_list: list[int | None]) -> Any:
        if self._per_slot_seeds:
            return seed_list
        given = [s for s in seed_list if s is not None]
        if not given:
            return None
        if self.width == 1:
            return int(given[0])
        raise ValueError(
            f"{type(self.env).__name__} is a natively batched vector env: it takes one seed for all its "
            f"{self.width} slots, so an episode's seed would not decide its initial state (it would depend "
            f"on its slot and its neighbours). Use --hud-width=1 with it, make it with "
            f"vectorization_mode='sync' (one env per slot), or write a VectorSim whose reset_slots "
            f"honours each slot's seed")

    def skip_renders(self, unread: np.ndarray) -> None:
        if self.supports_slot_step:  # one env per slot (a flag only: no call on an env's thread)
            skip_env_renders(self.env.envs, unread)

    def step_slots(self, actions: np.ndarray, mask: np.ndarray) -> StepBatch:
        if not self.supports_slot_step:
            raise NotImplementedError("only a SyncVectorEnv with autoreset disabled steps a subset of slots")
        n = self.width
        # Python lists while stepping, one array each at the end: a numpy item write per env and
        # field costs more than the list's
        rewards, terminated, truncated, success = [0.0] * n, [False] * n, [False] * n, [False] * n
        score = None
        envs, rows, faults = self.env.envs, np.flatnonzero(mask).tolist(), {}
        outs = self._each(lambda i: envs[i].step(actions[i]), rows, faults)
        for i, out in zip(rows, outs):
            if out is None:
                continue  # this env raised: its slot's episode fails, the others' go on
            obs, reward, term, trunc, info = out
            rewards[i], terminated[i], truncated[i] = float(reward), bool(term), bool(trunc)
            self._write_row(i, obs)
            if info:  # most envs' info is empty on most steps: nothing to look up
                success[i] = info_success(info)
                if info.get("score") is not None:
                    if score is None:
                        score = np.full(n, np.nan)
                    score[i] = float(info["score"])
        batch = StepBatch(np.array(rewards), np.array(terminated), np.array(truncated), np.array(success), score)
        if faults:
            raise SlotFaults(faults, batch)
        return batch

    def _each(self, fn: Callable[[int], Any], rows: list[int], faults: dict[int, str]) -> list[Any]:
        """``fn(i)`` per slot of ``rows`` (on its owner thread with threads); see :func:`per_slot`."""
        if self._threads is None:
            return per_slot(fn, rows, faults)
        return self._threads.map(lambda i: per_slot(fn, [i], faults)[0], rows)

    def rebuild_slot(self, index: int) -> None:
        """A new env for slot ``index`` from the vector env's own factory, reset once without a seed
        so that a lockstep hold-step finds it steppable (its next claim resets it with its seed)."""
        if not self.isolates_slots:
            raise NotImplementedError("only a SyncVectorEnv of single envs rebuilds one slot's env")
        envs, fns = self.env.envs, self.env.env_fns

        def rebuild(i: int) -> None:
            try:
                envs[i].close()
            except Exception:  # noqa: BLE001 - the env that raised may not close cleanly
                pass
            envs[i] = fns[i]()
            self._write_row(i, envs[i].reset()[0])

        if self._threads is not None:
            self._threads.map(rebuild, [index])
        else:
            rebuild(index)

    def step(self, actions: np.ndarray) -> StepBatch:
        if self.isolates_slots:  # env by env, so that an exception is pinned on its slot
            return self.step_slots(actions, np.ones(self.width, bool))
        obs, rewards, terminated, truncated, infos = self.env.step(actions)
        self._obs = self._flatten(obs)
        n = self.width
        score = _per_slot_info(infos, "score", n)
        if score is not None:
            mask = np.asarray(infos.get("_score", np.ones(n, bool)), dtype=bool)
            score = np.where(mask, np.asarray(infos["score"], dtype=np.float64), np.nan)
        return StepBatch(rewards, terminated, truncated, success_from_infos(infos, n), score)

    def observe(self) -> dict[str, np.ndarray]:
        return self._obs

    def close(self) -> None:
        if self._threads is not None and not self.env.closed:
            envs = self.env.envs
            try:
                self._threads.map(lambda i: envs[i].close(), range(self.width))
            finally:
                self.env.closed = True  # its own close would close them again, on this thread
                self._threads.close()
        self.env.close()
