"""Drills: hostile frames on both channels of a live bridge, and who may talk to it (DESIGN §4, §5, §9).

Each fuzz test keeps one bridge subprocess for all of its cases, with a well-behaved *peer* episode
live on one slot. After every generated case: the bridge is still running, the peer completes a
step (and its observation counts exactly its own steps, so no hostile tick leaked into it), no slot
is left claimed, and the hostile input got a clear answer: a JSON-RPC error object on the control
channel, a text frame followed by a close with a reason on the WebSocket. Every wait is bounded
(about 2 s), so a hang fails the case instead of the CI job.

Hypothesis runs derandomized (same cases in every run) with no example database; the number of
cases run per channel is printed and recorded as a JUnit property (``fuzz_cases``).
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

pytestmark = pytest.mark.timeout(180)

CASES = 1000
WAIT = 2.0  # client-side bound on every answer: a hang fails the case, never the job
FUZZ = settings(
    max_examples=CASES,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
PEER_SEED = 7
WIDTH = 3  # the peer, the case's own slot, and one spare for floods

LONG_SIM = f"""
import sys
sys.path.insert(0, {str(SIMKIT.parent)!r})
from simkit import CounterSim

def long(num_envs):
    return CounterSim(num_envs, length=10**9)  # the peer's episode never ends during a drill
"""


# ------------------------------------------------------------------ fixtures
@dataclass
class Peer:
    """A well-behaved episode on the same bridge: it must keep stepping whatever the fuzz does."""

    address: BridgeAddress
    control: ControlClient = field(init=False)
    slot: SlotClient = field(init=False)
    steps: int = 0
    token: str = ""

    def __post_init__(self) -> None:
        self.control = ControlClient(self.address, timeout=WAIT)
        claim = self.control.claim(seed=PEER_SEED, wait=WAIT)
        self.token = claim.token
        self.slot = SlotClient(self.address, claim.token, connect_timeout=WAIT, recv_timeout=WAIT)
        assert list(self.slot.first_observation["state"]) == [PEER_SEED, 0]

    def step(self) -> None:
        frame = self.slot.step(np.zeros(1, np.float32))
        self.steps += 1
        # CounterSim's state is [seed, steps since reset]: a tick taken without the peer's action,
        # or a reset of the wrong slot, shows here.
        assert list(frame["state"]) == [PEER_SEED, self.steps], frame

    def close(self) -> None:
        self.slot.close()
        self.control.close()


@dataclass
class Target:
    process: Any
    address: BridgeAddress
    peer: Peer
    contract: Contract

    def assert_healthy(self) -> None:
        """The bridge is up, the peer completes a step, and only the peer's slot is taken."""
        assert self.process.poll() is None, f"the bridge died (exit code {self.process.returncode})"
        self.peer.step()
        deadline = time.monotonic() + WAIT
        while True:
            slots = self.peer.control.stats()["slots"]
            taken = [s for s in slots if s["state"] != "free"]
            if len(taken) == 1:
                return
            assert time.monotonic() < deadline, f"slots not freed after the case: {slots}"
            time.sleep(0.002)


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory):
    """Factory for long-lived bridges of this module: ``sims(width) -> Target``; all stopped after."""
    root = tmp_path_factory.mktemp("fuzz")
    (root / "longsim.py").write_text(LONG_SIM)
    started: list[Target] = []

    def make(width: int = WIDTH) -> Target:
        process, address = start_bridge(root, f"{root / 'longsim.py'}:long", width)
        peer = Peer(address)
        target = Target(process, address, peer, peer.control.contract())
        started.append(target)
        return target

    yield make
    for target in started:
        target.peer.close()
        target.process.terminate()
        try:
            target.process.wait(5)
        except Exception:  # noqa: BLE001
            target.process.kill()


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


# ==================================================================== control channel
KNOWN = ("contract", "reset", "result", "release", "stats")
SENTINEL = "sentinel-5f1e"
# Token and secret references, resolved against the live bridge when a case runs.
REFS = ("$fresh", "$peer", "$released", "$foreign", "$secret")

odd_text = st.text(st.characters(codec="utf-8") | st.characters(categories=["Cs"]), max_size=8)
json_scalars = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=10) | odd_text | st.sampled_from(REFS)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
ids = (st.integers(-(2**70), 2**70) | st.text(max_size=6) | st.none() | st.floats(allow_nan=False)
       | st.booleans() | st.lists(st.integers(), max_size=2))
param_names = st.sampled_from(
    ["token", "seed", "options", "prompt", "build", "secret", "wait", "conn", "self"])
params = st.dictionaries(param_names | st.text(max_size=6), json_values, max_size=3)
methods = st.sampled_from(KNOWN + ("hello",)) | st.text(max_size=10) | json_scalars


@st.composite
def requests(draw) -> dict:
    """Request-shaped objects: mostly right, with one or more fields wrong."""
    req: dict[str, Any] = {}
    if draw(st.integers(0, 9)):
        req["jsonrpc"] = "2.0"
    elif draw(st.booleans()):
        req["jsonrpc"] = draw(json_scalars)
    if draw(st.integers(0, 4)):
        req["id"] = draw(st.integers(1, 10**6)) if draw(st.booleans()) else draw(ids)
    if draw(st.integers(0, 9)):
        known = draw(st.integers(0, 3))
        req["method"] = draw(st.sampled_from(KNOWN + ("hello",))) if known else draw(methods)
    shape = draw(st.integers(0, 5))
    if shape == 0:
        pass
    elif shape == 1:
        req["params"] = draw(json_values)
    else:
        req["params"] = draw(params)
    return req


def _deep(depth: int, opener: str) -> str:
    if opener == "[":
        return "[" * depth + "]" * depth
    return '{"a": ' * depth + "1" + "}" * depth


@dataclass
class CtlCase:
    kind: str  # line | huge | flood
    line: Any = b""  # bytes, or a request dict whose "$ref" strings are resolved first
    authed: bool = True
    n: int = 0
    close_early: bool = False

    def __repr__(self) -> str:  # a 100,000-deep line must not flood the failure report
        return (f"CtlCase({self.kind!r}, {reprlib.repr(self.line)}, authed={self.authed}, n={self.n}, "
                f"close_early={self.close_early})")


authed = st.integers(0, 3).map(bool)  # mostly after hello; a quarter are calls before it
ctl_cases = st.one_of(
    st.builds(CtlCase, st.just("line"), requests(), authed),
    st.builds(CtlCase, st.just("line"), requests(), authed),
    st.builds(CtlCase, st.just("line"), st.binary(max_size=80).map(lambda b: b.replace(b"\n", b"")), authed),
    st.builds(CtlCase, st.just("line"), json_values.map(lambda v: json.dumps(v).encode()), authed),
    st.builds(CtlCase, st.just("line"), st.builds(_deep, st.sampled_from([3, 100, 5000, 100_000]),
                                                  st.sampled_from("[{")).map(str.encode), authed),
    st.builds(CtlCase, st.just("line"), st.builds(
        lambda n, method: json.dumps({"jsonrpc": "2.0", "id": 1, "method": method,
                                      "params": {"prompt": "x" * n}}).encode(),
        st.integers(0, 2_000_000), st.sampled_from(["stats", "reset"]))),
    st.builds(CtlCase, st.just("huge"), n=st.integers(1, 4096)),
    st.builds(CtlCase, st.just("flood"), n=st.integers(2, 30), close_early=st.booleans()),
)


@dataclass
class Expect:
    reply: str  # "none": no answer; "error": a JSON-RPC error; "answer": a result or an error
    codes: frozenset = frozenset()
    id: Any = None
    closes: bool = False
    check_id: bool = False


INVALID_PARAMS, APP_ERROR = -32602, -32000


def expect_control(line: bytes, authed: bool, secret: str) -> Expect:
    """What JSON-RPC 2.0 plus DESIGN §5 promise for one line (the oracle, written from the spec)."""
    if not line.strip():
        return Expect("none")
    try:
        req = json.loads(line)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return Expect("error", frozenset({-32700}))
    if not isinstance(req, dict) or req.get("jsonrpc") != "2.0" or not isinstance(req.get("method"), str):
        return Expect("error", frozenset({-32600}))
    id_ = req.get("id")
    if isinstance(id_, bool) or not (id_ is None or isinstance(id_, (int, str))):
        return Expect("error", frozenset({-32600}))
    p = req.get("params", {})
    p = {} if p is None else p
    if not isinstance(p, dict):
        return Expect("error", frozenset({INVALID_PARAMS}), id_, check_id=True)
    if req["method"] == "hello":
        if p.get("secret") == secret:
            return Expect("answer", frozenset(), id_, check_id=True)
        return Expect("error", frozenset({-32001}), id_, closes=True, check_id=True)
    if not authed:
        return Expect("error", frozenset({-32001}), id_, closes=True, check_id=True)
    if req["method"] not in KNOWN:
        return Expect("error", frozenset({-32601}), id_, check_id=True)
    if id_ is None:
        return Expect("none")  # a notification: run, never answered
    return Expect("answer", frozenset({INVALID_PARAMS, APP_ERROR}), id_, check_id=True)


class Conn:
    """A raw control connection: bytes in, JSON replies out, every read bounded."""

    def __init__(self, address: BridgeAddress, hello: bool) -> None:
        self.sock = socket.create_connection((address.host, address.control), timeout=WAIT)
        self.file = self.sock.makefile("rb")
        if hello:
            self.send_obj({"jsonrpc": "2.0", "id": "hello", "method": "hello",
                           "params": {"secret": address.secret}})
            assert "result" in self.read()

    def send(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError:
            pass  # closed on us: what it answered first is still readable

    def send_obj(self, obj: dict) -> None:
        self.send(json.dumps(obj).encode() + b"\n")

    def read(self) -> dict | None:
        """The next reply, or None once the bridge closed the connection."""
        try:
            line = self.file.readline(MAX_FRAME_BYTES + 1024)
        except TimeoutError:
            raise AssertionError(f"the bridge sent nothing for {WAIT} s") from None
        except ConnectionResetError:
            return None
        if not line:
            return None
        reply = json.loads(line)
        assert reply.get("jsonrpc") == "2.0" and ("result" in reply) != ("error" in reply), reply
        if "error" in reply:
            err = reply["error"]
            assert isinstance(err.get("code"), int) and isinstance(err.get("message"), str), reply
            assert err["message"].strip(), reply
        return reply

    def close(self) -> None:
        self.file.close()
        self.sock.close()


class CtlFuzz:
    """Runs one case against a live bridge; ``other`` is a bridge of "another run" (foreign tokens)."""

    def __init__(self, target: Target, other: Target) -> None:
        self.t = target
        self.foreign = other.peer.token
        self.count = 0
        self.tally: Counter[str] = Counter()

    def resolve(self, value: Any, conn: Conn, made: dict[str, str]) -> Any:
        """``value`` with its "$ref" strings replaced; each ref is minted once per case (``made``),
        so a case holds at most one extra slot and a good reset in it never waits for one."""
        if isinstance(value, dict):
            return {k: self.resolve(v, conn, made) for k, v in value.items()}
        if isinstance(value, list):
            return [self.resolve(v, conn, made) for v in value]
        if value in ("$fresh", "$released") and value not in made:
            made[value] = token = self._claim(conn)
            if value == "$released":
                conn.send_obj({"jsonrpc": "2.0", "id": "rel", "method": "release",
                               "params": {"token": token}})
                assert "result" in conn.read()
        fixed = {"$peer": self.t.peer.token, "$foreign": self.foreign, "$secret": self.t.address.secret}
        return {**fixed, **made}.get(value, value) if isinstance(value, str) else value

    def _claim(self, conn: Conn) -> str:
        conn.send_obj({"jsonrpc": "2.0", "id": "claim", "method": "reset", "params": {"seed": 1}})
        reply = conn.read()
        assert reply is not None and "result" in reply, reply
        return reply["result"]["token"]

    def run(self, case: CtlCase) -> None:
        self.count += 1
        if case.kind == "huge":
            self._huge(case.n)
        elif case.kind == "flood":
            self._flood(case.n, case.close_early)
        else:
            self._line(case)
        self.t.assert_healthy()

    def _line(self, case: CtlCase) -> None:
        conn = Conn(self.t.address, hello=case.authed)
        lender = None
        try:
            line = case.line
            if isinstance(line, dict):
                # refs need an authenticated connection to mint tokens; another one lends them
                lender = Conn(self.t.address, hello=True) if not case.authed else conn
                line = json.dumps(self.resolve(line, lender, {})).encode()
            expected = expect_control(line, case.authed, self.t.address.secret)
            conn.send(line + b"\n")
            # a sentinel after the case: hello (correct) on a fresh connection, stats once authenticated
            authed_after = case.authed or (expected.reply == "answer" and not expected.closes)
            sentinel = {"jsonrpc": "2.0", "id": SENTINEL, "method": "stats" if authed_after else "hello",
                        "params": {} if authed_after else {"secret": self.t.address.secret}}
            conn.send_obj(sentinel)
            replies = []
            while True:
                reply = conn.read()
                if reply is None or reply.get("id") == SENTINEL:
                    break
                replies.append(reply)
            self.tally[f"{expected.reply}{' (closes)' if expected.closes else ''}"] += 1
            if expected.closes:
                assert reply is None, f"the bridge kept a connection open after {line[:200]!r}: {reply}"
            else:
                assert reply is not None and "result" in reply, f"no sentinel after {line[:200]!r}: {reply}"
            if expected.reply == "none":
                assert replies == [], f"{line[:200]!r} was answered: {replies}"
                return
            assert len(replies) == 1, f"{line[:200]!r}: expected one reply, got {replies}"
            (got,) = replies
            if expected.check_id:
                assert got["id"] == expected.id, (line[:200], got)
            if expected.reply == "error":
                assert "error" in got and got["error"]["code"] in expected.codes, (line[:200], expected, got)
            elif "error" in got:
                assert got["error"]["code"] in expected.codes, (line[:200], expected, got)
            self.tally["answered with a result" if "result" in got else "answered with an error"] += 1
        finally:
            conn.close()
            if lender is not None and lender is not conn:
                lender.close()

    def _huge(self, extra: int) -> None:
        """A line over the 16 MiB limit: an error naming the limit, then the connection closes."""
        conn = Conn(self.t.address, hello=True)
        try:
            big = b"a" * (MAX_FRAME_BYTES + extra)
            payload = b'{"jsonrpc": "2.0", "id": 1, "method": "stats", "params": {"x": "' + big + b'"}}\n'
            sender = threading.Thread(target=conn.send, args=(payload,))
            sender.start()
            reply = conn.read()
            sender.join(WAIT * 5)
            assert reply is not None and reply["error"]["code"] == -32600, reply
            assert "exceeds" in reply["error"]["message"], reply
            assert conn.read() is None
            self.tally["huge line"] += 1
        finally:
            conn.close()

    def _flood(self, n: int, close_early: bool) -> None:
        """n reset calls at once on one connection: each is answered as slots are released, or all
        of them are dropped with the connection."""
        conn = Conn(self.t.address, hello=True)
        try:
            conn.send(b"".join(
                json.dumps({"jsonrpc": "2.0", "id": i, "method": "reset", "params": {"seed": i}}).encode()
                + b"\n" for i in range(n)
            ))
            tokens: set[str] = set()
            while len(tokens) < n:
                reply = conn.read()
                assert reply is not None and "result" in reply, reply
                if isinstance(reply["id"], int):
                    tokens.add(reply["result"]["token"])
                    if close_early:
                        break
                    conn.send_obj({"jsonrpc": "2.0", "id": f"release-{len(tokens)}", "method": "release",
                                   "params": {"token": reply["result"]["token"]}})
            self.tally["flood"] += 1
        finally:
            conn.close()


@pytest.fixture(scope="module")
def ctl_fuzz(sims) -> CtlFuzz:
    return CtlFuzz(sims(WIDTH), sims(1))


SURROGATE_SECRET = b'{"jsonrpc": "2.0", "id": 1, "method": "hello", "params": {"secret": "\\ud800"}}'


@FUZZ
@given(case=ctl_cases)
@example(case=CtlCase("line", _deep(100_000, "[").encode()))
@example(case=CtlCase("line", SURROGATE_SECRET, False))
@example(case=CtlCase("line", {"jsonrpc": "2.0", "id": 1, "method": "reset", "params": {}}, False))
@example(case=CtlCase("line", {"jsonrpc": "2.0", "id": 1, "method": "result",
                               "params": {"token": "$released"}}))
@example(case=CtlCase("line", {"jsonrpc": "2.0", "id": 1, "method": "result",
                               "params": {"token": "$foreign"}}))
@example(case=CtlCase("line", {"jsonrpc": "2.0", "id": 1, "method": "release", "params": {"token": "$peer"}}))
@example(case=CtlCase("line", {"jsonrpc": "2.0", "id": 1, "method": "reset",
                               "params": {"prompt": "$fresh", "options": {"a": "$fresh"}}}))
@example(case=CtlCase("huge", n=1))
@example(case=CtlCase("flood", n=30))
@example(case=CtlCase("flood", n=30, close_early=True))
def _ctl_case(ctl_fuzz: CtlFuzz, case: CtlCase) -> None:
    ctl_fuzz.run(case)


def test_hostile_control_calls_get_json_rpc_errors_and_never_stall_a_peer(ctl_fuzz, record_property):
    started = time.monotonic()
    _ctl_case(ctl_fuzz)
    elapsed = time.monotonic() - started
    print(f"\ncontrol fuzz: {ctl_fuzz.count} cases in {elapsed:.1f} s ({dict(ctl_fuzz.tally)}); "
          f"peer stepped {ctl_fuzz.t.peer.steps} times")
    record_property("fuzz_cases", ctl_fuzz.count)
    record_property("fuzz_channel", "control")
    assert ctl_fuzz.count >= CASES
    assert len(ctl_fuzz.tally) == 8 and min(ctl_fuzz.tally.values()) >= 5, ctl_fuzz.tally  # all paths ran


# ============================================================================ access
@pytest.fixture(scope="module")
def two_runs(sims) -> tuple[Target, Target]:
    """Two bridges with their own secrets, as two pytest runs on one machine would have."""
    return sims(2), sims(2)


def _hello(address: BridgeAddress, params: dict | None) -> tuple[dict | None, dict | None]:
    """Send one first call; return (its reply, what came next: None when the bridge closed)."""
    conn = Conn(address, hello=False)
    try:
        if params is None:
            conn.send_obj({"jsonrpc": "2.0", "id": 1, "method": "stats", "params": {}})
        else:
            conn.send_obj({"jsonrpc": "2.0", "id": 1, "method": "hello", "params": params})
        reply = conn.read()
        conn.send_obj({"jsonrpc": "2.0", "id": 2, "method": "stats", "params": {}})
        return reply, conn.read()
    finally:
        conn.close()


@pytest.mark.parametrize("params", [
    None,  # no hello at all
    {},
    {"secret": None},
    {"secret": ""},
    {"secret": 12345},
    {"secret": ["$secret"]},
    {"secret": "$other"},  # the other run's secret
    {"secret": "$secret[:-1]"},
    {"secret": "$secret+0"},
    {"secret": "$one-off"},
], ids=["no-hello", "no-params", "null", "empty", "number", "list", "other-run", "prefix", "longer",
        "one-char-off"])
def test_the_control_channel_refuses_a_wrong_or_missing_secret(two_runs, params):
    run_a, run_b = two_runs
    secret = run_a.address.secret
    forged = {"$secret": secret, "$other": run_b.address.secret, "$secret[:-1]": secret[:-1],
              "$secret+0": secret + "0", "$one-off": ("1" if secret[0] == "0" else "0") + secret[1:]}
    if params is not None:
        params = {k: ([forged.get(x, x) for x in v] if isinstance(v, list) else forged.get(v, v))
                  for k, v in params.items()}
    reply, after = _hello(run_a.address, params)
    assert reply["error"]["code"] == -32001, reply
    assert "secret" in reply["error"]["message"] or "hello" in reply["error"]["message"]
    assert after is None, f"the connection stayed open after a refused first call: {after}"
    ok, more = _hello(run_a.address, {"secret": secret})
    assert ok["result"]["width"] == 2 and "result" in more  # the right secret still works


def test_tokens_from_another_run_released_or_graded_tokens_are_refused(two_runs):
    run_a, run_b = two_runs
    with ControlClient(run_a.address) as a, ControlClient(run_b.address) as b:
        from_b = b.reset(seed=1, wait=WAIT).token
        released = a.reset(seed=2, wait=WAIT).token
        a.release(released)
        graded = a.reset(seed=3, wait=WAIT).token
        a.result(graded)
        for token, why in [(from_b, "another run"), (released, "released"), (graded, "graded")]:
            with pytest.raises(BridgeError, match="unknown or released token"):
                SlotClient(run_a.address, token, connect_timeout=WAIT, recv_timeout=WAIT)
            with pytest.raises(BridgeError, match="unknown or released token"):
                a.result(token)
            with pytest.raises(BridgeError, match="unknown or released token"):
                a.release(token)
        # a live token of this run, used from another connection of the same run, is refused too
        mine = a.reset(seed=4, wait=WAIT).token
        with ControlClient(run_a.address) as other:
            with pytest.raises(BridgeError, match="minted on another connection"):
                other.result(mine)
        a.release(mine)
        b.release(from_b)
    run_a.assert_healthy()
    run_b.assert_healthy()


def _listening(pid: int) -> list[tuple[str, int]]:
    return [(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN]


def test_bridges_and_the_pool_listen_on_loopback_only_by_default(tmp_path):
    from pytest_hud.controller.pool import BridgeSpec, SimPool
    from pytest_hud.controller.pool_service import PoolService

    process, address = start_bridge(tmp_path, f"{SIMKIT}:counter", 1)
    try:
        announce = next(tmp_path.glob("bridge-*.json"))
        assert announce.stat().st_mode & 0o777 == 0o600  # it holds the secret
        assert address.host == "127.0.0.1"
        assert sorted(_listening(process.pid)) == sorted([("127.0.0.1", address.control),
                                                          ("127.0.0.1", address.ws)])
    finally:
        process.terminate()
        process.wait(10)
    pool = SimPool("s" * 32, BridgeSpec(width=1))
    service = PoolService(pool, "s" * 32)
    try:
        spawned = pool.bridge_for(f"{SIMKIT}:counter", {})
        assert spawned.host == "127.0.0.1"
        assert sorted(_listening(spawned.pid)) == sorted([("127.0.0.1", spawned.control),
                                                          ("127.0.0.1", spawned.ws)])
        assert ("127.0.0.1", service.port) in _listening(os.getpid())
        assert all(ip == "127.0.0.1" for ip, port in _listening(os.getpid()) if port == service.port)
    finally:
        service.close()
        pool.stop_all()
    assert not pool.workdir.exists()  # the announce files (with the secret) went with it


# ----------------------------------------------------------- no unpickling on input paths
UNSAFE_MODULES = {"pickle", "_pickle", "cPickle", "dill", "cloudpickle", "shelve", "marshal", "jsonpickle",
                  "joblib"}
UNSAFE_YAML = {"load", "load_all", "unsafe_load", "unsafe_load_all", "full_load", "full_load_all"}
SAFE_LOADERS = {"SafeLoader", "CSafeLoader", "BaseLoader", "CBaseLoader"}


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def _kw(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def unsafe_deserialisation(source: str) -> list[str]:
    """Every way ``source`` could unpickle or build arbitrary objects from input, by its syntax tree."""
    tree = ast.parse(source)
    aliases: dict[str, str] = {}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                if a.name.split(".")[0] in UNSAFE_MODULES:
                    found.append(f"line {node.lineno}: import {a.name}")
        elif isinstance(node, ast.ImportFrom):
            mod = (node.module or "").split(".")[0]
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            if mod in UNSAFE_MODULES:
                found.append(f"line {node.lineno}: from {node.module} import ...")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func, aliases)
        head, _, last = name.rpartition(".")
        if head.split(".")[0] == "yaml" and last in UNSAFE_YAML:
            loader = _kw(node, "Loader") or (node.args[1] if len(node.args) > 1 else None)
            if last.startswith(("unsafe", "full")) or loader is None or \
                    _dotted(loader, aliases).rpartition(".")[2] not in SAFE_LOADERS:
                found.append(f"line {node.lineno}: {name}() without a safe Loader")
        if name.split(".")[0] in UNSAFE_MODULES:
            found.append(f"line {node.lineno}: {name}()")
        if last in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant) \
                and str(node.args[0].value).split(".")[0] in UNSAFE_MODULES:
            found.append(f"line {node.lineno}: {name}({node.args[0].value!r})")
        if name in ("numpy.load", "np.load"):
            allow = _kw(node, "allow_pickle")
            if allow is not None and not (isinstance(allow, ast.Constant) and allow.value is False):
                found.append(f"line {node.lineno}: {name}(allow_pickle=...)")
        if name == "torch.load":
            only = _kw(node, "weights_only")
            if not (isinstance(only, ast.Constant) and only.value is True):
                found.append(f"line {node.lineno}: torch.load() without weights_only=True")
        if last == "read_pickle":
            found.append(f"line {node.lineno}: {name}()")
    return found


@pytest.mark.parametrize("snippet", [
    "import pickle", "import cloudpickle as cp", "from pickle import loads", "import yaml\nyaml.load(s)",
    "import yaml\nyaml.load(s, Loader=yaml.Loader)", "import yaml as y\ny.unsafe_load(s)",
    "from yaml import load\nload(s)", "import yaml\nyaml.full_load(s)",
    "import importlib\nimportlib.import_module('pickle')",
    "__import__('dill')", "import numpy as np\nnp.load(p, allow_pickle=True)", "import torch\ntorch.load(p)",
    "import pandas as pd\npd.read_pickle(p)",
])
def test_the_unpickling_check_catches_each_unsafe_form(snippet):
    assert unsafe_deserialisation(snippet), snippet


@pytest.mark.parametrize("snippet", [
    "import yaml\nyaml.safe_load(s)", "import yaml\nyaml.load(s, Loader=yaml.SafeLoader)",
    "import numpy as np\nnp.load(p)", "import numpy as np\nnp.load(p, allow_pickle=False)",
    "import torch\ntorch.load(p, weights_only=True)", "import json\njson.loads(s)",
])
def test_the_unpickling_check_passes_safe_forms(snippet):
    assert unsafe_deserialisation(snippet) == []


def test_no_pickle_or_unsafe_yaml_anywhere_in_the_package():
    package = Path(__file__).parents[2] / "pytest_hud"
    files = sorted(package.rglob("*.py"))
    assert len(files) > 20
    found = {str(p.relative_to(package)): hits for p in files
             if (hits := unsafe_deserialisation(p.read_text(encoding="utf-8")))}
    assert found == {}
