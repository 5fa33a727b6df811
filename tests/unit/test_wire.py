"""The openpi/0 codec reproduces openpi-client's bytes exactly and refuses what cannot travel."""

import json
from pathlib import Path

import msgpack
import numpy as np
import pytest

from pytest_hud.wire.codec import MAX_FRAME_BYTES, WireError, packb, unpackb

VECTORS = Path(__file__).parents[1] / "data" / "wire-vectors"
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

from pytest_hud.wire.codec import _encode  # noqa: E402

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
from pytest_hud.wire.codec import pack_frame, unpack_action  # noqa: E402


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


from pytest_hud.wire.codec import FrameLayout, pack_action  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(action=_VALUES)
def test_action_frames_are_the_bytes_of_the_general_path(action):
    try:
        want = packb({"actions": np.asarray(action)})
    except WireError as exc:  # e.g. None: an object array
        with pytest.raises(WireError) as raised:
            pack_action(action)
        assert str(raised.value) == str(exc)
        return
    assert pack_action(action) == want == msgpack.packb({"actions": np.asarray(action)}, default=_encode)


def _same(got, want):
    assert type(got) is dict and list(got) == list(want)
    for key in want:
        assert type(got[key]) is type(want[key]), key
        if isinstance(want[key], np.ndarray):
            assert got[key].dtype == want[key].dtype and got[key].shape == want[key].shape
            assert not got[key].flags.writeable  # read-only, as unpackb's are
    # the same values, NaN included: the same bytes when encoded again
    assert msgpack.packb(got, default=_encode) == msgpack.packb(want, default=_encode)


_LAID_OUT = st.one_of(  # the values a layout carries: their encoded length never changes
    st.sampled_from(["<f4", ">f4", "<f8", "|u1", "<i8", ">i2", "|b1"]).flatmap(
        lambda d: hnp.arrays(np.dtype(d), hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))),
    st.booleans(), st.none(), st.floats(), st.sampled_from([np.float32(0.25), np.float64("nan")]),
)


@settings(max_examples=400, deadline=None)
@given(features=st.dictionaries(st.text(max_size=20), _VALUES, max_size=6),
       laid_out=st.dictionaries(st.text(max_size=20), _LAID_OUT, max_size=6),
       reward=st.floats(width=32), flags=st.tuples(st.booleans(), st.booleans(), st.booleans()),
       flip=st.integers(0, 10**6), trailer=st.binary(min_size=1, max_size=3))
def test_a_learned_frame_layout_reads_frames_exactly_as_unpackb(features, laid_out, reward, flags, flip, trailer):
    """Whatever a layout reads is what unpackb gives; frames it cannot read give None, never a wrong
    value: the next step's frame, one with a byte changed anywhere, one cut short or too long."""
    for frame_features in (features, laid_out):
        first = pack_frame(frame_features, reward, *flags)
        layout = FrameLayout.learn(first, unpackb(first))
        if frame_features is laid_out and _OUTCOME_KEYS.isdisjoint(laid_out):
            assert layout is not None  # every value has a fixed length: the per-step path applies
        if layout is None:
            continue
        later = {k: (v[::-1].copy() if isinstance(v, np.ndarray) and v.ndim else v) for k, v in frame_features.items()}
        changed = bytearray(first)
        changed[flip % len(first)] ^= 0x5A
        variants = [first, pack_frame(later, -reward, *[not f for f in flags]), bytes(changed),
                    first[:-1], first + trailer, first.decode("latin-1")]
        for data in variants:
            with np.errstate(over="ignore"):
                got = layout.read(data)
            if got is None:
                continue
            with np.errstate(over="ignore"):  # a changed byte may make a float32 out of range, in both
                want = unpackb(data)
            _same(got, want)


_OUTCOME_KEYS = frozenset({"reward", "terminated", "truncated", "success"})


def test_the_slot_client_reads_observation_frames_with_their_layout():
    from pytest_hud.client.protocol import BridgeError, ObservationReader

    read = ObservationReader()
    frames = [pack_frame({"state": np.full(3, i, np.float32)}, float(i), i == 2, False, False) for i in range(3)]
    assert [float(read(f)["reward"]) for f in frames] == [0.0, 1.0, 2.0]
    assert read.layout is not None and read(frames[2])["terminated"] is True
    other = packb({"state": np.zeros(4, np.float32), "reward": np.float32(1), "terminated": False})
    assert read(other)["state"].shape == (4,)  # another layout: read the usual way, then learned
    assert read.layout.read(other) is not None
    with pytest.raises(BridgeError, match="expected a map"):
        read(packb([1, 2]))
    for _ in range(10):  # frames with no layout (an int's length varies): tried a few times, then not
        assert read(packb({"step": 7, "state": np.zeros(1)}))["step"] == 7
    assert read.misses == 8


from pytest_hud.wire.codec import rows_packer  # noqa: E402

_BATCHES = st.integers(1, 4).flatmap(lambda n: st.dictionaries(
    st.text(max_size=20),
    st.sampled_from(["<f4", ">f4", "<f8", "|u1", "<i8", "|b1", "<U3"]).flatmap(
        lambda d: hnp.arrays(np.dtype(d), st.tuples(st.just(n), *[st.integers(0, 4)] * 2).map(tuple)))
    | hnp.arrays(np.float32, (n, 3)).map(lambda a: np.asfortranarray(np.stack([a, a], 2))[:, :, 0]),
    max_size=5))


@settings(max_examples=300, deadline=None)
@given(batch=_BATCHES, reward=st.floats(width=32), flags=st.tuples(st.booleans(), st.booleans(), st.booleans()))
def test_a_ticks_frames_packed_from_the_batch_are_the_bytes_of_pack_frame(batch, reward, flags):
    """Each slot's frame, packed from the step's batch arrays, equals ``pack_frame`` of its row: for
    numeric batches (the fast path, its layout cached across ticks) and anything else (strings,
    a non-contiguous batch, a feature named like an outcome key)."""
    n = len(next(iter(batch.values()))) if batch else 1
    for _ in range(2):  # the second time from the cached layout
        pack = rows_packer(batch)
        for i in range(n):
            want = pack_frame({k: v[i] for k, v in batch.items()}, reward, *flags)
            assert pack(i, reward, *flags) == want


def test_batches_the_fast_path_cannot_take_are_packed_row_by_row_the_same():
    rows = np.arange(12, dtype=np.float32).reshape(2, 6)
    for batch in ({"reward": rows},  # a feature named like an outcome key
                  {"state": rows[:, ::2]},  # a non-contiguous batch
                  {"name": np.array(["a", "b"])},  # strings
                  {"big": np.zeros((2, 300, 300), np.uint8)}):  # rows over the join limit
        pack = rows_packer(batch)
        for i in range(2):
            assert pack(i, 1.0, False, True, False) == pack_frame({k: v[i] for k, v in batch.items()}, 1.0, False, True, False)
