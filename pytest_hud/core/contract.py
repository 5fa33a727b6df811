"""The contract: what a bridge sends (observation features) and accepts (the action).

A contract is derived from a gymnasium env's spaces plus one sample observation, or loaded from a
``contract.json`` that a user edited (to give state elements readable names, say). Nested ``Dict``
observations are flattened to slash keys (``{"pixels": {"top": ...}}`` → ``pixels/top``); HWC
uint8 arrays are camera images (``type: rgb``); 1-D numeric arrays are state.

Pure logic: no sockets, no pytest. ``gymnasium`` is imported only by :func:`derive_contract`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "ACTION_KEY",
    "RESERVED_KEYS",
    "Contract",
    "ContractError",
    "Feature",
    "derive_contract",
    "flatten_observation",
]

ACTION_KEY = "action"
#: Keys the bridge adds to every observation frame; no feature may use them.
RESERVED_KEYS = frozenset({"terminated", "truncated", "reward", "success", "error"})
SCHEMA = "pytest-hud/contract/1"


class ContractError(ValueError):
    """A contract that does not match its env, or an action that does not match its contract."""


@dataclass(frozen=True)
class Feature:
    """One observation feature or the action, as it travels on the wire."""

    name: str
    role: str  # "observation" or "action"
    type: str  # rgb | state | tensor | box | discrete | multi_discrete | multi_binary
    dtype: str
    shape: tuple[int, ...]
    names: list[str] = field(default_factory=list)
    low: list[float] | None = None
    high: list[float] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "role": self.role,
            "type": self.type,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "names": list(self.names),
        }
        if self.low is not None:
            # JSON has no infinity: an unbounded side is null (and reads back as -inf / +inf)
            out["low"] = [v if math.isfinite(v) else None for v in self.low]
            out["high"] = [v if math.isfinite(v) else None for v in (self.high or [])]
        return out

    @classmethod
    def from_dict(cls, name: str, data: Mapping[str, Any]) -> Feature:
        try:
            return cls(
                name=name,
                role=str(data["role"]),
                type=str(data["type"]),
                dtype=str(np.dtype(data["dtype"])),
                shape=tuple(int(d) for d in data["shape"]),
                names=[str(n) for n in data.get("names", [])],
                low=None if data.get("low") is None else [-math.inf if v is None else float(v) for v in data["low"]],
                high=None if data.get("high") is None else [math.inf if v is None else float(v) for v in data["high"]],
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ContractError(f"feature {name!r} in contract is malformed: {exc!r}") from None


@dataclass
class Contract:
    """Observation features plus the action feature, and the control rate in Hz."""

    features: dict[str, Feature]
    control_rate: float | None = None

    # ----------------------------------------------------------------- views
    @property
    def action(self) -> Feature:
        return self.features[ACTION_KEY]

    @property
    def observation_features(self) -> dict[str, Feature]:
        return {k: f for k, f in self.features.items() if f.role == "observation"}

    def observation_shapes(self) -> dict[str, tuple[tuple[int, ...], str]]:
        """Observation key -> (shape, feature type): what a policy checks its inputs against."""
        return {k: (tuple(f.shape), f.type) for k, f in self.observation_features.items()}

    @property
    def cameras(self) -> list[str]:
        """Names of the image features, in contract order."""
        return [k for k, f in self.observation_features.items() if f.type == "rgb"]

    @property
    def action_dim(self) -> int:
        return math.prod(self.action.shape)  # () -> 1; math, not numpy: the agent asks every step

    # ---------------------------------------------------------- persistence
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "control_rate": self.control_rate,
            "features": {k: f.to_dict() for k, f in self.features.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Contract:
        if not isinstance(data, Mapping) or not isinstance(data.get("features"), Mapping):
            raise ContractError("a contract is a JSON object with a 'features' object")
        features = {str(k): Feature.from_dict(str(k), v) for k, v in data["features"].items()}
        if ACTION_KEY not in features:
            raise ContractError(f"contract has no {ACTION_KEY!r} feature")
        rate = data.get("control_rate")
        return cls(features=features, control_rate=None if rate is None else float(rate))

    def canonical(self) -> str:
        """The contract as JSON with sorted keys: equal contracts give equal strings (a key for
        what is loaded or written per contract). Made once per contract object, and so is
        :meth:`signature`: both are asked per episode, and a contract is not changed once made
        (replace a feature by making a new contract)."""
        return self._canonical

    def signature(self) -> str:
        """A short readable fingerprint: each feature's type, dtype and shape, and a hash of the whole.

            >>> Contract({"action": Feature("action", "action", "box", "float32", (2,))}).signature()[:22]
            'action box float32(2) '
        """
        return self._signature

    @cached_property
    def _canonical(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @cached_property
    def _signature(self) -> str:
        import hashlib

        parts = [f"{name} {f.type} {f.dtype}({','.join(str(d) for d in f.shape)})"
                 for name, f in sorted(self.features.items())]
        return "; ".join(parts) + f" #{hashlib.sha256(self._canonical.encode()).hexdigest()[:12]}"

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write ``contract.json`` at an explicit path (never the current directory by default)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n", encoding="utf-8")
        return path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Contract:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ContractError(f"contract file {str(path)!r} does not exist") from None
        except json.JSONDecodeError as exc:
            raise ContractError(f"contract file {str(path)!r} is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    # ----------------------------------------------------------- validation
    def check_matches(self, derived: Contract) -> None:
        """Raise :class:`ContractError` naming the first feature where ``self`` and the env differ.

        Names and control rate may differ (a saved contract may rename elements); keys, roles,
        dtypes and shapes may not.
        """
        mine, theirs = set(self.features), set(derived.features)
        if mine - theirs:
            raise ContractError(
                f"contract feature(s) {sorted(mine - theirs)} are not produced by the env "
                f"(env has {sorted(theirs)}); regenerate the contract or fix the env"
            )
        if theirs - mine:
            raise ContractError(
                f"env produces feature(s) {sorted(theirs - mine)} missing from the contract; "
                "regenerate the contract or add them"
            )
        for key, want in self.features.items():
            got = derived.features[key]
            for attr in ("role", "dtype", "shape"):
                if getattr(want, attr) != getattr(got, attr):
                    raise ContractError(
                        f"feature {key!r}: contract says {attr} {getattr(want, attr)!r}, "
                        f"the env gives {getattr(got, attr)!r}"
                    )
            if want.names and len(want.names) != _names_len(want):
                raise ContractError(
                    f"feature {key!r}: contract lists {len(want.names)} names for shape "
                    f"{want.shape}"
                )

    def action_coercer(self) -> Callable[[Any], np.ndarray | int]:
        """:meth:`coerce_action` for this contract's action as it is now, for the per-step path: an
        action that already has the right kind (an integer array of one value in range for a
        discrete action; an array of the contract's dtype and shape, finite, for a box) passes
        after the checks it needs, its feature's fields read once; anything else goes through
        :meth:`coerce_action`, with its conversions and its errors."""
        feat, general, ndarray = self.action, self.coerce_action, np.ndarray
        if feat.type == "discrete" and feat.low is not None and feat.high is not None:
            # (whole bounds compare as ints: an int against a float costs more)
            low, high = (int(b) if math.isfinite(b) and b == int(b) else b for b in (feat.low[0], feat.high[0]))

            def discrete(action: Any) -> np.ndarray | int:
                if type(action) is ndarray and action.size == 1:
                    value = action.item()  # an integer array's is an int (a bool's is not)
                    if type(value) is int and low <= value <= high:
                        return value
                return general(action)

            return discrete
        if feat.type in ("multi_discrete", "multi_binary"):
            return general
        dtype, shape = np.dtype(feat.dtype), tuple(feat.shape)
        if math.prod(shape) > 64 or dtype.kind not in "fiu":
            return general
        flat = len(shape) == 1  # tolist() gives the values themselves

        def box(action: Any) -> np.ndarray | int:
            if (type(action) is ndarray and action.dtype == dtype and action.shape == shape
                    and math.isfinite(sum(action.tolist() if flat else action.ravel().tolist()))):
                return action
            return general(action)

        return box

    def coerce_action(self, action: Any) -> np.ndarray | int:
        """Turn one slot's wire action into what the env's single action space expects: a Python
        ``int`` for a discrete action (what ``Discrete.contains`` and an env's arithmetic take
        fastest), else an array of the contract's dtype and shape.

        Raises :class:`ContractError` with both shapes named when it does not fit.
        """
        feat = self.action
        arr = action if type(action) is np.ndarray else np.asarray(action)
        if arr.dtype.kind not in "biuf":
            raise ContractError(
                f"action has dtype {arr.dtype.str}; the contract expects numbers "
                f"({feat.dtype}, shape {feat.shape})"
            )
        want = feat.shape
        if feat.type == "discrete":
            if arr.size != 1:
                raise ContractError(
                    f"action of shape {arr.shape}; contract says {want} "
                    f"(one discrete choice in [{feat.low[0]:g}, {feat.high[0]:g}])"
                )
            value = arr.item()  # a Python int, float or bool
            if type(value) is not int:
                value = float(value)
                if not math.isfinite(value) or value != round(value):
                    raise ContractError(f"discrete action must be an integer, got {value!r}")
                value = int(value)
            if not feat.low[0] <= value <= feat.high[0]:
                raise ContractError(
                    f"discrete action {value} is outside [{feat.low[0]:g}, {feat.high[0]:g}]"
                )
            return value
        if arr.shape != want:
            if arr.size == int(np.prod(want)) and arr.ndim <= 1 and len(want) <= 1:
                arr = arr.reshape(want)
            else:
                raise ContractError(f"action of shape {arr.shape}, contract says {want}")
        if feat.type in ("multi_discrete", "multi_binary"):
            if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
                raise ContractError(f"{feat.type} action must hold integers, got {arr.tolist()}")
            return arr.astype(feat.dtype)
        if arr.size <= 64 and arr.dtype.kind in "fiu":
            # A small action: summing its values as Python floats costs a fraction of
            # np.isfinite(arr).all(); the sum is finite unless a value is NaN or inf (or the sum
            # overflows, which the exact check below then clears).
            values = arr.ravel().tolist()
            if not math.isfinite(sum(values)) and not all(map(math.isfinite, values)):
                raise ContractError(f"action holds NaN or inf: {arr.tolist()}")
        elif not np.isfinite(arr).all():  # the method: np.all's dispatch costs more than the check
            raise ContractError(f"action holds NaN or inf: {arr.tolist()}")
        return arr.astype(feat.dtype, copy=False)


def _names_len(feature: Feature) -> int:
    if feature.type == "rgb":
        return 3
    if feature.type == "discrete":
        return 1
    return int(np.prod(feature.shape)) if feature.shape else 1


def flatten_observation(obs: Any, prefix: str = "") -> dict[str, np.ndarray]:
    """Flatten a (possibly nested) dict observation to slash keys of numpy arrays.

    A bare array observation becomes ``pixels`` (an HWC uint8 image) or ``state``.
    """
    if isinstance(obs, Mapping):
        out: dict[str, np.ndarray] = {}
        for key, value in obs.items():
            out.update(flatten_observation(value, f"{prefix}{key}/"))
        return out
    arr = np.asarray(obs)
    if prefix:
        return {prefix.rstrip("/"): arr}
    return {("pixels" if _is_image(arr) else "state"): arr}


def _is_image(arr: np.ndarray) -> bool:
    return arr.dtype == np.uint8 and arr.ndim == 3 and arr.shape[-1] in (1, 3, 4)


def _observation_feature(name: str, arr: np.ndarray, space: Any) -> Feature:
    if name in RESERVED_KEYS or name == ACTION_KEY:
        raise ContractError(
            f"observation key {name!r} is reserved by the wire; rename it in the env "
            "(e.g. with a gymnasium ObservationWrapper)"
        )
    if arr.dtype.kind in "OVcSU":
        raise ContractError(f"observation {name!r} has dtype {arr.dtype.str}, which cannot travel")
    if _is_image(arr):
        return Feature(name, "observation", "rgb", str(arr.dtype), arr.shape,
                       ["height", "width", "channel"])
    kind = "state" if arr.ndim <= 1 else "tensor"
    shape = arr.shape if arr.ndim else (1,)
    low = high = None
    if space is not None and hasattr(space, "low") and kind == "state":
        low = [float(v) for v in np.broadcast_to(space.low, shape).reshape(-1)]
        high = [float(v) for v in np.broadcast_to(space.high, shape).reshape(-1)]
    leaf = name.rsplit("/", 1)[-1]
    names = [f"{leaf}_{i}" for i in range(int(np.prod(shape)))] if kind == "state" else []
    return Feature(name, "observation", kind, str(arr.dtype), tuple(shape), names, low, high)


def _space_leaves(space: Any, prefix: str = "") -> dict[str, Any]:
    from gymnasium import spaces

    if isinstance(space, spaces.Dict):
        out: dict[str, Any] = {}
        for key, sub in space.spaces.items():
            out.update(_space_leaves(sub, f"{prefix}{key}/"))
        return out
    return {prefix.rstrip("/"): space}


def action_feature(space: Any) -> Feature:
    """The action feature for a single env's action space (Box, Discrete, MultiDiscrete, MultiBinary)."""
    from gymnasium import spaces

    if isinstance(space, spaces.Box):
        shape = tuple(space.shape) or (1,)
        return Feature(
            ACTION_KEY, "action", "box", str(space.dtype), shape,
            [f"action_{i}" for i in range(int(np.prod(shape)))],
            [float(v) for v in np.broadcast_to(space.low, shape).reshape(-1)],
            [float(v) for v in np.broadcast_to(space.high, shape).reshape(-1)],
        )
    if isinstance(space, spaces.Discrete):
        start = int(space.start)
        return Feature(ACTION_KEY, "action", "discrete", "int64", (1,), ["action"],
                       [float(start)], [float(start + space.n - 1)])
    if isinstance(space, spaces.MultiDiscrete):
        nvec = np.asarray(space.nvec).reshape(-1)
        start = np.asarray(space.start).reshape(-1)
        return Feature(ACTION_KEY, "action", "multi_discrete", "int64", tuple(space.shape),
                       [f"action_{i}" for i in range(nvec.size)],
                       [float(s) for s in start], [float(s + n - 1) for s, n in zip(start, nvec)])
    if isinstance(space, spaces.MultiBinary):
        shape = tuple(space.shape)
        size = int(np.prod(shape))
        return Feature(ACTION_KEY, "action", "multi_binary", "int8", shape,
                       [f"action_{i}" for i in range(size)], [0.0] * size, [1.0] * size)
    raise ContractError(
        f"action space {space!r} is not supported; use Box, Discrete, MultiDiscrete or MultiBinary"
    )


def derive_contract(
    observation_space: Any,
    action_space: Any,
    sample_observation: Any,
    metadata: Mapping[str, Any] | None = None,
    control_rate: float | None = None,
) -> Contract:
    """Derive a contract from a *single* env's spaces and one observation it produced.

    >>> env = gymnasium.make("CartPole-v1"); obs, _ = env.reset(seed=0)
    >>> derive_contract(env.observation_space, env.action_space, obs, env.metadata)
    """
    flat = flatten_observation(sample_observation)
    leaves = _space_leaves(observation_space)
    if len(leaves) == 1 and "" in leaves:
        leaves = {next(iter(flat)): leaves[""]}
    features = {name: _observation_feature(name, arr, leaves.get(name)) for name, arr in flat.items()}
    features[ACTION_KEY] = action_feature(action_space)
    if control_rate is None and metadata:
        rate = metadata.get("render_fps")
        control_rate = float(rate) if rate else None
    return Contract(features=features, control_rate=control_rate)
