"""Fixtures: ``shared_sim`` and ``robot_agent``, thin handles on the worker's :class:`HudSession`.

Which sim and which policy a test gets comes from :meth:`pytest_hud.core.settings.HudSettings.for_item`:
the ``hud`` marker (closest wins) over the options and ini keys, with ``--hud-policy`` on the
command line beating the marker.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import pytest

from pytest_hud.worker.keys import worker_session

if TYPE_CHECKING:  # imported when used: the plugin imports this module in every pytest process
    from pytest_hud.agent.loop import Agent
    from pytest_hud.client.episode import Episode, EpisodeResult
    from pytest_hud.worker.session import HudSession, SharedSim

__all__ = ["RobotAgent", "shared_sim", "robot_agent", "hud_settings", "item_settings"]


class RobotAgent:
    """The policy harness for one test: ``run(episode)`` / ``await arun(episode)``.

    The model is loaded once per worker, policy spec and rename map; this object carries the test's
    settings (``max_steps`` from ``--hud-max-steps`` or the ``hud`` marker; ``rename`` from
    ``--hud-policy-rename`` merged with the marker's).
    """

    def __init__(self, session: HudSession, policy: str | None, max_steps: int | None,
                 rename: dict[str, str] | None = None, failed_before: bool = False):
        self.session = session
        self.policy = policy
        self.max_steps = max_steps
        self.rename = dict(rename if rename is not None else session.settings.rename)
        #: the test failed when the suite last ran (pytest's cache): a failed episode's video then
        #: renders as it runs instead of from a replay (:meth:`pytest_hud.agent.loop.Agent.run`)
        self.failed_before = failed_before

    def agent_for(self, episode: Episode) -> Agent:
        from pytest_hud.client.episode import EpisodeError

        if not self.policy:
            raise EpisodeError(
                "no policy: pass --hud-policy (module:factory, a LeRobot checkpoint directory or a "
                "ws:// policy server), set hud_policy in the ini file, or mark the test "
                "@pytest.mark.hud(policy=...)"
            )
        return self.session.agent(self.policy, episode.contract, self.rename)

    def run(self, episode: Episode, max_steps: int | None = None) -> EpisodeResult:
        """Run ``episode`` to its end (claiming it first if needed) and return its result."""
        agent = self.agent_for(episode)  # load the model before claiming: warm-up holds no slot
        steps = max_steps if max_steps is not None else self.max_steps
        return agent.run(episode, steps, failed_before=self.failed_before)  # (it claims an unclaimed one)

    async def arun(self, episode: Episode, max_steps: int | None = None) -> EpisodeResult:
        """asyncio version of :meth:`run`."""
        agent = await asyncio.to_thread(self.agent_for, episode)
        steps = max_steps if max_steps is not None else self.max_steps
        return await agent.arun(episode, steps, failed_before=self.failed_before)  # (it claims an unclaimed one)

    @property
    def model(self) -> Any:
        """The loaded model of the last contract used (None before the first episode)."""
        for (policy, *_), agent in self.session.agents.items():
            if policy == self.policy:
                return agent.model
        return None


# (how many markers the item itself had; its hud markers' merged keywords; the settings they
# made, and of which run settings)
_ITEM_SETTINGS = pytest.StashKey[tuple]()


def _marked(item: pytest.Item) -> tuple:
    """The entry of ``item``'s stash for its ``hud`` markers: the fixtures, the declaration and the
    report each ask per episode, so they are merged once, and again only when the item got a
    marker since (``request.node.add_marker`` in a fixture, say)."""
    own = len(item.own_markers)
    entry = item.stash.get(_ITEM_SETTINGS, None)
    if entry is None or entry[0] != own:
        merged: dict[str, Any] = {}
        for mark in reversed(list(item.iter_markers("hud"))):
            merged.update(mark.kwargs)
        entry = item.stash[_ITEM_SETTINGS] = (own, merged, None, None)
    return entry


def hud_settings(item: pytest.Item) -> dict[str, Any]:
    """The ``hud`` marker's keyword arguments for ``item``, closest marker winning."""
    return dict(_marked(item)[1])


def item_settings(item: pytest.Item, session: HudSession):
    """The run's settings for ``item`` (its ``hud`` markers applied)."""
    own, merged, run, settings = _marked(item)
    if run is not session.settings:
        run, settings = session.settings, session.settings.for_item(merged)
        item.stash[_ITEM_SETTINGS] = (own, merged, run, settings)
    return settings


_LAST_FAILED = pytest.StashKey[frozenset]()


def failed_last_run(config: pytest.Config) -> frozenset[str]:
    """The node ids of the tests that failed when this suite last ran: pytest's own record
    (``cache/lastfailed``, read once per process); empty without the cache plugin or a last run."""
    failed = config.stash.get(_LAST_FAILED, None)
    if failed is None:
        cache = getattr(config, "cache", None)
        try:
            failed = frozenset(cache.get("cache/lastfailed", {}) or {}) if cache is not None else frozenset()
        except (TypeError, ValueError):  # a hand-edited cache file: no record
            failed = frozenset()
        config.stash[_LAST_FAILED] = failed
    return failed


def _session(request: pytest.FixtureRequest) -> HudSession:
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
    settings = item_settings(request.node, session)
    return session.sim(settings.sim, settings.build)


@pytest.fixture
def robot_agent(request: pytest.FixtureRequest) -> RobotAgent:
    """The policy harness: ``robot_agent.run(shared_sim.episode(seed=s))`` returns the result.

    The policy comes from ``--hud-policy`` on the command line, else ``@pytest.mark.hud(policy=...)``,
    else the ``hud_policy`` ini key;
    ``max_steps`` from the marker or ``--hud-max-steps``; ``rename`` (observation key -> a LeRobot
    checkpoint's input feature) from ``--hud-policy-rename`` merged with ``@pytest.mark.hud(rename={...})``.
    The model loads once per worker.
    """
    from pytest_hud.core.settings import rename_problem

    session = _session(request)
    settings = item_settings(request.node, session)
    problem = rename_problem(hud_settings(request.node).get("rename"))
    if problem:
        raise pytest.UsageError(problem)
    return RobotAgent(session, settings.policy, settings.max_steps, settings.rename,
                      failed_before=request.node.nodeid in failed_last_run(request.config))
