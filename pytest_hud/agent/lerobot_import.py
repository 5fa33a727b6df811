"""Import only the LeRobot policy code a checkpoint needs.

``lerobot.policies``' own ``__init__`` imports the configuration of every policy LeRobot ships. On
LeRobot 0.6.1 those pull in diffusers' models, scipy and more: loading a small ACT checkpoint took
7.3-10.8 CPU-seconds with them and 4.4-8.0 without (the factory's own imports are the rest), and a
policy server's first action waits for all of it. A checkpoint needs its own type's configuration
(to register it with LeRobot's config parser) and model, nothing else.

:func:`import_policy_code` therefore puts the package in ``sys.modules`` without running its
``__init__``, then imports the factory and the checkpoint type's configuration. The package
completes itself the first time anyone asks it for a name it lacks (``from lerobot.policies
import ACTConfig``, ``lerobot.policies.make_policy``): it then runs its ``__init__``, as a plain
``import lerobot.policies`` would have, so code that uses the package as a whole still works, only
later. Nothing is skipped where the package is imported already, and a type whose configuration
is not one of LeRobot's own (a plugin's) gets the whole package first, as before.
"""

from __future__ import annotations

import importlib
import importlib.util
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
            importlib.import_module(module)
    importlib.import_module("lerobot.configs.policies")
    importlib.import_module(f"{PACKAGE}.factory")


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


_LOCK = threading.RLock()
_lazy: ModuleType | None = None  # the package, its __init__ not run or running yet


def _lazy_package() -> None:
    """``lerobot.policies`` in ``sys.modules``, its ``__init__`` not run yet unless it was imported
    already; it runs on the first lookup of a name the package lacks (:func:`_complete`)."""
    global _lazy
    with _LOCK:
        if PACKAGE in sys.modules:
            return
        spec = importlib.util.find_spec(PACKAGE)  # imports the top-level ``lerobot`` package (a version string)
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            importlib.import_module(PACKAGE)  # not a regular package: leave it to the import system
            return
        package = importlib.util.module_from_spec(spec)
        package.__dict__["__getattr__"] = _lookup
        _lazy = sys.modules[PACKAGE] = package
        sys.modules["lerobot"].policies = package  # as the import system sets a submodule on its parent


def _lookup(name: str) -> Any:
    """A name the lazy package lacks: run its ``__init__`` (once), then look again."""
    package = sys.modules[PACKAGE]
    _complete(package)
    try:
        return package.__dict__[name]
    except KeyError:
        raise AttributeError(f"module {PACKAGE!r} has no attribute {name!r}") from None


def _complete(package: ModuleType) -> None:
    """Run the lazy package's ``__init__`` into it, once. Other threads wait for it; a lookup the
    ``__init__`` itself makes finds the names set so far, as in a plain import."""
    global _lazy
    with _LOCK:
        if package is not _lazy:
            return  # imported whole, completed already, or this thread's own run mid-way
        _lazy = None  # (its __getattr__ stays until the run ends: other threads' lookups wait here)
        try:
            package.__spec__.loader.exec_module(package)
        finally:
            if package.__dict__.get("__getattr__") is _lookup:
                del package.__dict__["__getattr__"]
