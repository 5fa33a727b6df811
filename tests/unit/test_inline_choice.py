"""``--hud-inline=auto``'s rule for sims the bridge did not time: a camera-less sim of separate envs
runs in the workers; a sim with cameras, one a worker cannot run alone, an explicit layout, a
remote bridge and a batching policy server keep the shared bridge (no bridge is asked: nothing
here needs a round trip)."""

from __future__ import annotations

import pytest

from pytest_hud.client.bridge import BridgeAddress
from pytest_hud.controller.bridges import BridgeSpec
from pytest_hud.controller.inline import CACHE_KEY, KnownSims, inline_choice

HERE = BridgeAddress(control=1, ws=2, secret="s")
STATE_ONLY = {"cameras": 0, "slot_envs": True, "vectorization": "native"}


def test_a_camera_less_sim_of_separate_envs_runs_in_the_workers_and_says_why():
    why = inline_choice(BridgeSpec(width=2), "sims:tasks", STATE_ONLY, HERE)
    assert why == ("sims:tasks: --hud-inline=auto: each worker steps its own env, since the sim renders no "
                   "camera: the workers' envs step side by side, without a round trip per step; "
                   "--hud-inline=never keeps the shared bridge")


@pytest.mark.parametrize(("spec", "announce", "address"), [
    (BridgeSpec(width=2), {**STATE_ONLY, "cameras": 1}, HERE),  # it renders: the bridge skips and shares renders
    (BridgeSpec(width=2), {**STATE_ONLY, "slot_envs": False}, HERE),  # natively batched: no one-slot sim
    (BridgeSpec(width=2), {"vectorization": "native"}, HERE),  # an older bridge that says neither
    (BridgeSpec(width=2, inline="never"), STATE_ONLY, HERE),
    (BridgeSpec(width=2, vectorization="sync"), STATE_ONLY, HERE),  # a layout asked for is a bridge asked for
    (BridgeSpec(width=2, tick="ready"), STATE_ONLY, HERE),
    (BridgeSpec(width=2, io_thread=True), STATE_ONLY, HERE),
    (BridgeSpec(width=2, batched_policy=True), STATE_ONLY, HERE),  # the bridge lines episodes up for batches
    (BridgeSpec(width=2), STATE_ONLY, BridgeAddress(control=1, ws=2, secret="s", node="n1")),
], ids=["cameras", "not-separate-envs", "unsaid", "never", "vectorization", "tick", "io-thread",
        "batched-policy", "remote"])
def test_the_shared_bridge_is_kept(spec, announce, address):
    assert inline_choice(spec, "sims:tasks", announce, address) is None


class _Cache(dict):
    """pytest's cache, as far as KnownSims uses it."""

    def get(self, key, default):
        return super().get(key, default)

    def set(self, key, value):
        self[key] = value


@pytest.mark.parametrize("saved", [None, ["not", "a", "dict"], {"camera_less": "x"}, {"camera_less": [["a"]]}])
def test_a_cache_entry_this_version_did_not_write_is_ignored(saved):
    known = KnownSims(_Cache({CACHE_KEY: saved}))
    assert known.earlier == set()


def test_what_this_runs_bridges_found_replaces_what_earlier_runs_found():
    cache = _Cache({CACHE_KEY: {"camera_less": [["a", "{}"], ["b", "{}"]], "bridges": 0}})
    known = KnownSims(cache)
    assert known.earlier == {("a", "{}"), ("b", "{}")} and known.last_bridges == 0
    known.forget(("a", "{}"))  # a worker found a camera: its bridge then says so
    known.learned(("a", "{}"), {"cameras": 1, "slot_envs": True})
    known.learned(("c", "{}"), {**STATE_ONLY})
    known.save()
    assert cache[CACHE_KEY] == {"camera_less": [["b", "{}"], ["c", "{}"]], "bridges": 2}


def test_a_bridge_that_only_timed_a_sim_the_workers_step_is_not_counted_for_the_next_run():
    cache = _Cache()
    known = KnownSims(cache)  # a first run: nothing known, so the standby bridge starts
    known.learned(("cartpole", "{}"), {**STATE_ONLY}, kept=False)  # timed, then stopped: inline
    known.save()
    again = KnownSims(cache)
    assert again.earlier == {("cartpole", "{}")} and again.last_bridges == 0  # no standby next time
    again.learned(("pusht", "{}"), {"cameras": 1, "slot_envs": True})  # a bridge that serves episodes
    again.save()
    assert KnownSims(cache).last_bridges == 1
