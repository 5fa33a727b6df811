"""What a sim's claims accept, declared by the sim and checked by the bridge before any env is touched.

A claim is ``reset(seed=..., options=..., task=...)`` on the control channel. A sim declares its
rules once (:class:`ClaimRules`: the largest seed it can honour, whether it takes per-slot seeds at
all, which option keys it reads); the bridge refuses a claim that breaks them at claim time, with
the valid range in the message, instead of failing (or silently misreading) it in the env.

A claim without a seed gets one drawn by the bridge, within the declared range, and the drawn seed
is returned and recorded with the episode: every episode can be run again from its results line.

A gymnasium env declares its rules with a ``hud_claims`` attribute (a :class:`ClaimRules`)::

    class MyTask(gym.Env):
        hud_claims = ClaimRules(max_seed=2**32 - 1, options=("difficulty",))

and a :class:`~pytest_hud.sim.base.VectorSim` with its ``claim_rules`` attribute.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

__all__ = ["DRAWN_SEED_BOUND", "ClaimRules"]

#: Drawn seeds are below this when a sim declares no largest seed (numpy's legacy seeding and most
#: sims' own accept any 32-bit seed).
DRAWN_SEED_BOUND = 2**32


@dataclass(frozen=True)
class ClaimRules:
    """What a sim's claims may carry.

    ``seeded``: the sim honours a seed per slot (False for a natively batched env that takes one seed
    for all its slots: a seeded claim is refused, and seedless ones are not given a seed).
    ``max_seed``: the largest seed it honours (seeds are ``0 .. max_seed``); None: any 32-bit or
    larger seed. ``options``: the ``reset`` option keys it reads; None: any; ``()``: none.
    """

    seeded: bool = True
    max_seed: int | None = None
    options: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.max_seed is not None and (isinstance(self.max_seed, bool) or not isinstance(self.max_seed, int)
                                          or self.max_seed < 0):
            raise ValueError(f"ClaimRules.max_seed must be a non-negative integer or None, got {self.max_seed!r}")
        if self.options is not None:
            object.__setattr__(self, "options", tuple(str(k) for k in self.options))

    def problem(self, seed: Any, options: Any) -> str | None:
        """Why a claim with ``seed`` and ``options`` breaks these rules (None when it does not)."""
        if seed is not None:
            if not self.seeded:
                return ("this sim takes one seed for all its slots, so a claim cannot carry a seed of its own "
                        f"(got seed={seed!r}); claim without a seed, or serve it with --hud-width=1")
            if self.max_seed is not None and seed > self.max_seed:
                return (f"seed {seed} is out of this sim's range: its seeds are 0 to {self.max_seed}; "
                        "choose a seed in that range")
        if options and self.options is not None:
            unknown = sorted(set(map(str, options)) - set(self.options))
            if unknown:
                accepted = ", ".join(self.options) if self.options else "none"
                return (f"option(s) {', '.join(unknown)} are not read by this sim (it reads: {accepted}); "
                        "remove them, or declare them in the sim's claim rules")
        return None

    def draw_seed(self, rng: random.Random) -> int | None:
        """A seed for a claim that gave none (None for a sim that takes no per-slot seed)."""
        if not self.seeded:
            return None
        bound = DRAWN_SEED_BOUND if self.max_seed is None else min(self.max_seed + 1, DRAWN_SEED_BOUND)
        return rng.randrange(bound)

    def to_dict(self) -> dict[str, Any]:
        return {"seeded": self.seeded, "max_seed": self.max_seed,
                "options": None if self.options is None else list(self.options)}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ClaimRules:
        data = data or {}
        options = data.get("options")
        return cls(bool(data.get("seeded", True)), data.get("max_seed"),
                   None if options is None else tuple(options))

    @classmethod
    def of(cls, declared: Any, where: str) -> ClaimRules | None:
        """``declared`` (a ClaimRules, a dict of its fields, or None) as ClaimRules; errors name ``where``."""
        if declared is None or isinstance(declared, ClaimRules):
            return declared
        if isinstance(declared, dict):
            unknown = set(declared) - {"seeded", "max_seed", "options"}
            if not unknown:
                return cls.from_dict(declared)
        raise ValueError(f"{where} must be a pytest_hud.sim.ClaimRules (or a dict of seeded, max_seed, "
                         f"options), got {declared!r}")
