"""Drills: hostile calls on a live bridge's control channel (DESIGN §5, §9).

One bridge subprocess serves every generated case, with a well-behaved *peer* episode live on one
slot (``tests/fuzzkit.py``). After every case: the bridge is still running, the peer completes a
step (its observation counts exactly its own steps, so no hostile tick leaked into it), no slot is
left claimed, and the hostile input got a clear answer: a JSON-RPC error object. Every wait is bounded (about 2 s), so a hang fails the case instead of the CI job.
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

from fuzzkit import CASES, FUZZ, PEER_SEED, WAIT, WIDTH, Conn, Peer, Target, sims  # noqa: F401 - sims: the module's bridges (a fixture)

pytestmark = pytest.mark.timeout(180)

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
