"""The control channel's JSON-RPC core and the frame readers, with plain function calls (no sockets)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosedError
from websockets.frames import Close

from pytest_hud.client.protocol import (
    BridgeError, Claim, action_frame, claim_frame, closed_error, read_claim, read_frame, send_error,
)
from pytest_hud.wire.jsonrpc import (
    INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR, InvalidRequest, RpcClientProtocol, RpcError,
    encode_error, encode_result, parse_request,
)
from pytest_hud.wire.codec import NotAMapError, TextFrameError, WireError, packb, unpack_map, unpackb


def reply(id_, result=None, error=None) -> bytes:
    body = {"jsonrpc": "2.0", "id": id_}
    body.update({"error": error} if error is not None else {"result": result})
    return (json.dumps(body) + "\n").encode()


def greeted(what: str = "bridge") -> RpcClientProtocol:
    calls = RpcClientProtocol(what)
    id_, _ = calls.request("hello", {"secret": "s"})
    calls.receive(reply(id_, {}))
    return calls


# ------------------------------------------------------------- client: requests
def test_requests_get_increasing_unique_ids_and_one_line_each():
    calls = RpcClientProtocol()
    lines = [calls.request("hello", {"secret": "s"}), calls.request("stats", {}), calls.request("stats", {})]
    assert [id_ for id_, _ in lines] == [1, 2, 3]
    for id_, data in lines:
        assert data.endswith(b"\n") and data.count(b"\n") == 1
        assert json.loads(data)["id"] == id_ and json.loads(data)["jsonrpc"] == "2.0"


def test_request_bytes_are_the_documented_wire_format():
    _, data = RpcClientProtocol().request("hello", {"secret": "abc"})
    assert data == b'{"jsonrpc": "2.0", "id": 1, "method": "hello", "params": {"secret": "abc"}}\n'


def test_the_first_call_must_be_hello():
    calls = RpcClientProtocol("bridge")
    with pytest.raises(RpcError, match=r"call hello\(secret\) before reset\(\) on a connection to bridge"):
        calls.request("reset", {"seed": 1})
    assert calls.pending == set()
    calls.request("hello", {"secret": "s"})
    calls.request("reset", {"seed": 1})  # allowed once hello has been sent


def test_params_that_are_not_json_leave_nothing_pending():
    calls = greeted()
    with pytest.raises(TypeError):
        calls.request("reset", {"seed": object()})
    assert calls.pending == set()


# -------------------------------------------------------------- client: replies
def test_a_reply_is_matched_to_its_request_by_id_out_of_order():
    calls = greeted()
    a, _ = calls.request("stats", {})
    b, _ = calls.request("contract", {})
    id_, r = calls.receive(reply(b, "second"))
    assert id_ == b and calls.outcome(r) == "second"
    id_, r = calls.receive(reply(a, "first"))
    assert id_ == a and calls.outcome(r) == "first"
    assert calls.pending == set()


def test_a_late_reply_to_a_forgotten_request_is_skipped():
    calls = greeted()
    stale, _ = calls.request("reset", {})
    calls.forget(stale)  # it timed out
    fresh, _ = calls.request("stats", {})
    assert calls.receive(reply(stale, "too late")) is None
    assert calls.receive(reply(fresh, {"ok": 1})) == (fresh, {"jsonrpc": "2.0", "id": fresh, "result": {"ok": 1}})


@pytest.mark.parametrize("odd_id", [99, "1", True, [1], 1.5])
def test_a_reply_with_an_unknown_or_odd_id_answers_nothing(odd_id):
    calls = greeted()
    calls.request("stats", {})
    assert calls.receive(reply(odd_id, 0)) is None
    assert len(calls.pending) == 1


def test_a_reply_without_id_answers_the_only_pending_request():
    calls = greeted()
    id_, _ = calls.request("stats", {})
    matched = calls.receive(encode_error(None, PARSE_ERROR, "frame is not JSON"))
    assert matched is not None and matched[0] == id_
    with pytest.raises(RpcError, match="frame is not JSON") as info:
        calls.outcome(matched[1])
    assert info.value.code == PARSE_ERROR


def test_a_reply_without_id_is_ambiguous_with_two_requests_pending():
    calls = greeted()
    calls.request("stats", {})
    calls.request("stats", {})
    assert calls.receive(encode_error(None, PARSE_ERROR, "frame is not JSON")) is None


def test_an_error_reply_raises_with_the_servers_message_code_and_data():
    calls = greeted()
    id_, _ = calls.request("reset", {})
    _, r = calls.receive(reply(id_, error={"code": -32000, "message": "no free slot", "data": {"width": 2}}))
    with pytest.raises(RpcError) as info:
        calls.outcome(r)
    assert (info.value.message, info.value.code, info.value.data) == ("no free slot", -32000, {"width": 2})


def test_a_null_error_still_raises():
    calls = greeted()
    id_, _ = calls.request("reset", {})
    _, r = calls.receive(b'{"jsonrpc": "2.0", "id": %d, "error": null}\n' % id_)
    with pytest.raises(RpcError, match="^None$") as info:
        calls.outcome(r)
    assert info.value.code is None


def test_an_error_that_is_not_an_object_is_malformed():
    calls = greeted("pool")
    id_, _ = calls.request("stats", {})
    _, r = calls.receive(reply(id_, error="boom"))
    with pytest.raises(RpcError, match="pool sent a malformed error: 'boom'") as info:
        calls.outcome(r)
    assert info.value.code is None


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"", "bridge closed the connection"),
        (b"{not json\n", "bridge sent a frame that is not JSON"),
        (b"[1, 2]\n", "bridge sent a list where a JSON-RPC reply object was due"),
        (b'"hi"\n', "bridge sent a str where a JSON-RPC reply object was due"),
        (b"[" * 100_000 + b"\n", "bridge sent a frame that is not JSON"),
    ],
)
def test_end_of_stream_and_malformed_replies_are_connection_errors(line, message):
    calls = greeted()
    calls.request("stats", {})
    with pytest.raises(RpcError, match=message) as info:
        calls.receive(line)
    assert info.value.code is None  # None: the connection, not the server, failed


def test_a_successful_reply_without_result_is_none():
    calls = greeted()
    id_, _ = calls.request("release", {"token": "t"})
    _, r = calls.receive(b'{"jsonrpc": "2.0", "id": 2}\n')
    assert calls.outcome(r) is None


# ---------------------------------------------------------------- server side
def test_a_well_formed_request_is_read():
    req = parse_request(b'{"jsonrpc": "2.0", "id": 7, "method": "reset", "params": {"seed": 3}}\n')
    assert (req.id, req.method, req.params) == (7, "reset", {"seed": 3})
    assert parse_request(b'{"jsonrpc": "2.0", "method": "stats", "params": null}').params == {}


@pytest.mark.parametrize(
    ("line", "id_", "code", "message"),
    [
        (b"{oops", None, PARSE_ERROR, "frame is not JSON"),
        (b'{"id": 1, "method": "x"}', 1, INVALID_REQUEST, "a request is"),
        (b"[1]", None, INVALID_REQUEST, "a request is"),
        (b'{"jsonrpc": "2.0", "id": true, "method": "x"}', None, INVALID_REQUEST, "id must be a number or a string"),
        (b'{"jsonrpc": "2.0", "id": 4, "method": "x", "params": [1]}', 4, INVALID_PARAMS, "params must be an object"),
    ],
)
def test_a_bad_request_carries_the_error_reply_to_send(line, id_, code, message):
    with pytest.raises(InvalidRequest) as info:
        parse_request(line)
    sent = json.loads(info.value.reply)
    assert sent["id"] == id_ and sent["error"]["code"] == code and message in sent["error"]["message"]


def test_a_result_that_is_not_json_becomes_an_error_reply():
    sent = json.loads(encode_result(3, {"x": object()}))
    assert sent["id"] == 3 and "not JSON-serializable" in sent["error"]["message"]


# --------------------------------------------------------------- frame readers
def test_unpack_map_returns_the_map():
    assert unpack_map(packb({"terminated": True, "x": np.ones(2, np.float32)}))["terminated"] is True


def test_unpack_map_tells_text_frames_non_maps_and_garbage_apart():
    with pytest.raises(TextFrameError) as text:
        unpack_map("slot 3 failed: action of shape (2,)")
    assert text.value.text == "slot 3 failed: action of shape (2,)"
    with pytest.raises(NotAMapError) as not_map:
        unpack_map(packb([1, 2]))
    assert not_map.value.got == "list"
    with pytest.raises(WireError) as garbage:
        unpack_map(b"\xc1")
    assert type(garbage.value) is WireError


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("slot 0: the sim raised", "^slot 0: the sim raised$"),  # the bridge's words, unprefixed
        (packb([1]), "^bridge sent a list as observation, expected a map$"),
        (packb(3), "^bridge sent a int as observation, expected a map$"),
        (b"\xc1", "^bridge sent an undecodable observation: frame is not valid msgpack"),
    ],
)
def test_read_frame_words_each_failure_for_the_worker(raw, message):
    with pytest.raises(BridgeError, match=message):
        read_frame(raw, "observation")


def test_claim_and_action_frames_are_openpi_maps():
    assert unpackb(claim_frame("tok")) == {"claim": "tok"}
    assert unpackb(claim_frame(None)) == {"claim": None}
    sent = unpackb(action_frame([0.5, -1.0]))["actions"]
    assert sent.tolist() == [0.5, -1.0]


def test_read_claim_reads_reset_replies_and_names_a_malformed_one():
    assert read_claim({"token": "t", "slot": "2", "prompt": None}) == Claim("t", 2, None)
    for bad in ({"slot": 1}, {"token": "t", "slot": "x"}, ["t", 1], None):
        with pytest.raises(BridgeError, match=r"answered reset\(\) with .* expected a map with token, slot"):
            read_claim(bad)


def test_a_closed_slot_connection_reports_the_close_reason_or_its_buffered_error_frame():
    closed = ConnectionClosedError(Close(1011, "sim crashed"), None)
    assert str(closed_error(closed)) == (
        "bridge closed the slot connection without an error frame (code 1011: sim crashed)"
    )
    silent = ConnectionClosedError(None, None)
    assert str(closed_error(silent)) == "bridge closed the slot connection without an error frame"
    assert str(send_error(silent, "slot 1 sent an action of shape (3,)")) == "slot 1 sent an action of shape (3,)"
    assert str(send_error(silent, None)) == str(closed_error(silent))
    assert str(send_error(silent, b"\x80")) == str(closed_error(silent))  # binary is not an error frame


def test_a_peer_that_resets_the_connection_reads_as_closed_not_as_a_bare_errno():
    """A killed bridge resets its control connection: the worker's error says the bridge went away."""
    import socket
    import struct
    import threading

    from pytest_hud.wire.rpc import RpcClient

    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = server.accept()
        stream = conn.makefile("rb")
        hello = json.loads(stream.readline())
        conn.sendall(json.dumps({"jsonrpc": "2.0", "id": hello["id"], "result": {}}).encode() + b"\n")
        stream.readline()  # the next call: answer it with a reset (as a SIGKILLed process's kernel does)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    client = RpcClient("127.0.0.1", server.getsockname()[1], "secret", timeout=10, what="bridge")
    with pytest.raises(RpcError, match=r"bridge closed the connection during stats\(\)"):
        client.call("stats")
    thread.join(5)
    server.close()
