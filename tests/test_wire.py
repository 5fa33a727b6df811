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


# ------------------------------------------------ the flat-frame fast path writes the same bytes
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

from pytest_hud.wire import _encode  # noqa: E402

_DTYPES = st.sampled_from(["<f4", ">f4", "<f8", "|u1", "<i8", ">i2", "|b1", "<M8[s]", "<U3"])
_ARRAYS = _DTYPES.flatmap(lambda d: hnp.arrays(np.dtype(d), hnp.array_shapes(min_dims=0, max_dims=3, max_side=5)))
_VALUES = st.one_of(
    _ARRAYS,
    _ARRAYS.map(lambda a: a.T),  # non-contiguous (Fortran-ordered) views
    _ARRAYS.map(lambda a: a[::2] if a.ndim else a),
    st.sampled_from([np.float32(0.25), np.int64(-3), np.bool_(True), np.uint8(7), np.float64("nan")]),
    st.booleans(), st.none(), st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=40),
    st.binary(max_size=8), st.lists(st.integers(0, 3), max_size=3),
)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.text(max_size=300), _VALUES, max_size=20))
def test_flat_frames_encode_exactly_as_the_general_path(frame):
    assert packb(frame) == msgpack.packb(frame, default=_encode)


def test_large_frames_use_the_long_headers_exactly_as_msgpack_does():
    frame = {f"k{i}": np.arange(i * 700, dtype=np.uint8) for i in range(18)}  # >15 keys, bin16, bin32
    frame["image"] = np.zeros((224, 224, 3), np.uint8)
    assert packb(frame) == msgpack.packb(frame, default=_encode)
    assert np.array_equal(unpackb(packb(frame))["k17"], frame["k17"])


# ------------------------------------- observation frames and action frames on the per-step path
from pytest_hud.wire import pack_frame, unpack_action  # noqa: E402


@settings(max_examples=400, deadline=None)
@given(features=st.dictionaries(st.text(max_size=20), _VALUES, max_size=6),
       reward=st.floats() | st.sampled_from([1e39, -1e39, 3.4028235e38, 1e-46]),
       flags=st.tuples(st.booleans(), st.booleans(), st.booleans()))
def test_observation_frames_are_the_bytes_of_the_general_path(features, reward, flags):
    frame = dict(features)
    with np.errstate(over="ignore"):
        frame["reward"] = np.float32(reward)
        frame["terminated"], frame["truncated"], frame["success"] = flags
        assert pack_frame(features, reward, *flags) == msgpack.packb(frame, default=_encode)


@settings(max_examples=300, deadline=None)
@given(action=_VALUES, trailer=st.binary(max_size=3), cut=st.integers(0, 40))
def test_action_frames_decode_exactly_as_the_general_path(action, trailer, cut):
    """The cached fast path gives what unpackb gives, for the frame seen before and for its variants
    (truncated, with trailing bytes, with another shape): a value or the same WireError."""
    good = packb({"actions": action})
    for data in (good, good, good + trailer, good[: max(0, len(good) - cut)]):
        try:
            want = unpackb(data)
        except WireError as exc:
            with pytest.raises(WireError, match=str(exc)[:20].replace("(", r"\(").replace("[", r"\[")):
                unpack_action(data)
            continue
        got = unpack_action(data)
        assert type(got) is type(want)
        if isinstance(want, dict):
            assert got.keys() == want.keys() and all(type(got[k]) is type(want[k]) for k in want)
        # the same value, NaN and NaT included: the same bytes when encoded again
        assert msgpack.packb(got, default=_encode) == msgpack.packb(want, default=_encode)
