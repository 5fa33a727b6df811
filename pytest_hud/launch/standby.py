"""A standby interpreter: it imports ahead, then becomes one of the run's services.

    python -m pytest_hud.launch.standby --parent-pid PID MODULE [PRELOAD]

``LocalLauncher.warm`` starts one at pytest's configure for a role whose next service is slow to
import (a policy server: torch and LeRobot take seconds, and the policy it will serve is only known
once a worker has collected). It calls ``PRELOAD`` (``module:function``), then waits for one JSON
line on stdin, ``{"argv": [...], "env": {...}}``: the arguments and environment the launcher would
have started ``python -m MODULE`` with. It applies the environment (``PYTHONPATH`` entries join
``sys.path`` where Python's start-up puts them) and runs ``MODULE`` as ``__main__``, in this
process: what was imported ahead stays imported. End of stdin (the run ended without needing it,
or the controller died) ends it. ``--parent-pid`` names the controller on the command line, as a
launched service's own arguments do, so that tools (and the teardown drills) that look for a run's
services by their command line find this one too. A failed preload only costs the time: the
service imports what it needs itself and reports its own errors.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys


def _preload(spec: str) -> None:
    module, _, function = spec.partition(":")
    try:
        getattr(importlib.import_module(module), function)()
    except Exception as exc:  # noqa: BLE001 - the service's own import reports it properly
        print(f"pytest-hud standby: preloading {spec} failed ({type(exc).__name__}: {exc})",
              file=sys.stderr, flush=True)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--parent-pid"]:
        argv = argv[2:]  # read by the service itself, from the arguments its launch hands over
    if not argv or len(argv) > 2:
        print("usage: python -m pytest_hud.launch.standby --parent-pid PID MODULE [PRELOAD]", file=sys.stderr)
        os._exit(2)
    module = argv[0]
    if len(argv) == 2:
        _preload(argv[1])
    line = sys.stdin.readline()
    if not line.strip():
        os._exit(0)  # nobody needed this one
    order = json.loads(line)
    env = {str(k): str(v) for k, v in order.get("env", {}).items()}
    os.environ.update(env)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in sys.path]
    sys.path[1:1] = paths  # after the working directory, before the installation: as at start-up
    sys.argv = [module, *order["argv"]]
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # as a launched service's stdin: the launcher's pipe has done its job
    os.close(devnull)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
