"""Import only the LeRobot policy code a checkpoint needs.

``lerobot.policies``' own ``__init__`` imports the configuration of every policy LeRobot ships. On
LeRobot 0.6.1 those pull in diffusers' models, scipy and more: loading a small ACT checkpoint took
7.3-10.8 CPU-seconds with them and 4.4-8.0 without (the factory's own imports are the rest), and a
policy server's first action waits for all of it. A checkpoint needs its own type's configuration
(to register it with LeRobot's config parser) and model, nothing else.

:func:`import_policy_code` therefore puts the package in ``sys.modules`` without running its
``__init__``, and each policy's package too (``lerobot.policies.groot`` and the rest), then imports
the factory and the checkpoint type's package and configuration. The other policies' packages
matter: LeRobot 0.6's factory imports GR00T's configuration, and GR00T's ``__init__`` imports its
model and processors, which bring in LeRobot's datasets (Hugging Face ``datasets``, pandas,
pyarrow: 0.8-0.9 of a CPU-second on a policy server's critical path, whatever the checkpoint's
type). The checkpoint type's own package runs its ``__init__``, as a plain import of its
configuration would: it may register what its checkpoints need (a processor module's steps); its
processor module is imported too, for the LeRobot versions whose policy packages have no
``__init__`` (0.4: ``lerobot.policies``' own imports SmolVLA's processor to register its steps).

A package left unrun completes itself the first time anyone asks it for a name it lacks (``from
lerobot.policies import ACTConfig``, ``lerobot.policies.make_policy``, ``from
lerobot.policies.groot import GrootPolicy``): it then runs its ``__init__``, as a plain import would
have, so code that uses a package as a whole still works, only later. Nothing is skipped where a
package is imported already, and a type whose configuration is not one of LeRobot's own (a
plugin's) gets the whole package first, as before.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import sys
import threading
from types import ModuleType
from typing import Any

__all__ = ["import_policy_code"]

PACKAGE = "lerobot.policies"


def import_policy_code(policy_type: str | None = None) -> None:
    """Import LeRobot's policy config parser and factory, and ``policy_type``'s configuration
    (None: the type is not known yet; call again with it before loading a checkpoint)."""
    _lazy_package()
    if policy_type is not None:
        module = f"{PACKAGE}.{policy_type}.configuration_{policy_type}"
        if not (policy_type.isidentifier() and _found(module)):
            _complete(sys.modules[PACKAGE])  # a plugin's type: registered by the whole package, if at all
        else:
            # the type's own package whole, as a plain import of its configuration runs it: its
            # __init__ may register what its checkpoints need (a processor module's steps)
            own = sys.modules.get(f"{PACKAGE}.{policy_type}")
            if own is not None:
                _complete(own)
            importlib.import_module(module)
            # and its processor module, which registers the processor steps its checkpoints name:
            # where the type's package has no __init__ to import it (LeRobot 0.4's are namespace
            # packages), ``lerobot.policies``' own __init__ imports some of them for that alone
            processor = f"{PACKAGE}.{policy_type}.processor_{policy_type}"
            if _found(processor):
                importlib.import_module(processor)
    importlib.import_module("lerobot.configs.policies")
    importlib.import_module(f"{PACKAGE}.factory")


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


_LOCK = threading.RLock()
_lazy: dict[str, ModuleType] = {}  # the packages whose __init__ has not run (or is running) yet


def _lazy_package() -> None:
    """``lerobot.policies`` and its subpackages in ``sys.modules``, their ``__init__`` not run yet
    unless the package was imported already; each runs on the first lookup of a name its package
    lacks (:func:`_complete`)."""
    with _LOCK:
        if PACKAGE in sys.modules:
            return
        spec = importlib.util.find_spec(PACKAGE)  # imports the top-level ``lerobot`` package (a version string)
        if not _regular(spec):
            importlib.import_module(PACKAGE)  # not a regular package: leave it to the import system
            return
        package = _lazy_module(spec, sys.modules["lerobot"])
        for found in pkgutil.iter_modules(package.__path__, f"{PACKAGE}."):
            if found.ispkg and found.name not in sys.modules:
                sub = importlib.util.find_spec(found.name)
                if _regular(sub):  # (a namespace package has no __init__ to leave unrun)
                    _lazy_module(sub, package)


def _regular(spec: Any) -> bool:
    """Whether ``spec`` finds a package whose ``__init__`` a loader runs."""
    return spec is not None and spec.loader is not None and spec.submodule_search_locations is not None


def _lazy_module(spec: Any, parent: ModuleType) -> ModuleType:
    """The package ``spec`` finds, in ``sys.modules`` and on ``parent`` (as the import system
    sets a submodule on its parent), its ``__init__`` left for the first missing name."""
    package = importlib.util.module_from_spec(spec)
    name = spec.name
    package.__dict__["__getattr__"] = lambda attr: _lookup(name, attr)
    _lazy[name] = sys.modules[name] = package
    setattr(parent, name.rpartition(".")[2], package)
    return package


def _lookup(name: str, attr: str) -> Any:
    """A name the lazy package ``name`` lacks: run its ``__init__`` (once), then look again."""
    package = sys.modules[name]
    _complete(package)
    try:
        return package.__dict__[attr]
    except KeyError:
        raise AttributeError(f"module {name!r} has no attribute {attr!r}") from None


def _complete(package: ModuleType) -> None:
    """Run a lazy package's ``__init__`` into it, once. Other threads wait for it; a lookup the
    ``__init__`` itself makes finds the names set so far, as in a plain import."""
    with _LOCK:
        name = package.__name__
        if _lazy.get(name) is not package:
            return  # imported whole, completed already, or this thread's own run mid-way
        del _lazy[name]  # (its __getattr__ stays until the run ends: other threads' lookups wait here)
        lookup = package.__dict__.get("__getattr__")
        try:
            package.__spec__.loader.exec_module(package)
        finally:
            if package.__dict__.get("__getattr__") is lookup:
                del package.__dict__["__getattr__"]
