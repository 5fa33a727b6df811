"""Drills: hostile frames on a live bridge's slot WebSocket (DESIGN §4, §5).

One bridge subprocess serves every generated case, with a well-behaved *peer* episode live on one
slot (``tests/fuzzkit.py``). After every case: the bridge is still running, the peer completes a
step (its observation counts exactly its own steps, so no hostile tick leaked into it), no slot is
left claimed, and the hostile frame got a clear answer: a text frame followed by a close with a
reason. Every wait is bounded (about 2 s), so a hang fails the case instead of the CI job.
Hypothesis runs derandomized with no example database; the number of cases run is printed and
recorded as a JUnit property (``fuzz_cases``).
"""

from __future__ import annotations

import ast
import json
import os
import reprlib
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import psutil
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from conftest import SIMKIT, start_bridge
from pytest_hud.client.bridge import BridgeAddress, BridgeError, ControlClient, SlotClient
from pytest_hud.core.contract import Contract
from pytest_hud.wire.codec import MAX_FRAME_BYTES, WireError, packb, unpackb

from fuzzkit import CASES, FUZZ, PEER_SEED, WAIT, WIDTH, Peer, Target, sims  # noqa: F401 - sims: the module's bridges (a fixture)

pytestmark = pytest.mark.timeout(180)

# ====================================================================== WebSocket
# Claim-stage token references, resolved at run time against the live bridge.
TOKEN_REFS = ("fresh", "fresh", "fresh", "none", "peer", "released", "foreign", "random", "replayed")
CLAIM_REFUSALS = {"peer": "already in use", "released": "unknown or released token",
                  "foreign": "unknown or released token", "random": "unknown or released token"}

scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.binary(max_size=12)
)
msgpack_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8) | st.binary(max_size=8) | st.integers(-5, 5), inner, max_size=4),
    max_leaves=12,
)
DTYPES = ["<f4", "<f8", "<f2", ">f4", "|u1", "<i8", "<i4", "|b1", "float32", "|O", "O", "|V8", "<c8", "<c16",
          "<U3", "|S4", "<M8[s]", "<m8[s]", "f4,f4", "(2,)f4", "bogus", "", "V0", "S2147483647"]
hand_ndarray = st.fixed_dictionaries(
    {},
    optional={
        b"__ndarray__": st.just(True) | scalars,
        b"data": st.binary(max_size=40) | scalars,
        b"dtype": st.sampled_from(DTYPES) | st.sampled_from(DTYPES).map(str.encode) | st.text(max_size=6),
        b"shape": st.lists(st.integers(-3, 2**62) | scalars, max_size=4) | scalars,
    },
).map(lambda d: {b"__ndarray__": True, **d})
hand_generic = st.fixed_dictionaries(
    {b"__npgeneric__": st.just(True)},
    optional={b"data": scalars, b"dtype": st.sampled_from(DTYPES) | st.text(max_size=6)},
)
real_arrays = hnp.arrays(
    dtype=st.sampled_from([np.float32, np.float64, np.float16, np.int64, np.int8, np.uint8, np.bool_]),
    shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3),
)


def _object_array_frame(kind: str) -> bytes:
    """Refused dtypes encoded by hand, as a hostile peer would (our packb refuses to)."""
    data = {"O": b"\x80\x04N.", "V": b"\x00" * 8, "c": b"\x00" * 8}[kind]
    dtype = {"O": "|O", "V": "|V8", "c": "<c8"}[kind]
    return msgpack.packb({"actions": {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": [1]}})


action_values = (
    msgpack_values
    | hand_ndarray
    | hand_generic
    | real_arrays
    | st.lists(st.floats(width=32) | st.integers(-3, 3), max_size=3)
    | st.lists(st.lists(st.floats(width=32), max_size=2), max_size=2)  # ragged lists
)


@st.composite
def action_frames(draw) -> Any:
    """One frame in place of an action: bytes (binary frame) or str (text frame)."""
    kind = draw(st.sampled_from(["action", "action", "action", "extra_keys", "other_map", "garbage",
                                 "truncated", "text", "object_dtype", "claim_again", "oversize"]))
    if kind == "action":
        return packb({"actions": draw(action_values)})
    if kind == "extra_keys":
        extra = draw(st.dictionaries(st.text(max_size=6), scalars, max_size=3))
        return packb({"actions": draw(action_values), **extra})
    if kind == "other_map":
        return msgpack.packb(draw(msgpack_values))
    if kind == "garbage":
        return draw(st.binary(max_size=64))
    if kind == "truncated":
        whole = packb({"actions": draw(real_arrays)})
        return whole[: draw(st.integers(0, max(0, len(whole) - 1)))]
    if kind == "text":
        return draw(st.text(max_size=40) | st.just('{"actions": [0.0]}'))
    if kind == "object_dtype":
        return _object_array_frame(draw(st.sampled_from("OVc")))
    if kind == "claim_again":
        return ("claim", "fresh")
    return ("oversize", draw(st.integers(1, 4096)))


@st.composite
def claim_frames(draw) -> Any:
    """The first frame after the metadata: a claim, or something that is not one."""
    kind = draw(st.sampled_from(["claim", "claim", "claim", "claim_value", "other_map", "garbage", "text",
                                 "truncated", "bytes_key", "flood", "oversize"]))
    if kind == "claim":
        return ("claim", draw(st.sampled_from(TOKEN_REFS)))
    if kind == "claim_value":
        return packb({"claim": draw(msgpack_values)})
    if kind == "bytes_key":
        return msgpack.packb({b"claim": b"x"})
    if kind == "other_map":
        return msgpack.packb(draw(msgpack_values))
    if kind == "garbage":
        return draw(st.binary(max_size=64))
    if kind == "text":
        return draw(st.text(max_size=40))
    if kind == "truncated":
        whole = packb({"claim": "ab" * 16})
        return whole[: draw(st.integers(0, len(whole) - 1))]
    if kind == "flood":
        return ("flood", draw(st.integers(2, 8)))
    return ("oversize", draw(st.integers(1, 4096)))


@dataclass
class WsCase:
    stage: str  # "claim": the frame replaces the claim; "action": it replaces an action
    frame: Any
    seed: int = 3  # the case's own claim; its first observation must carry it


# The case's own seed: exact in float32 observations, and it keeps hypothesis from deduplicating
# the few fixed frames (good claims, floods), so they keep interleaving with hostile ones.
seeds = st.integers(0, 2**24)
ws_cases = st.one_of(
    st.builds(WsCase, st.just("claim"), claim_frames(), seeds),
    st.builds(WsCase, st.just("action"), action_frames(), seeds),
)


def _recv_outcome(ws, timeout: float = WAIT) -> tuple:
    """One of ``("binary", bytes)``, ``("text", message, close_code, close_reason)``,
    ``("closed", code, reason)`` or ``("hang",)``."""
    try:
        msg = ws.recv(timeout=timeout)
    except TimeoutError:
        return ("hang",)
    except ConnectionClosed as exc:
        rcvd = exc.rcvd
        return ("closed", rcvd.code if rcvd else None, rcvd.reason if rcvd else "")
    if isinstance(msg, bytes):
        return ("binary", msg)
    try:
        ws.recv(timeout=timeout)
    except ConnectionClosed as exc:
        rcvd = exc.rcvd
        return ("text", msg, rcvd.code if rcvd else None, rcvd.reason if rcvd else "")
    except TimeoutError:
        return ("text", msg, "no close", "")
    return ("text", msg, "more frames", "")


def _assert_refused(outcome: tuple, what: Any) -> None:
    """A clear refusal: a readable text frame then a close with a reason, or a close with a reason."""
    assert outcome[0] != "hang", f"no answer within {WAIT} s to {what!r:.200}"
    assert outcome[0] != "binary", f"bridge accepted {what!r:.200}: {outcome[1][:100]!r}"
    if outcome[0] == "text":
        _, message, code, reason = outcome
        assert message.strip(), f"empty error frame for {what!r:.200}"
        assert code in (1008, 1011), f"after the error frame {message!r} the bridge did not close: {code}"
        assert reason, f"close without a reason after {message!r}"
    else:
        _, code, reason = outcome
        assert code == 1009 and reason, f"closed without an error frame ({code}, {reason!r}): {what!r:.200}"


def _open(target: Target):
    # entered by hand: the socket outlives this function (websockets wants connect() entered)
    ws = ws_connect(target.address.ws_url, open_timeout=WAIT, close_timeout=WAIT, max_size=None,
                    compression=None, ping_interval=None, proxy=None).__enter__()
    meta = unpackb(ws.recv(timeout=WAIT))
    assert meta["claim_required"] is True and meta["width"] == WIDTH
    return ws


def _send(ws, frame: Any) -> None:
    try:
        ws.send(frame)
    except (ConnectionClosed, OSError):
        pass  # the bridge may refuse (and close) before a big frame is all sent: read its answer


def _expected_action_ok(frame: Any, contract: Contract) -> bool:
    """Would the contract take this frame as an action? (The oracle; anything raising is a refusal.)"""
    if not isinstance(frame, bytes):
        return False
    try:
        msg = unpackb(frame)
        if not isinstance(msg, dict) or "actions" not in msg:
            return False
        contract.coerce_action(msg["actions"])
    except Exception:  # noqa: BLE001 - any failure must be a refusal on the bridge too
        return False
    return True


class WsFuzz:
    """Runs one case against a live bridge; ``other`` is a bridge of "another run" (foreign tokens)."""

    def __init__(self, target: Target, other: Target) -> None:
        self.t = target
        self.other = other
        self.control = ControlClient(target.address, timeout=WAIT)
        self.foreign = other.peer.token  # live on the other bridge, unknown here
        self.seed = 0
        self.count = 0
        self.tally: Counter[str] = Counter()  # accepted vs refused, so a vacuous run shows

    def token(self, ref: str, fresh: str) -> Any:
        if ref == "fresh":
            return fresh
        if ref == "none":
            return None  # binds the only claimed, undialed slot: the fresh one
        if ref == "peer":
            return self.t.peer.token  # bound and live: a replay
        if ref == "foreign":
            return self.foreign
        if ref == "random":
            return "0123456789abcdef" * 2
        if ref == "released":
            gone = self.control.claim(seed=2, wait=WAIT).token
            self.control.release(gone)
            return gone
        raise AssertionError(ref)

    def frame_bytes(self, frame: Any, fresh: str) -> Any:
        if isinstance(frame, tuple) and frame[0] == "claim":
            return packb({"claim": self.token(frame[1], fresh)})
        if isinstance(frame, tuple) and frame[0] == "oversize":
            return b"\x00" * (MAX_FRAME_BYTES + frame[1])
        return frame

    def run(self, case: WsCase) -> None:
        self.count += 1
        fresh = self.control.claim(seed=case.seed, wait=WAIT).token
        self.seed = case.seed
        try:
            if case.stage == "claim":
                self._claim_stage(case.frame, fresh)
            else:
                self._action_stage(case.frame, fresh)
        finally:
            try:
                self.control.release(fresh)
            except BridgeError:
                pass
        self.t.assert_healthy()

    def _claim_stage(self, frame: Any, fresh: str) -> None:
        if isinstance(frame, tuple) and frame[0] == "flood":
            return self._flood(frame[1], fresh)
        if frame == ("claim", "replayed"):
            first = _open(self.t)
            first.send(packb({"claim": fresh}))
            assert _recv_outcome(first)[0] == "binary"
            again = _open(self.t)
            again.send(packb({"claim": fresh}))
            outcome = _recv_outcome(again)
            _assert_refused(outcome, "a replayed token")
            assert "already in use" in outcome[1]
            self.tally["claim refused"] += 1
            first.close()
            again.close()
            return
        data = self.frame_bytes(frame, fresh)
        ws = _open(self.t)
        try:
            _send(ws, data)
            outcome = _recv_outcome(ws)
            if isinstance(data, bytes) and self._binds(data, fresh):
                self.tally["claim accepted"] += 1
                assert outcome[0] == "binary", f"a good claim was refused: {outcome}"
                assert list(unpackb(outcome[1])["state"]) == [self.seed, 0]  # the claim's own reset
            else:
                self.tally["claim refused"] += 1
                _assert_refused(outcome, frame)
                why = CLAIM_REFUSALS.get(frame[1]) if isinstance(frame, tuple) else None
                assert why is None or why in outcome[1], (frame, outcome)  # the message names it
        finally:
            ws.close()

    @staticmethod
    def _binds(data: bytes, fresh: str) -> bool:
        try:
            msg = unpackb(data)
        except WireError:
            return False
        return isinstance(msg, dict) and "claim" in msg and msg["claim"] in (fresh, None)

    def _flood(self, n: int, fresh: str) -> None:
        """n sockets race to claim one token: exactly one binds, the others are refused."""
        sockets = [_open(self.t) for _ in range(n)]
        threads = [threading.Thread(target=_send, args=(ws, packb({"claim": fresh}))) for ws in sockets]
        for th in threads:
            th.start()
        for th in threads:
            th.join(WAIT)
        outcomes = [_recv_outcome(ws) for ws in sockets]
        bound = [o for o in outcomes if o[0] == "binary"]
        assert len(bound) == 1, outcomes
        self.tally["claim floods"] += 1
        for o in outcomes:
            if o[0] != "binary":
                _assert_refused(o, "a flood of claims")
        for ws in sockets:
            ws.close()

    def _action_stage(self, frame: Any, fresh: str) -> None:
        ws = _open(self.t)
        try:
            ws.send(packb({"claim": fresh}))
            first = _recv_outcome(ws)
            assert first[0] == "binary", first
            data = self.frame_bytes(frame, fresh)
            _send(ws, data)
            ok = _expected_action_ok(data, self.t.contract)
            self.t.peer.step()  # a good action waits for the peer's; a bad one must not stall it
            outcome = _recv_outcome(ws)
            self.tally["action accepted" if ok else "action refused"] += 1
            if ok:
                assert outcome[0] == "binary", f"a good action {frame!r:.200} was refused: {outcome}"
                assert list(unpackb(outcome[1])["state"]) == [self.seed, 1]
            else:
                _assert_refused(outcome, frame)
        finally:
            ws.close()


@pytest.fixture(scope="module")
def ws_fuzz(sims) -> WsFuzz:
    return WsFuzz(sims(WIDTH), sims(1))


@FUZZ
@given(case=ws_cases)
@example(case=WsCase("action", _object_array_frame("O")))
@example(case=WsCase("action", ("oversize", 1)))
@example(case=WsCase("claim", ("oversize", 1)))
@example(case=WsCase("action", packb({"actions": [[0.0], [0.0, 1.0]]})))
@example(case=WsCase("claim", ("claim", "foreign")))
@example(case=WsCase("claim", ("claim", "released")))
@example(case=WsCase("claim", ("claim", "replayed")))
@example(case=WsCase("claim", ("flood", 8)))
@example(case=WsCase("action", ("claim", "fresh")))
def _ws_case(ws_fuzz: WsFuzz, case: WsCase) -> None:
    ws_fuzz.run(case)


def test_hostile_websocket_frames_get_clear_errors_and_never_stall_a_peer(ws_fuzz, record_property):
    started = time.monotonic()
    _ws_case(ws_fuzz)
    elapsed = time.monotonic() - started
    print(f"\nwebsocket fuzz: {ws_fuzz.count} cases in {elapsed:.1f} s ({dict(ws_fuzz.tally)}); "
          f"peer stepped {ws_fuzz.t.peer.steps} times")
    record_property("fuzz_cases", ws_fuzz.count)
    record_property("fuzz_channel", "websocket")
    assert ws_fuzz.count >= CASES
    assert min(ws_fuzz.tally.values()) >= 10 and len(ws_fuzz.tally) == 5, ws_fuzz.tally  # every path ran
