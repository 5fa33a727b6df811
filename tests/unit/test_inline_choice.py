"""``--hud-inline=auto``'s rule for sims the bridge did not time: a camera-less sim of separate envs
runs in the workers; a sim with cameras, one a worker cannot run alone, an explicit layout, a
remote bridge and a batching policy server keep the shared bridge (no bridge is asked: nothing
here needs a round trip)."""

from __future__ import annotations

import pytest

from pytest_hud.client.bridge import BridgeAddress
from pytest_hud.controller.bridges import BridgeSpec
from pytest_hud.controller.inline import inline_choice

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
