"""How a sim or policy spec is written down in results, the same wherever the project lies."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

__all__ = ["portable_spec"]


def portable_spec(spec: str | None, roots: Sequence[str | Path]) -> str | None:
    """``spec`` as recorded in results: a ``path.py:attr`` sim or policy, or a checkpoint path, under
    one of ``roots`` (the run's rootdir first) relative to it, so the same suite in another checkout, a CI runner's
    workspace or a cluster node's copy records the same identity and is compared by the gate.

    Gymnasium ids, ``module:attr`` targets and files outside every root are returned unchanged.

        >>> portable_spec("/ci/build/evals/sims/classic.py:cartpole", ["/ci/build"])
        'evals/sims/classic.py:cartpole'
        >>> portable_spec("CartPole-v1", ["/ci/build"])
        'CartPole-v1'
    """
    if not spec:
        return spec
    where, sep, attr = spec.rpartition(":")
    if not (sep and where.endswith(".py")):
        where, sep, attr = spec, "", ""  # a checkpoint directory or file, or not a path at all
    if not os.path.isabs(where):
        return spec
    path = os.path.normpath(where)
    for root in roots:
        base = os.path.normpath(str(root))
        if path.startswith(os.path.join(base, "")):
            return f"{Path(os.path.relpath(path, base)).as_posix()}{sep}{attr}"
    return spec
