"""The Model seam: what a policy must offer, and how a ``--hud-policy`` spec becomes one.

A model maps one observation (contract feature name → array; images HWC uint8) and the task
prompt to an action ``[A]`` or an action chunk ``[T, A]`` that the agent executes open-loop::

    class MyPolicy:
        def predict(self, observation, prompt=None):
            return np.zeros(2, np.float32)
        def reset(self):                      # optional, called at each episode start
            ...
        def predict_batch(self, observations, prompts):   # optional, for the policy server
            ...

A policy spec is ``module:factory`` or ``path/to/file.py:factory`` (called with the contract when
it accepts an argument), a local LeRobot checkpoint directory, or an openpi server ``ws://`` URL:
parsed once into a :class:`~pytest_hud.core.specs.Spec` (:func:`policy_spec`), whose ``kind`` every
function here dispatches on; a factory is found by the core's one resolver
(:func:`pytest_hud.core.specs.resolve`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from pytest_hud.core.specs import (
    CONFIG_FILE, WEIGHTS_FILE, Spec, SpecError, hash_files, looks_like_lerobot_checkpoint, parse_spec, resolve,
    unimportable,
)

if TYPE_CHECKING:  # (numpy and the contract only in annotations: the controller checks specs without them)
    import numpy as np

    from pytest_hud.core.contract import Contract

__all__ = ["Model", "PolicyError", "as_model", "check_policy_spec", "load_policy", "policy_content_hash",
           "policy_spec"]


class PolicyError(SpecError):
    """A policy spec that cannot be loaded (the message names the spec and the fix)."""


def policy_spec(spec: Spec | str) -> Spec:
    """``spec`` parsed as a policy spec, where it enters (the controller's check, a worker's agent,
    the server's ``--policy``); a parsed one as it is. Raises :class:`PolicyError` for text that
    cannot be a policy spec."""
    if isinstance(spec, Spec):
        return spec
    try:
        return parse_spec(spec, "policy")
    except SpecError as exc:
        raise PolicyError(str(exc)) from None


def _check_checkpoint(spec: Spec) -> None:
    """Raise :class:`PolicyError` unless a ``checkpoint`` spec's folder is a LeRobot checkpoint."""
    if not looks_like_lerobot_checkpoint(Path(spec.text).expanduser()):
        raise PolicyError(
            f"policy {spec.text!r} is neither 'module:factory', 'path/to/file.py:factory', a LeRobot "
            "checkpoint directory (config.json + model.safetensors) nor a ws:// policy-server URL"
            + _why_not_a_checkpoint(Path(spec.text).expanduser()))


@runtime_checkable
class Model(Protocol):
    def predict(self, observation: Mapping[str, np.ndarray], prompt: str | None = None) -> Any: ...


class _CallableModel:
    """Wraps ``f(observation)`` or ``f(observation, prompt)`` as a :class:`Model`."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        try:
            n = len(inspect.signature(fn).parameters)
        except (TypeError, ValueError):
            n = 1
        self._takes_prompt = n >= 2

    def predict(self, observation: Mapping[str, np.ndarray], prompt: str | None = None) -> Any:
        return self.fn(observation, prompt) if self._takes_prompt else self.fn(observation)


def as_model(obj: Any) -> Any:
    """Accept a :class:`Model`, or a plain callable on observations."""
    if hasattr(obj, "predict") and callable(obj.predict):
        return obj
    if callable(obj):
        return _CallableModel(obj)
    raise PolicyError(
        f"a policy must have predict(observation, prompt) or be callable, got {type(obj).__name__}"
    )


def check_policy_spec(spec: Spec | str, here: Path | None = None) -> Spec:
    """Check a policy spec without running any of its code; returns it parsed, raises :class:`PolicyError`.

    A ``file.py:factory`` file must exist (relative to ``here``, the directory pytest runs in, as
    the workers load it) and bind the name ``factory`` somewhere in its source; a ``module:factory``
    module must be importable here, and its source, when it is a Python file, must bind it. The
    module is found, not imported (a policy module may import torch: seconds the controller need
    not spend). A module whose top level decides its names at run time (``from x import *``, a
    module ``__getattr__``) is given the benefit of the doubt.
    """
    spec = policy_spec(spec)
    if spec.kind == "checkpoint":
        _check_checkpoint(spec)
    if not spec.is_factory:
        return spec
    where, attr = spec.location, spec.attr
    if spec.kind == "file":
        file = Path(where).expanduser()
        if not file.is_absolute() and here is not None:
            file = here / file
        if not file.is_file():
            looked = f" (looked in {str(here)!r})" if here is not None and not Path(where).is_absolute() else ""
            raise PolicyError(f"policy file {where!r} of {spec.text!r} does not exist{looked}")
    else:
        import importlib.util

        try:
            found = importlib.util.find_spec(where)
        except (ImportError, ValueError) as exc:
            raise PolicyError(f"policy {spec.text!r}: module {where!r} cannot be found ({exc})") from None
        if found is None:
            raise PolicyError(f"policy {spec.text!r}: {unimportable(where)} (name a module on the import path, "
                              "or the file: 'path/to/file.py:factory')")
        file = Path(found.origin) if found.origin and found.origin.endswith(".py") else None
        if file is None:
            return spec
    names = _top_level_names(file)
    if names is not None and attr not in names:
        import difflib

        close = difflib.get_close_matches(attr, sorted(names), n=1)
        raise PolicyError(f"policy {spec.text!r}: {str(file)!r} defines no {attr!r}"
                          + (f" (did you mean {close[0]!r}?)" if close else ""))
    return spec


def _top_level_names(file: Path) -> set[str] | None:
    """Every name a Python file binds, at any depth (a lenient superset of its module attributes);
    None when they are only known by running it."""
    import ast

    try:
        tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None  # the worker's import says what is wrong, with its traceback
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add((alias.asname or alias.name).split(".")[0])
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Global):
            names.update(node.names)
    if "__getattr__" in names:
        return None
    return names


def _why_not_a_checkpoint(folder: Path) -> str:
    """What a path given as a checkpoint lacks, as the end of an error message ('' when unsure)."""
    if not folder.exists():
        return f": {str(folder)!r} does not exist"
    if not folder.is_dir():
        return f": {str(folder)!r} is a file, not a checkpoint directory"
    missing = [name for name in (CONFIG_FILE, WEIGHTS_FILE) if not (folder / name).is_file()]
    if missing:
        return f": {str(folder)!r} has no {' and no '.join(missing)}"
    return (f": {str(folder / CONFIG_FILE)!r} names no policy \"type\" (is it a LeRobot policy checkpoint, "
            "such as the pretrained_model folder of a training run?)")


def _factory_file(spec: Spec) -> Path | None:
    if spec.kind == "file":
        return Path(spec.location).expanduser()
    try:
        import importlib.util

        found = importlib.util.find_spec(spec.location)
    except (ImportError, ValueError):
        return None
    return Path(found.origin) if found and found.origin else None


def policy_files(spec: Spec | str | None) -> list[str] | None:
    """The files that define the policy, as absolute paths in hashing order: a checkpoint's files,
    or a factory's module (and the ``checkpoints/`` folder beside it); None for a policy without
    files (a ws:// server, a module that cannot be found) or a spec that names nothing."""
    try:
        spec = policy_spec(spec) if spec else None
    except PolicyError:
        return None
    if spec is None:
        return None
    if spec.kind == "checkpoint":
        root = Path(spec.text).expanduser()
        if not looks_like_lerobot_checkpoint(root):
            return None
        files = sorted(p for p in root.rglob("*") if p.is_file())
    elif spec.is_factory:
        file = _factory_file(spec)
        if file is None or not file.is_file():
            return None
        files = [file]
        # checkpoints the factory loads live next to it, by convention in checkpoints/
        ckpt = file.parent / "checkpoints"
        if ckpt.is_dir():
            files += sorted(p for p in ckpt.rglob("*") if p.is_file())
    else:
        return None
    return [str(f.absolute()) for f in files]  # not resolved: a symlink's own name is hashed


def policy_content_hash(spec: Spec | str) -> str | None:
    """A sha256 over the files that define the policy (:func:`policy_files`), None without files.

    Provenance for the results file and the identity that resume matches on.
    """
    files = policy_files(spec)
    return None if files is None else hash_files(files)


def load_policy(spec: Spec | str, contract: Contract, **options: Any) -> Any:
    """Build the model a ``--hud-policy`` spec names, for a bridge with ``contract``."""
    spec = policy_spec(spec)
    if spec.kind == "url":
        from pytest_hud.agent.remote import RemotePolicy

        return RemotePolicy(spec.text, **{k: v for k, v in options.items() if k in ("timeout", "api_key")})
    if spec.kind == "checkpoint":
        _check_checkpoint(spec)
        from pytest_hud.agent.lerobot import LeRobotPolicy

        threads = options.get("threads")
        if threads:
            # xdist workers each run a model: torch's one-thread-per-core default oversubscribes
            # the machine (N workers x N cores spinning threads), so each worker takes its share.
            import torch

            torch.set_num_threads(int(threads))
        try:
            return LeRobotPolicy.from_checkpoint(
                spec.text, contract.observation_shapes(), device=options.get("device", "cpu"),
                n_action_steps=options.get("n_action_steps"), rename=options.get("rename") or None)
        except ImportError as exc:  # its message already names the fix
            raise PolicyError(str(exc)) from None
    try:
        factory = resolve(spec)
    except (SpecError, ImportError) as exc:
        raise PolicyError(f"cannot load policy {spec.text!r}: {exc}") from None
    if factory is None:
        raise PolicyError(f"cannot load policy {spec.text!r}: {unimportable(spec.location)} (name a module "
                          "on the import path, or the file: 'path/to/file.py:factory')")
    if not callable(factory):
        raise PolicyError(f"policy {spec.text!r} does not name a callable factory")
    try:
        takes_arg = bool(inspect.signature(factory).parameters)
    except (TypeError, ValueError):
        takes_arg = False
    model = factory(contract) if takes_arg else factory()
    return as_model(model)

