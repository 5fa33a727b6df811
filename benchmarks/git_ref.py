"""Shared by the before/after benchmarks: the ``pytest_hud`` package of a git ref, unpacked."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def extract_package(ref: str, into: Path) -> Path:
    """Unpack ``pytest_hud`` as it is at ``ref`` into ``into`` (put ``into`` on PYTHONPATH to run it)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "pytest_hud"], check=True,
                             capture_output=True).stdout
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def tree_with_package(ref: str, into: Path) -> Path:
    """This checkout's tree (its evals, sims, checkpoints and settings, linked) with ``ref``'s
    ``pytest_hud`` in place of its own, at ``into``: the same workload, the ref's code.

    A pytest run measures the package of the tree it runs in, not one put on ``PYTHONPATH``:
    ``python -m pytest`` puts the directory it starts in first on ``sys.path``, and the pool puts
    the run's directory and root first on its bridges' and policy servers' ``PYTHONPATH``. So run
    a ref's side in this tree (``cwd=into``, ``PYTHONPATH=into``), and the checkout's in ``ROOT``."""
    into.mkdir(parents=True, exist_ok=True)
    for entry in ROOT.iterdir():
        if entry.name in ("pytest_hud", ".git", ".pytest_cache") or entry.name.startswith(".venv"):
            continue
        (into / entry.name).symlink_to(entry)
    return extract_package(ref, into)


def check_package(python: str, tree: Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    """Stop unless ``python`` run in ``cwd`` (default ``tree``, as the benchmarks run pytest there)
    with ``env`` (default: ``tree`` on ``PYTHONPATH``) imports ``tree``'s ``pytest_hud``: a
    benchmark that measured the same code on both sides would say nothing."""
    where = subprocess.run([python, "-c", "import pytest_hud; print(pytest_hud.__file__)"], cwd=cwd or tree,
                           env=env or {**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True,
                           check=True).stdout.strip()
    if not Path(where).is_relative_to(tree):
        raise SystemExit(f"run in {tree}, {python} imports pytest_hud from {where}: the comparison would be void")
