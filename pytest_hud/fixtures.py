"""Fixtures: ``shared_sim`` and ``robot_agent``, and the worker-side session behind them.

Each worker (or the single process under ``-n 0``) holds one :class:`HudSession`: its link to the
controller's pool, one :class:`SharedSim` per (sim target, build args) and one model per policy
spec, all reused for every episode the worker runs.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Mapping
from typing import Any

import pytest

from .agent.loop import Agent
from .agent.model import PolicyError, load_policy, policy_kind
from .client import BridgeAddress, BridgeError, ControlClient
from .contract import Contract
from .episode import Episode, EpisodeError, EpisodeResult
from .rpc import RpcClient, RpcError

__all__ = ["HudSession", "SharedSim", "RobotAgent", "shared_sim", "robot_agent", "hud_settings"]

EPISODES_KEY = pytest.StashKey[list]()


class HudSession:
    """A worker's view of the run: pool connection, bridges, policies and settings."""

    def __init__(self, pool_host: str | None, pool_port: int | None, secret: str, worker: int,
                 settings: Mapping[str, Any], rendezvous: str | None = None):
        self.pool_host, self.pool_port, self.secret = pool_host, pool_port, secret
        self.rendezvous = rendezvous  # where the controller writes the pool's address when started lazily
        self.pending_declare: dict[str, Any] | None = None  # sent with the first call to the pool
        self.worker = worker
        self.settings = dict(settings)
        self._pool: RpcClient | None = None
        self._lock = threading.Lock()
        self.sims: dict[tuple[str, str], SharedSim] = {}
        self.agents: dict[tuple[str, str], Agent] = {}
        self.current_item: pytest.Item | None = None
        self.policy_hashes: dict[str | None, str | None] = {}  # content hash per policy spec (resume identity)
        self._recorders: list[Any] | None = None

    @property
    def recorders(self) -> list[Any]:
        """This worker's video and trace recorders (created on first use, shared by all agents)."""
        if self._recorders is None:
            self._recorders = []
            if self.settings.get("video", "none") != "none" and self.settings.get("video_dir"):
                from .report.video import VideoRecorder

                self._recorders.append(VideoRecorder(self.settings["video_dir"], self.settings["video"]))
            if self.settings.get("trace_dir"):
                from .report.trace import TraceRecorder

                self._recorders.append(TraceRecorder(self.settings["trace_dir"]))
            if self.settings.get("record"):
                from .record import DatasetRecorder

                worker = f"gw{self.worker}" if self.settings.get("distributed") else "main"
                self._recorders.append(DatasetRecorder(self.settings["record"], worker_id=worker))
        return self._recorders

    def close_recorders(self, timeout: float = 120.0) -> None:
        """Finish pending videos and commit dataset parts (idempotent)."""
        for recorder in self._recorders or []:
            close = getattr(recorder, "close", None)
            if callable(close):
                close(timeout)
        self._recorders = []

    def label_recorders(self, task: str, episode: str) -> None:
        for recorder in self.recorders:
            recorder.label_next(task, episode)

    def flush_recorders(self, timeout: float = 60.0) -> dict[str, str]:
        """Wait for pending video encodes; the artefacts of the last episode (for errored ones)."""
        artefacts: dict[str, str] = {}
        for recorder in self._recorders or []:
            flush = getattr(recorder, "flush", None)
            if callable(flush):
                flush(timeout)
            artefacts.update(getattr(recorder, "last_artefacts", None) or {})
        return artefacts

    def _pool_address(self) -> tuple[str, int]:
        """The pool's address; in a lazily started run, wait for the controller to write it."""
        if self.pool_port is None:
            import time
            from pathlib import Path

            path = Path(self.rendezvous or "") / "pool.json"
            deadline = time.monotonic() + float(self.settings.get("boot_timeout") or 120)
            while not path.is_file():
                if time.monotonic() > deadline:
                    raise EpisodeError(f"the pytest-hud controller did not start its pool ({path} never appeared)")
                time.sleep(0.02)
            data = json.loads(path.read_text())
            self.pool_host, self.pool_port = data["host"], int(data["port"])
        return str(self.pool_host), int(self.pool_port)

    @property
    def pool(self) -> RpcClient:
        if self._pool is None:
            self.pool_host, self.pool_port = self._pool_address()
            self._pool = RpcClient(self.pool_host, self.pool_port, self.secret,
                                   timeout=float(self.settings.get("boot_timeout", 120)) + 30, what="pytest-hud pool")
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

    def agent(self, policy: str, contract: Contract) -> Agent:
        key = (policy, json.dumps(contract.to_dict(), sort_keys=True))
        agent = self.agents.get(key)
        if agent is None:
            spec = policy
            if self.settings.get("policy_server") and policy_kind(policy) != "openpi":
                # One model copy for the whole run, batched across workers: this worker loads none.
                try:
                    spec = self.pool_call("policy_server", spec=policy, contract=contract.to_dict())
                except RpcError as exc:
                    raise EpisodeError(f"no policy server for {policy!r}: {exc.message}") from None
            try:
                model = load_policy(spec, contract, n_action_steps=self.settings.get("n_action_steps"),
                                    timeout=float(self.settings.get("first_action_timeout") or 300),
                                    threads=_model_threads())
            except PolicyError as exc:
                raise EpisodeError(str(exc)) from None
            agent = Agent(
                model,
                observers=self.recorders,
                n_action_steps=self.settings.get("n_action_steps"),
                recv_timeout=float(self.settings.get("first_action_timeout", 300))
                + float(self.settings.get("step_timeout", 30)) + 30,
                first_action_timeout=float(self.settings.get("first_action_timeout") or 300),
                step_timeout=float(self.settings.get("step_timeout") or 30),
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
        self._control: ControlClient | None = None
        self._contract: Contract | None = None
        self._connect()

    def _connect(self, replace_pid: int | None = None) -> None:
        try:
            reply = self.session.pool_call("bridge", target=self.target, build=self.build,
                                           worker=self.session.worker, replace_pid=replace_pid)
        except RpcError as exc:
            raise EpisodeError(f"no bridge for sim {self.target!r}: {exc.message}") from None
        self.address = BridgeAddress.from_dict(reply)
        if self._control is not None:
            self._control.close()
        self._control = ControlClient(self.address, timeout=30.0)
        self._contract = self._control.contract()

    @property
    def control(self) -> ControlClient:
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

    def __init__(self, sim: SharedSim, **task: Any) -> None:
        self._sim = sim
        super().__init__(sim.control, sim.contract, **task)

    def claim(self) -> Episode:
        self._sim.session.begin(self)
        try:
            return super().claim()
        except BridgeError as exc:
            # The bridge died or is broken: ask the pool for a replacement once, then retry.
            self._sim._connect(replace_pid=self._sim.address.pid if self._sim.address else None)
            self.control, self.address, self.contract = self._sim.control, self._sim.address, self._sim.contract
            try:
                return super().claim()
            except BridgeError as exc2:
                raise EpisodeError(f"cannot claim a slot: {exc2} (first attempt: {exc})") from None


class RobotAgent:
    """The policy harness for one test: ``run(episode)`` / ``await arun(episode)``.

    The model is loaded once per worker and policy spec; this object carries the test's settings
    (``max_steps`` from ``--hud-max-steps`` or the ``hud`` marker).
    """

    def __init__(self, session: HudSession, policy: str | None, max_steps: int | None):
        self.session = session
        self.policy = policy
        self.max_steps = max_steps

    def agent_for(self, episode: Episode) -> Agent:
        if not self.policy:
            raise EpisodeError(
                "no policy: pass --hud-policy (module:factory, a LeRobot checkpoint directory or a "
                "ws:// policy server), set hud_policy in the ini file, or mark the test "
                "@pytest.mark.hud(policy=...)"
            )
        return self.session.agent(self.policy, episode.contract)

    def run(self, episode: Episode, max_steps: int | None = None) -> EpisodeResult:
        """Run ``episode`` to its end (claiming it first if needed) and return its result."""
        agent = self.agent_for(episode)  # load the model before claiming: warm-up holds no slot
        if episode.token is None and episode.grade_data is None:
            with episode:
                return agent.run(episode, max_steps if max_steps is not None else self.max_steps)
        return agent.run(episode, max_steps if max_steps is not None else self.max_steps)

    async def arun(self, episode: Episode, max_steps: int | None = None) -> EpisodeResult:
        """asyncio version of :meth:`run`."""
        agent = await asyncio.to_thread(self.agent_for, episode)
        if episode.token is None and episode.grade_data is None:
            async with episode:
                return await agent.arun(episode, max_steps if max_steps is not None else self.max_steps)
        return await agent.arun(episode, max_steps if max_steps is not None else self.max_steps)

    @property
    def model(self) -> Any:
        """The loaded model of the last contract used (None before the first episode)."""
        for (policy, _), agent in self.session.agents.items():
            if policy == self.policy:
                return agent.model
        return None


def _model_threads() -> int | None:
    """This worker's share of the cores for an in-process model (None: leave torch's default)."""
    if "OMP_NUM_THREADS" in os.environ:
        return None  # the user decided
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if workers <= 1:
        return None
    return max(1, (os.cpu_count() or 1) // workers)


def hud_settings(item: pytest.Item) -> dict[str, Any]:
    """The ``hud`` marker's keyword arguments for ``item``, closest marker winning."""
    merged: dict[str, Any] = {}
    for mark in reversed(list(item.iter_markers("hud"))):
        merged.update(mark.kwargs)
    return merged


def _session(request: pytest.FixtureRequest) -> HudSession:
    from .plugin import worker_session

    session = worker_session(request.config)
    if session is None:
        raise pytest.UsageError("pytest-hud is not active in this process (was it disabled with -p no:hud?)")
    return session


@pytest.fixture
def shared_sim(request: pytest.FixtureRequest) -> SharedSim:
    """This worker's handle on the shared simulator bridge for the test's sim.

    The sim comes from ``@pytest.mark.hud(sim=..., build={...})``, ``--hud-sim`` or the
    ``hud_sim`` ini key. ``shared_sim.episode(seed=s)`` claims a slot for one episode;
    ``shared_sim.contract`` describes observations and actions.
    """
    session = _session(request)
    marks = hud_settings(request.node)
    return session.sim(marks.get("sim") or session.settings.get("sim"), marks.get("build"))


@pytest.fixture
def robot_agent(request: pytest.FixtureRequest) -> RobotAgent:
    """The policy harness: ``robot_agent.run(shared_sim.episode(seed=s))`` returns the result.

    The policy comes from ``--hud-policy`` on the command line, else ``@pytest.mark.hud(policy=...)``,
    else the ``hud_policy`` ini key;
    ``max_steps`` from the marker or ``--hud-max-steps``. The model loads once per worker.
    """
    session = _session(request)
    marks = hud_settings(request.node)
    max_steps = marks.get("max_steps", session.settings.get("max_steps"))
    policy = session.settings.get("policy_cli") or marks.get("policy") or session.settings.get("policy")
    return RobotAgent(session, policy,
                      int(max_steps) if max_steps else None)
