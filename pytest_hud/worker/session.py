"""A worker's runtime: its link to the controller's pool, its bridges, its policies, its recorders.

Each worker (or the single process under ``-n 0``) holds one :class:`HudSession`, created by the
plugin when the run uses pytest-hud, and reaches it through :data:`SESSION_KEY` in the config's stash.
It keeps one :class:`SharedSim` per (sim target, build args) and one agent per policy spec, all
reused for every episode the worker runs. Episodes attach themselves to the running test here.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_hud.agent.loop import Agent
from pytest_hud.agent.model import PolicyError, load_policy, policy_spec
from pytest_hud.client.address import BridgeAddress, BridgeError
from pytest_hud.core.contract import Contract
from pytest_hud.client.episode import Episode, EpisodeError
from pytest_hud.worker.keys import EPISODES_KEY, SESSION_KEY, worker_session
from pytest_hud.recording.recorder import Recorder
from pytest_hud.recording.from_settings import open_recorders
from pytest_hud.wire.rpc import RpcClient, RpcError
from pytest_hud.core.settings import HudSettings

if TYPE_CHECKING:  # imported when a worker runs its sim itself: the bridge's engine and the sim loader
    from pytest_hud.client.bridge import ControlClient
    from pytest_hud.worker.inline import InlineBridge

__all__ = ["EPISODES_KEY", "SESSION_KEY", "HudSession", "SharedSim", "worker_session"]


class HudSession:
    """A worker's view of the run: pool connection, bridges, policies and settings."""

    def __init__(self, pool_host: str | None, pool_port: int | None, secret: str, worker: int,
                 settings: HudSettings, rendezvous: str | None = None, project_roots: tuple[str, ...] = ()):
        self.pool_host, self.pool_port, self.secret = pool_host, pool_port, secret
        self.project_roots = project_roots  # the run's rootdir and invocation dir: see project_paths
        self.rendezvous = rendezvous  # where the controller writes the pool's address when started lazily
        self.pending_declare: dict[str, Any] | None = None  # sent with the first call to the pool
        self.worker = worker
        self.settings = settings
        self._pool: RpcClient | None = None
        self._lock = threading.Lock()
        self.sims: dict[tuple[str, str], SharedSim] = {}
        self.agents: dict[tuple[str, str, str], Agent] = {}  # (policy, contract, rename) as JSON
        self.current_item: pytest.Item | None = None
        self.policy_hashes: dict[str | None, str | None] = {}  # content hash per policy spec (resume identity)
        self.policy_places: dict[str, dict[str, Any]] = {}  # policy spec -> its server's {"url", "node", "host"}
        self._load_failures: dict[tuple[str, str, str], str] = {}  # (policy, contract, rename) -> why it did not load
        self._recorders: list[Any] | None = None

    def project_paths(self) -> list[str]:
        """This process's import paths inside the project (under its rootdir or invocation dir), such
        as the test folders pytest's collection put on ``sys.path``: the bridges and policy servers
        started for this worker need them to import the same ``module:factory`` targets (a
        tutorial-style ``sims:my_task`` beside the test file), and the controller, which collects
        nothing under xdist, does not have them."""
        roots = tuple(os.path.join(os.path.realpath(r), "") for r in self.project_roots)
        install = tuple(os.path.join(os.path.realpath(p), "")
                        for p in {sys.prefix, sys.base_prefix, sys.exec_prefix})
        out = []
        for p in sys.path:
            if not p or not os.path.isdir(p):
                continue
            real = os.path.join(os.path.realpath(p), "")
            if real.startswith(roots) and not real.startswith(install):
                out.append(p)
        return out

    @property
    def recorders(self) -> list[Recorder]:
        """This worker's video, trace and dataset recorders (created on first use, shared by all agents)."""
        if self._recorders is None:
            self._recorders = open_recorders(self.settings, self._worker_id if self.settings.distributed else "main",
                                             video_slots=self._video_slot)
        return self._recorders

    def _video_slot(self, task: str, what: str) -> bool:
        """Take (True if one was left), keep or give back one of ``task``'s ``--hud-video-max``
        videos, counted by the controller for every worker (which gives back the takes of a worker
        that dies mid-episode)."""
        return bool(self.pool_call("video_slot", task=task, what=what, holder=self._worker_id))

    @property
    def _worker_id(self) -> str:
        """This worker's xdist id (``gw3``), as the controller knows its gateway."""
        return f"gw{self.worker}"

    def close_recorders(self, timeout: float = 120.0) -> None:
        """Finish pending videos and commit dataset parts (idempotent)."""
        for recorder in self._recorders or []:
            recorder.close(timeout)
        self._recorders = []

    def label_recorders(self, task: str, episode: str) -> None:
        for recorder in self.recorders:
            recorder.label_next(task, episode)

    def flush_recorders(self, timeout: float = 60.0) -> dict[str, str]:
        """Wait for pending video encodes; the artefacts of the last episode (for errored ones)."""
        artefacts: dict[str, str] = {}
        for recorder in self._recorders or []:
            recorder.flush(timeout)
            artefacts.update(recorder.last_artefacts or {})
        return artefacts

    def _pool_address(self) -> tuple[str, int]:
        """The pool's address; in a lazily started run, wait for the controller to write it.

        A lazily started controller also writes the settings it checked and completed (videos' and
        traces' absolute paths, video turned off without PyAV): this worker's were built before that."""
        if self.pool_port is None:
            path = Path(self.rendezvous or "") / "pool.json"
            deadline = time.monotonic() + self.settings.boot_timeout
            while not path.is_file():
                if time.monotonic() > deadline:
                    raise EpisodeError(f"the pytest-hud controller did not start its pool ({path} never appeared)")
                time.sleep(0.02)
            data = json.loads(path.read_text())  # HudController.workerinput()
            self.pool_host, self.pool_port = data["pool_host"], int(data["pool_port"])
            self.settings = HudSettings.from_dict(data["settings"])
        return str(self.pool_host), int(self.pool_port)

    @property
    def pool(self) -> RpcClient:
        if self._pool is None:
            self.pool_host, self.pool_port = self._pool_address()
            self._pool = RpcClient(self.pool_host, self.pool_port, self.secret,
                                   timeout=self.settings.timeouts.pool_call, what="pytest-hud pool")
        return self._pool

    def pool_call(self, method: str, **params: Any) -> Any:
        with self._lock:
            if self.pending_declare is not None:
                declare, self.pending_declare = self.pending_declare, None
                self._call("declare", declare)
            return self._call(method, params)

    def _call(self, method: str, params: dict[str, Any]) -> Any:
        try:
            return self.pool.call(method, **params)
        except RpcError as exc:
            if exc.code is None:  # connection trouble: one fresh connection, one retry
                self._pool = None
                return self.pool.call(method, **params)
            raise

    def sim(self, target: str | None, build: Mapping[str, Any] | None = None) -> SharedSim:
        if not target:
            raise pytest.UsageError(
                "no sim: pass --hud-sim TARGET (a gymnasium id, 'module:factory' or "
                "'path.py:factory'), set hud_sim in the ini file, or mark the test "
                "@pytest.mark.hud(sim=...)"
            )
        key = (target, json.dumps(dict(build or {}), sort_keys=True))
        sim = self.sims.get(key)
        if sim is None:
            sim = self.sims[key] = SharedSim(self, target, dict(build or {}))
        return sim

    def agent(self, policy: str, contract: Contract, rename: dict[str, str] | None = None) -> Agent:
        """The harness for ``policy`` on ``contract``, its model fed with ``rename`` (default: the
        run's ``--hud-policy-rename``); loaded once per worker and (policy, contract, rename)."""
        rename = dict(self.settings.rename if rename is None else rename)
        key = (policy, contract.canonical(), json.dumps(rename, sort_keys=True))
        agent = self.agents.get(key)
        failed = self._load_failures.get(key)
        if failed is not None:
            raise EpisodeError(f"{failed} (it failed to load earlier in this worker, so it is not loaded again)")
        if agent is None:
            try:
                spec = policy_spec(policy)  # parsed once here; loading dispatches on its kind
            except PolicyError as exc:
                self._load_failures[key] = str(exc)
                raise EpisodeError(str(exc)) from None
            served: dict[str, Any] = {}
            if self.settings.policy_server and spec.kind != "url":
                # One model copy for the whole run, batched across workers: this worker loads none.
                try:
                    reply = self.pool_call("policy_server", spec=policy, contract=contract.to_dict(),
                                           worker=self.worker, python_path=self.project_paths(),
                                           **({"rename": rename} if rename else {}))
                except RpcError as exc:
                    raise EpisodeError(f"no policy server for {policy!r}: {exc.message}") from None
                place = reply if isinstance(reply, dict) else {"url": reply}
                self.policy_places[policy] = place
                spec = policy_spec(place["url"])  # the pool's server for it, a ws:// URL
                # The pool starts its policy servers keyed with the run secret (listed ones bring their key).
                served["api_key"] = place.get("key") or self.secret
            try:
                model = load_policy(spec, contract, n_action_steps=self.settings.n_action_steps,
                                    rename=rename,
                                    timeout=self.settings.first_action_timeout,
                                    threads=_model_threads(), **served)
            except PolicyError as exc:
                self._load_failures[key] = str(exc)
                raise EpisodeError(str(exc)) from None
            except Exception as exc:  # a corrupt checkpoint, a factory that raises: once per worker
                self._load_failures[key] = f"cannot load policy {policy!r}: {type(exc).__name__}: {exc}"
                raise EpisodeError(self._load_failures[key]) from exc  # the first one shows the traceback
            agent = Agent(
                model,
                observers=self.recorders,
                n_action_steps=self.settings.n_action_steps,
                recv_timeout=self.settings.timeouts.recv,
                first_action_timeout=self.settings.first_action_timeout,
                step_timeout=self.settings.step_timeout,
            )
            self.agents[key] = agent
        return agent

    def begin(self, episode: Episode) -> None:
        """Attach ``episode`` to the running test, or refuse it: each test reports one episode.

        Refused with an :class:`EpisodeError` (so the test is an error, never a silently dropped
        episode): an episode claimed outside a test's call phase (a fixture, a hook), and a second,
        different episode in the same test.
        """
        item = self.current_item
        if item is None:
            raise EpisodeError(
                "an episode was claimed outside a test function (in a fixture or a hook?): pytest-hud "
                "reports each episode as the test that runs it, so claim it in the test function")
        episodes = item.stash.setdefault(EPISODES_KEY, [])
        if episodes and all(ep is not episode for ep in episodes):
            raise EpisodeError(
                f"{item.nodeid} already ran an episode (seed={episodes[0].seed}): one test is one episode. "
                "Parametrize the test instead: @pytest.mark.parametrize('seed', range(N))")
        if not episodes:
            episodes.append(episode)

    def close(self) -> None:
        self.close_recorders()
        for sim in self.sims.values():
            sim.close()
        for agent in self.agents.values():
            close = getattr(agent.model, "close", None)
            if callable(close):
                close()
        if self._pool is not None:
            self._pool.close()


class SharedSim:
    """This worker's handle on a shared bridge: ``.contract``, ``.episode(**task)``, ``.stats()``.

    Claims made here belong to this worker's control connection: if the worker dies, the bridge
    frees them.
    """

    def __init__(self, session: HudSession, target: str, build: dict[str, Any]):
        self.session = session
        self.target = target
        self.build = build
        self.address: BridgeAddress | None = None
        self._control: ControlClient | InlineBridge | None = None
        self._contract: Contract | None = None
        self.inline = False  # this worker steps the sim's env itself (--hud-inline)
        self._connect()

    def _connect(self, replace_pid: int | None = None, refuse_inline: bool = False) -> None:
        if self.session.settings.inline == "always":
            self._run_inline()
            return
        try:
            reply = self.session.pool_call("bridge", target=self.target, build=self.build,
                                           worker=self.session.worker, replace_pid=replace_pid,
                                           python_path=self.session.project_paths(), refuse_inline=refuse_inline)
        except RpcError as exc:
            raise EpisodeError(f"no bridge for sim {self.target!r}: {exc.message}") from None
        self.address = BridgeAddress.from_dict(reply)
        if self.address.inline_known:  # an earlier run found it camera-less: no bridge runs, so check
            if self._known_inline_holds():
                return
            self._connect(replace_pid, refuse_inline=True)  # a camera after all: the bridge decides
            return
        if self.address.inline:  # the pool measured: one env-step costs less than a round trip
            self._run_inline()
            return
        if self._control is not None:
            self._control.close()
        from pytest_hud.client.bridge import ControlClient  # (the WebSocket stack: a bridge runs the sim)

        self._control = ControlClient(self.address, timeout=30.0)
        self._contract = self._control.contract()

    def _run_inline(self) -> None:
        """Build the sim here, with one slot run by the bridge's own rules (:mod:`.inline`)."""
        from pytest_hud.worker.inline import InlineBridge

        try:
            self._control = InlineBridge(self.target, self.build)
        except BridgeError as exc:
            raise EpisodeError(str(exc)) from None
        except Exception as exc:  # the factory raised, or the target is unknown: as a bridge would say it
            raise EpisodeError(f"cannot build sim {self.target!r} in this worker: {type(exc).__name__}: {exc}") from exc
        self._contract = self._control.contract()
        self.inline = True

    def _known_inline_holds(self) -> bool:
        """Run the sim here as an earlier run found it (camera-less, separate envs) if it still is."""
        from pytest_hud.worker.inline import InlineBridge

        try:
            inline = InlineBridge(self.target, self.build)
        except Exception:  # noqa: BLE001 - it cannot run here alone (any more): a bridge says why, or runs it
            return False
        if inline.contract().cameras:
            inline.close()
            return False
        self._control, self._contract, self.inline = inline, inline.contract(), True
        return True

    @property
    def control(self) -> ControlClient | InlineBridge:
        assert self._control is not None
        return self._control

    @property
    def contract(self) -> Contract:
        """The bridge's contract: observation features and the action."""
        assert self._contract is not None
        return self._contract

    def episode(self, seed: int | None = None, **task: Any) -> Episode:
        """An episode of this sim with ``seed`` (and ``options``, ``prompt``, ...).

        Claims a slot on enter (``with``), grades and frees it on exit even on failure; or pass it
        straight to ``robot_agent.run()``, which does the same.
        """
        if self.build:
            task.setdefault("build", self.build)
        return _PluginEpisode(self, seed=seed, **task)

    def stats(self) -> dict[str, Any]:
        return self.control.stats()

    def close(self) -> None:
        if self._control is not None:
            self._control.close()


class _PluginEpisode(Episode):
    """An :class:`Episode` that recovers from a replaced bridge and reports itself to the test."""

    def __init__(self, sim: SharedSim, replay: bool = False, **task: Any) -> None:
        self._sim = sim
        self._replay = replay  # a replay of the test's episode, not a second episode of the test
        super().__init__(sim.control, sim.contract, **task)

    def rerun(self) -> Episode:
        return _PluginEpisode(self._sim, replay=True, **self.rerun_task())

    def open_slot(self, recv_timeout: float) -> Any:
        if self._sim.inline:
            return self.control.open_slot(self.token)
        return super().open_slot(recv_timeout)

    async def aopen_slot(self, recv_timeout: float) -> Any:
        if self._sim.inline:
            from pytest_hud.worker.inline import AsyncInlineSlot

            return AsyncInlineSlot(self.control.open_slot(self.token))
        return await super().aopen_slot(recv_timeout)

    def claim(self) -> Episode:
        if not self._replay:
            self._sim.session.begin(self)
        try:
            return super().claim()
        except BridgeError as exc:
            if self._sim.inline:  # no bridge to replace: the worker's own sim refused
                raise EpisodeError(f"cannot claim an episode: {exc}") from None
            # The bridge died or is broken: ask the pool for a replacement once, then retry.
            self._sim._connect(replace_pid=self._sim.address.pid if self._sim.address else None)
            self.control, self.address, self.contract = self._sim.control, self._sim.address, self._sim.contract
            try:
                return super().claim()
            except BridgeError as exc2:
                raise EpisodeError(f"cannot claim a slot: {exc2} (first attempt: {exc})") from None




def _model_threads() -> int | None:
    """This worker's share of the cores for an in-process model (None: leave torch's default)."""
    if "OMP_NUM_THREADS" in os.environ:
        return None  # the user decided
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if workers <= 1:
        return None
    return max(1, (os.cpu_count() or 1) // workers)
