"""Sim and policy specs: parsed once where they enter, carried as a :class:`Spec`, resolved here.

A spec is what ``--hud-sim`` / ``--hud-policy`` (or ``@pytest.mark.hud(sim=..., policy=...)``, or
a server's ``--policy``) names. Its kind is read from its text alone, once (:func:`parse_spec`):

======================  ==============  ====================================================
text                    kind            what it names
======================  ==============  ====================================================
``ws://host:8000``      ``url``         a policy server (openpi protocol); policies only
``path/to/file.py:f``   ``file``        attribute ``f`` of a Python file
``package.module:f``    ``module``      attribute ``f`` of an importable module
``path/to/checkpoint``  ``checkpoint``  a LeRobot checkpoint directory; policies only
``CartPole-v1``         ``gym``         a registered gymnasium id; sims only
======================  ==============  ====================================================

:func:`resolve` is the one resolver of ``file`` and ``module`` specs (the sim adapters, the agent
and the policy server all call it); checking a spec without running its code and loading what it
names stay with the role that runs it (:mod:`pytest_hud.sim.target`, :mod:`pytest_hud.agent.model`).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import importlib.util
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = ["CONFIG_FILE", "WEIGHTS_FILE", "Spec", "SpecError", "as_spec", "checkpoint_type",
           "looks_like_lerobot_checkpoint", "parse_spec", "portable_spec", "resolve", "unimportable"]

Role = Literal["sim", "policy"]
KINDS = ("url", "file", "module", "checkpoint", "gym")


class SpecError(ValueError):
    """A spec that names nothing loadable (the message names the spec and the fix)."""


@dataclass(frozen=True)
class Spec:
    """A parsed sim or policy spec: its ``text`` as written, its ``kind`` (see the module docstring)
    and, for ``file`` and ``module``, where the factory lives (``location``) and its name (``attr``).

        >>> parse_spec("evals/sims/classic.py:cartpole", "sim")
        Spec(text='evals/sims/classic.py:cartpole', kind='file', role='sim', location='evals/sims/classic.py', attr='cartpole')
    """

    text: str
    kind: str
    role: str
    location: str = ""
    attr: str = ""

    def __str__(self) -> str:
        return self.text

    @property
    def is_factory(self) -> bool:
        """A ``file`` or ``module`` spec: code that :func:`resolve` loads."""
        return self.kind in ("file", "module")


def parse_spec(text: str, role: Role) -> Spec:
    """The :class:`Spec` that ``text`` writes (``role``: ``"sim"`` or ``"policy"``); raises
    :class:`SpecError` for text that cannot be a spec of that role. Reads nothing but the text, except
    that a policy spec with a colon that is an existing directory is a checkpoint.

        >>> parse_spec("ws://gpu-box:8000", "policy").kind
        'url'
        >>> parse_spec("evals/checkpoints/reach_act/final", "policy").kind
        'checkpoint'
        >>> parse_spec("CartPole-v1", "sim").kind
        'gym'
    """
    if role not in ("sim", "policy"):
        raise ValueError(f"a spec's role is 'sim' or 'policy', not {role!r}")
    text = str(text).strip()
    if not text:
        raise SpecError(f"an empty {role} spec: {_forms(role)}")
    if text.startswith(("ws://", "wss://")):
        if role == "sim":
            raise SpecError(f"sim {text!r} is a URL: a bridge's address goes to --hud-sim-url (its announce "
                            f"file); {_forms('sim')}")
        return Spec(text, "url", role)
    location, sep, attr = text.rpartition(":")
    if sep and role == "policy" and Path(text).expanduser().is_dir():
        sep = ""  # a checkpoint folder whose name has a colon
    if not sep:
        return Spec(text, "checkpoint" if role == "policy" else "gym", role)
    if not location or not attr:
        raise SpecError(f"{role} {text!r} names no {'factory' if not attr else 'module or file'}: {_forms(role)}")
    return Spec(text, "file" if location.endswith(".py") else "module", role, location, attr)


def as_spec(spec: Spec | str, role: Role) -> Spec:
    """``spec`` as a :class:`Spec`: a parsed one as it is, text parsed (API callers may pass text)."""
    return spec if isinstance(spec, Spec) else parse_spec(spec, role)


def _forms(role: str) -> str:
    if role == "sim":
        return ("use a gymnasium id such as CartPole-v1, 'module:factory' with the module on the import path, "
                "or 'path/to/file.py:factory'")
    return ("use 'module:factory', 'path/to/file.py:factory', a LeRobot checkpoint directory or a ws:// "
            "policy-server URL")


def unimportable(module: str) -> str:
    """How an error says that ``module`` (of a ``module:factory``) cannot be imported."""
    return f"no module {module!r} is importable here"


def resolve(spec: Spec) -> Any:
    """What a ``file`` or ``module`` spec names: the file is run as a module of its own (its folder on
    the import path while it runs, so it imports its neighbours), the module imported. Returns None
    for a ``module`` spec whose module is not importable here (for a sim, maybe a namespaced
    gymnasium id such as ``gym_pusht/PushT-v0``); raises :class:`SpecError` for a file that does not
    exist, a missing attribute, and a spec of another kind. Runs the spec's code: checks that must
    not (the controller's) read files instead.
    """
    if not spec.is_factory:
        raise SpecError(f"{spec.role} {spec.text!r} is a {spec.kind} spec, not a factory to resolve")
    if spec.kind == "file":
        return _from_file(spec)
    try:
        module = importlib.import_module(spec.location)
    except ModuleNotFoundError as exc:
        if exc.name and spec.location.startswith(exc.name):
            return None
        raise
    try:
        return getattr(module, spec.attr)
    except AttributeError:
        raise SpecError(f"module {spec.location!r} has no attribute {spec.attr!r}") from None


def _from_file(spec: Spec) -> Any:
    what = "sim target" if spec.role == "sim" else spec.role
    file = Path(spec.location).expanduser().resolve()
    if not file.is_file():
        raise SpecError(f"{what} file {spec.location!r} does not exist")
    name = f"_hud_sim_{abs(hash(str(file)))}"
    found = importlib.util.spec_from_file_location(name, file)
    if found is None or found.loader is None:
        raise SpecError(f"cannot import {spec.location!r} as a Python module")
    module = importlib.util.module_from_spec(found)
    sys.modules[name] = module
    sys.path.insert(0, str(file.parent))  # let the file import its neighbours
    try:
        found.loader.exec_module(module)
    finally:
        sys.path.remove(str(file.parent))
    try:
        return getattr(module, spec.attr)
    except AttributeError:
        raise SpecError(f"{spec.location!r} has no attribute {spec.attr!r}") from None


def portable_spec(spec: Spec | str | None, roots: Sequence[str | Path]) -> str | None:
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
        return None if spec is None else str(spec)
    spec = str(spec)
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


def hash_files(files: Sequence[str], stop: Any = None) -> str:
    """A sha256 over each file's name and content, in order (a policy's content hash: its files as
    ``pytest_hud.agent.model.policy_files`` lists them).

    ``stop``: an event (``threading.Event``) that, once set, ends the reading within one block by
    raising ``InterruptedError`` (a run that ends does not wait for a gigabyte checkpoint's hash)."""
    h = hashlib.sha256()
    for name in files:
        f = Path(name)
        h.update(f.name.encode())
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                if stop is not None and stop.is_set():
                    raise InterruptedError(f"hashing {f} was stopped")
                h.update(block)
    return "sha256:" + h.hexdigest()


#: What a LeRobot policy checkpoint folder holds (``save_pretrained``): its configuration and weights.
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def looks_like_lerobot_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a folder holding a LeRobot policy (``config.json`` with a policy ``type``,
    and ``model.safetensors``). Reads one small JSON file; imports neither numpy, torch nor lerobot
    (the controller asks, before its workers start)."""
    return checkpoint_type(Path(path)) is not None


def checkpoint_type(folder: Path) -> str | None:
    """The policy ``type`` of the LeRobot checkpoint in ``folder`` (None: it holds none)."""
    config_file = folder / CONFIG_FILE
    if not (config_file.is_file() and (folder / WEIGHTS_FILE).is_file()):
        return None
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    # transformers checkpoints also have config.json + model.safetensors, keyed "model_type".
    kind = config.get("type") if isinstance(config, dict) else None
    return kind if isinstance(kind, str) else None
