"""Where a run's results come from: package versions, the git revision, the policy's content hash."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any

from pytest_hud import __version__
from pytest_hud.core.specs import portable_spec

__all__ = ["PolicyHashes", "git_revision", "installed_provenance", "provenance"]

_DISTRIBUTIONS = ("pytest-hud", "pytest", "pytest-xdist", "numpy", "gymnasium", "websockets", "msgpack",
                  "torch", "lerobot")


def provenance(settings: Any, root: Path, args: list[str], *, installed: bool = True) -> dict[str, Any]:
    """The results file's provenance for a run with ``settings`` (a :class:`~pytest_hud.core.settings.HudSettings`).

    ``policy_hash`` is None here: the controller fills it in from :class:`PolicyHashes` before the
    results file's header is written, so that hashing a large checkpoint does not hold up the start.
    So are ``versions`` and ``git`` with ``installed=False`` (see :func:`installed_provenance`)."""
    return {
        "plugin_version": __version__,
        "policy": portable_spec(settings.policy, [root]),
        "policy_hash": None,
        "sim": portable_spec(settings.sim, [root]),
        "width": settings.slots,
        "workers": settings.workers,
        "python": sys.version.split()[0],
        "platform": sys.platform,
        **(installed_provenance(root) if installed else {"versions": None, "git": None}),
        "options": settings.to_dict(),
        "args": list(args),
    }


def installed_provenance(root: Path) -> dict[str, Any]:
    """The provenance that asks the machine: the versions of the packages a result depends on, and
    the git revision of ``root`` (two git commands, the second walking the checkout: the controller
    runs this on a thread of its own while the workers start, not before)."""
    versions = {}
    for dist in _DISTRIBUTIONS:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return {"versions": versions, "git": git_revision(root)}


def git_revision(root: Path) -> dict[str, Any] | None:
    """``{"revision", "dirty"}`` of the git checkout at ``root`` (None outside one)."""
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=5)
        return {"revision": rev.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return None


class PolicyHashes:
    """The content hash of each policy a run uses (:func:`~pytest_hud.agent.model.policy_content_hash`),
    computed once per run on one background thread of the controller, for the provenance and for the
    identity every episode record carries (what ``--hud-resume`` matches on).

    A checkpoint is read whole to hash it (a VLA's is gigabytes): hashed in each xdist worker, the
    same files were read ``-n`` times over, on the cores the episodes need. The controller starts a
    policy's hash when a worker declares the tests that use it, so it is ready by the first result;
    workers ask for it (the pool's ``policy_hash`` call). None when the policy cannot be hashed.
    """

    def __init__(self) -> None:
        self._futures: dict[tuple[str, tuple[str, ...] | None], Future] = {}
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._stop = threading.Event()

    def start(self, spec: str, files: Sequence[str] | None) -> Future:
        """Start hashing ``spec``'s ``files`` (:func:`~pytest_hud.agent.model.policy_files`, as the
        worker that runs it resolved them) unless already done; returns the future of the hash."""
        key = (spec, tuple(files) if files is not None else None)
        with self._lock:
            future = self._futures.get(key)
            if future is None:
                if files is None:
                    future = Future()
                    future.set_result(None)
                else:
                    if self._executor is None:
                        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hud-policy-hash")
                    future = self._executor.submit(_content_hash, key[1], self._stop)
                self._futures[key] = future
            return future

    def get(self, spec: str | None, files: Sequence[str] | None) -> str | None:
        """The hash of ``spec``'s ``files``, waiting for it (None without a policy or files, or when
        a file cannot be read)."""
        return self.start(spec, files).result() if spec else None

    def close(self) -> None:
        """Stop: a hash still being read ends within one block (its askers get None)."""
        self._stop.set()
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False, cancel_futures=True)


def _content_hash(files: tuple[str, ...], stop: threading.Event) -> str | None:
    from pytest_hud.core.specs import hash_files

    try:
        return hash_files(files, stop)
    except OSError:  # unreadable (or stopped): never reused by resume, and provenance is best effort
        return None
