"""The openpi/0 codec reproduces openpi-client's bytes exactly and refuses what cannot travel."""

import json
from pathlib import Path

import msgpack
import numpy as np
import pytest

from pytest_hud.wire import MAX_FRAME_BYTES, WireError, packb, unpackb

VECTORS = Path(__file__).parent / "data" / "wire-vectors"
MANIFEST = json.loads((VECTORS / "manifest.json").read_text())


def build(spec):
    """Turn a manifest value description into the Python/numpy value it describes."""
    (kind, body), = spec.items()
    if kind == "plain":
        return body
    if kind == "list":
        return [build(v) for v in body]
    if kind == "map":
        return {k: build(v) for k, v in body.items()}
    if kind == "ndarray":
        return np.array(body["values"], dtype=body["dtype"]).reshape(body["shape"])
    if kind == "npgeneric":
        return np.dtype(body["dtype"]).type(body["value"])
    raise AssertionError(kind)


def assert_same(a, b):
    assert type(a) is type(b), (a, b)
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same(a[k], b[k])
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    else:
        assert a == b and (not isinstance(a, np.generic) or a.dtype == b.dtype)


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_golden_vector_encodes_byte_for_byte(name):
    entry = MANIFEST[name]
    golden = (VECTORS / entry["file"]).read_bytes()
    assert len(golden) == entry["bytes"]
    assert packb(build(entry["value"])) == golden


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_golden_vector_decodes_to_the_described_value(name):
    entry = MANIFEST[name]
    assert_same(unpackb((VECTORS / entry["file"]).read_bytes()), build(entry["value"]))


def test_decoded_arrays_are_read_only_views():
    arr = unpackb(packb({"a": np.arange(4, dtype=np.float32)}))["a"]
    with pytest.raises(ValueError):
        arr[0] = 1.0


@pytest.mark.parametrize("bad", [np.array([1 + 2j]), np.array([object()], dtype=object),
                                 np.zeros(2, dtype=[("x", "f4")]), np.complex64(1j)])
def test_object_void_and_complex_dtypes_are_refused_on_encode(bad):
    with pytest.raises(WireError, match="cannot travel"):
        packb({"x": bad})


@pytest.mark.parametrize("dtype", ["|O", "|V8", "<c8"])
def test_object_void_and_complex_dtypes_are_refused_on_decode(dtype):
    frame = msgpack.packb({"x": {b"__ndarray__": True, b"data": b"\0" * 8, b"dtype": dtype, b"shape": [1]}})
    with pytest.raises(WireError, match="cannot travel"):
        unpackb(frame)


def test_truncated_and_inconsistent_frames_raise_wire_errors():
    good = packb({"a": np.arange(3, dtype=np.int64)})
    with pytest.raises(WireError):
        unpackb(good[:-5])
    lying = msgpack.packb({"x": {b"__ndarray__": True, b"data": b"\0" * 7, b"dtype": "<f4", b"shape": [2]}})
    with pytest.raises(WireError, match="needs 8 bytes"):
        unpackb(lying)


def test_oversized_frames_are_refused():
    with pytest.raises(WireError, match="exceeds"):
        unpackb(b"\0" * (MAX_FRAME_BYTES + 1))
