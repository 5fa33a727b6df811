"""The openpi/0 wire codec: msgpack with numpy arrays and scalars.

Byte-compatible with openpi-client's ``msgpack_numpy`` and the HUD SDK robot stack, so their
clients and ours interoperate. An array travels as a map with *bytes* keys::

    {b"__ndarray__": True, b"data": <raw C-order bytes>, b"dtype": "<f4", b"shape": [..]}

and a numpy scalar as ``{b"__npgeneric__": True, b"data": <item>, b"dtype": "<f4"}``.

Object, void and complex dtypes are refused: decoding must never run code (no pickle), and the
peers we talk to cannot represent them. Decoded arrays are read-only views on the frame's bytes;
copy before mutating.

This module has no asyncio, no gym and no pytest: it is pure and cheap to import.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np

__all__ = [
    "WireError",
    "TextFrameError",
    "NotAMapError",
    "packb",
    "unpackb",
    "unpack_map",
    "pack_frame",
    "rows_packer",
    "pack_action",
    "unpack_action",
    "MAX_FRAME_BYTES",
]

#: Largest frame either side accepts (WebSocket message or control-channel line).
MAX_FRAME_BYTES = 16 * 1024 * 1024

_REFUSED_KINDS = {"O": "object", "V": "void (structured)", "c": "complex"}


class WireError(ValueError):
    """A frame that cannot be encoded or decoded under openpi/0."""


class TextFrameError(WireError):
    """A text frame where a msgpack map was due: under openpi/0 that is the peer's readable error."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


class NotAMapError(WireError):
    """A well-formed frame that is not a map (``got`` names its type, e.g. ``"list"``)."""

    def __init__(self, got: str) -> None:
        super().__init__(f"frame is a {got}, expected a map")
        self.got = got


def _check_dtype(dtype: np.dtype) -> None:
    kind = _REFUSED_KINDS.get(dtype.kind)
    if kind is not None:
        raise WireError(
            f"dtype {dtype.str!r} ({kind}) cannot travel on the openpi/0 wire; "
            "convert it to a numeric or bool array first"
        )


def _encode(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        _check_dtype(obj.dtype)
        return {
            b"__ndarray__": True,
            b"data": np.ascontiguousarray(obj).tobytes(),
            b"dtype": obj.dtype.str,
            b"shape": list(obj.shape),
        }
    if isinstance(obj, np.generic):
        _check_dtype(obj.dtype)
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    raise WireError(f"cannot encode an object of type {type(obj).__name__} on the openpi/0 wire")


def _wire_dtype(name: Any) -> np.dtype:
    """``np.dtype(name)``, checked, and cached: every frame names the same few dtypes."""
    dtype = _DTYPES.get(name) if isinstance(name, str) else None
    if dtype is None:
        dtype = np.dtype(name)
        _check_dtype(dtype)
        if isinstance(name, str) and len(_DTYPES) < 256:
            _DTYPES[name] = dtype
    return dtype


_DTYPES: dict[str, np.dtype] = {}


def _decode(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        try:
            dtype = _wire_dtype(obj[b"dtype"])
            shape = tuple([int(d) for d in obj[b"shape"]])
            data = obj[b"data"]
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise WireError("ndarray 'data' must be bytes")
            if any(d < 0 for d in shape):
                raise WireError(f"ndarray shape {shape} has a negative dimension")
            expected = dtype.itemsize * math.prod(shape)
            if len(data) != expected:
                raise WireError(
                    f"ndarray of dtype {dtype.str} and shape {shape} needs {expected} bytes, "
                    f"frame carries {len(data)}"
                )
            return np.frombuffer(data, dtype=dtype).reshape(shape)
        except WireError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise WireError(f"malformed ndarray in frame: {exc}") from None
    if b"__npgeneric__" in obj:
        try:
            return _wire_dtype(obj[b"dtype"]).type(obj[b"data"])
        except WireError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise WireError(f"malformed numpy scalar in frame: {exc}") from None
    return obj


# ------------------------------------------------------------------ fast path
# Observation and action frames are flat maps of str keys to arrays, numpy scalars and builtins.
# For those, ``packb`` writes msgpack itself from cached pieces (map header, each key, each
# array's header and trailer) and the arrays' own buffers, in one join: no per-array ``tobytes``
# copy and no ``default`` callback per value. The bytes are exactly what
# ``msgpack.packb(obj, default=_encode)`` writes (tests/unit/test_wire.py checks both against each
# other and the golden vectors); anything else takes that general path.

class _NotFlat(Exception):
    pass


_TRUE, _FALSE, _NIL = b"\xc3", b"\xc2", b"\xc0"
_KEYS: dict[str, bytes] = {}
_ARRAYS: dict[tuple[str, tuple[int, ...]], tuple[bytes, bytes]] = {}
_GENERICS: dict[str, tuple[bytes, bytes]] = {}
_CACHE_LIMIT = 512  # distinct keys/headers are few; a runaway producer must not grow them forever
# Frames with a large array (a 224x224 camera) take msgpack's path: a joined frame of a few hundred
# KiB is a fresh allocation above glibc's mmap threshold on every step (page faults: measured 3x
# slower per round trip than msgpack's, whose larger internal buffer raises that threshold). For
# such frames the copies are under 1% of a step's render anyway (benchmarks/bridge_throughput.py).
_JOIN_LIMIT = 64 * 1024


def _float64(value: float) -> bytes:
    """A float as msgpack writes it (``use_single_float=False``): 0xcb and 8 big-endian bytes."""
    return b"\xcb" + _F64.pack(value)


_F64 = struct.Struct(">d")


def _map_header(n: int) -> bytes:
    if n < 16:
        return bytes((0x80 | n,))
    return b"\xde" + n.to_bytes(2, "big") if n < 65536 else b"\xdf" + n.to_bytes(4, "big")


def _bin_header(n: int) -> bytes:
    if n < 256:
        return b"\xc4" + bytes((n,))
    return b"\xc5" + n.to_bytes(2, "big") if n < 65536 else b"\xc6" + n.to_bytes(4, "big")


def _remember(cache: dict, key: Any, value: Any) -> Any:
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = value
    return value


def _packed_key(key: str) -> bytes:
    """A map key as msgpack writes it (cached)."""
    packed = _KEYS.get(key)
    return packed if packed is not None else _remember(_KEYS, key, msgpack.packb(key))


def _array_pieces(arr: np.ndarray) -> tuple[bytes, bytes]:
    """What goes before and after an array's raw bytes (its length is part of the key)."""
    key = (arr.dtype.str, arr.shape)
    pieces = _ARRAYS.get(key)
    if pieces is None:
        _check_dtype(arr.dtype)
        if arr.dtype.kind not in "biuf":
            raise _NotFlat  # e.g. datetime64 or strings: no plain buffer to join; tobytes() path
        head = (b"\x84" + msgpack.packb(b"__ndarray__") + _TRUE + msgpack.packb(b"data")
                + _bin_header(arr.nbytes))
        tail = (msgpack.packb(b"dtype") + msgpack.packb(arr.dtype.str) + msgpack.packb(b"shape")
                + msgpack.packb(list(arr.shape)))
        pieces = _remember(_ARRAYS, key, (head, tail))
    return pieces


def _generic_pieces(value: np.generic) -> tuple[bytes, bytes]:
    key = value.dtype.str
    pieces = _GENERICS.get(key)
    if pieces is None:
        _check_dtype(value.dtype)
        head = b"\x83" + msgpack.packb(b"__npgeneric__") + _TRUE + msgpack.packb(b"data")
        tail = msgpack.packb(b"dtype") + msgpack.packb(key)
        pieces = _remember(_GENERICS, key, (head, tail))
    return pieces


def _pack_flat(obj: dict) -> bytes:
    parts: list[Any] = [_map_header(len(obj))]
    _pack_items(parts, obj)
    return b"".join(parts)


def _pack_items(parts: list[Any], obj: dict) -> None:
    append = parts.append
    for key, value in obj.items():
        if type(key) is not str:
            raise _NotFlat
        append(_packed_key(key))
        kind = type(value)
        if kind is np.ndarray:
            if value.nbytes > _JOIN_LIMIT:
                raise _NotFlat
            head, tail = _array_pieces(value)
            append(head)
            append(value if value.flags.c_contiguous else np.ascontiguousarray(value))
            append(tail)
        elif kind is bool:
            append(_TRUE if value else _FALSE)
        elif value is None:
            append(_NIL)
        elif isinstance(value, float):  # np.float64 is a float too: msgpack writes it as one
            append(_float64(value))
        elif isinstance(value, (int, str, bytes)):
            append(msgpack.packb(value))
        elif isinstance(value, np.generic):
            head, tail = _generic_pieces(value)
            append(head)
            item = value.item()
            append(_float64(item) if type(item) is float else msgpack.packb(item))
            append(tail)
        else:
            raise _NotFlat


# An observation frame ends with the step's outcome, always the same four keys (DESIGN §4): its
# bytes after the reward's value depend only on the three flags, so they are made once.
_OUTCOME = frozenset({"reward", "terminated", "truncated", "success"})
_REWARD_HEAD = msgpack.packb("reward") + b"\x83" + msgpack.packb(b"__npgeneric__") + _TRUE + msgpack.packb(b"data")
_FLAG_TAILS = {
    (d, t, s): (msgpack.packb(b"dtype") + msgpack.packb("<f4") + msgpack.packb("terminated") + (_TRUE if d else _FALSE)
                + msgpack.packb("truncated") + (_TRUE if t else _FALSE) + msgpack.packb("success")
                + (_TRUE if s else _FALSE))
    for d in (False, True) for t in (False, True) for s in (False, True)
}
_F32 = struct.Struct("<f")


def pack_frame(features: dict[str, Any], reward: float, done: bool, truncated: bool, success: bool) -> bytes:
    """One observation frame: ``packb({**features, "reward": np.float32(reward), "terminated": done,
    "truncated": truncated, "success": success})``, byte for byte, with the outcome's bytes cached.

    >>> pack_frame({"state": np.zeros(2, np.float32)}, 0.5, False, False, False) == packb(
    ...     {"state": np.zeros(2, np.float32), "reward": np.float32(0.5), "terminated": False,
    ...      "truncated": False, "success": False})
    True
    """
    value = _reward_value(reward)
    if _OUTCOME.isdisjoint(features):
        parts: list[Any] = [_map_header(len(features) + 4)]
        try:
            _pack_items(parts, features)
        except _NotFlat:
            pass
        else:
            parts.append(_REWARD_HEAD)
            parts.append(_float64(value))
            parts.append(_FLAG_TAILS[bool(done), bool(truncated), bool(success)])
            return b"".join(parts)
    frame = dict(features)
    frame["reward"] = np.float32(reward)
    frame["terminated"], frame["truncated"], frame["success"] = bool(done), bool(truncated), bool(success)
    return packb(frame)


_ACTION_KEY = b"\x81" + msgpack.packb("actions")


def pack_action(action: Any) -> bytes:
    """``packb({"actions": np.asarray(action)})``, byte for byte: the frame a slot sends each step,
    written straight from the array's cached pieces.

    >>> pack_action(np.zeros(2, np.float32)) == packb({"actions": np.zeros(2, np.float32)})
    True
    """
    arr = np.asarray(action)
    if type(arr) is np.ndarray and arr.dtype.kind in "biuf" and arr.nbytes <= _JOIN_LIMIT and arr.flags.c_contiguous:
        head, tail = _array_pieces(arr)
        return b"".join((_ACTION_KEY, head, arr, tail))
    return packb({"actions": arr})


def _reward_value(reward: float) -> float:
    """The reward travels as a float32 numpy scalar, whose msgpack value is that float32 as a double."""
    try:
        return _F32.unpack(_F32.pack(reward))[0]
    except (OverflowError, struct.error, TypeError):  # beyond float32's range: numpy's inf
        return float(np.float32(reward))


_ROWS: dict[tuple, tuple[list[bytes], bytes]] = {}


def rows_packer(batch: dict[str, Any]) -> Callable[[int, float, bool, bool, bool], bytes]:
    """One tick's observation frames: ``rows_packer(batch)(i, reward, done, truncated, success)`` is
    ``pack_frame({k: v[i] for k, v in batch.items()}, reward, done, truncated, success)`` byte for
    byte, with the bytes between the rows' arrays worked out once per batch layout (keys, dtypes,
    row shapes), so a frame is one join of those pieces, the rows' own buffers and the outcome.

    >>> batch = {"state": np.arange(4, dtype=np.float32).reshape(2, 2)}
    >>> rows_packer(batch)(1, 0.5, False, False, True) == pack_frame({"state": batch["state"][1]}, 0.5, False, False, True)
    True
    """
    arrays = list(batch.values())
    if _OUTCOME.isdisjoint(batch) and all(
            type(k) is str and type(v) is np.ndarray and v.ndim >= 1 and v.dtype.kind in "biuf"
            and v.flags.c_contiguous and v.itemsize * math.prod(v.shape[1:]) <= _JOIN_LIMIT
            for k, v in batch.items()):
        layout = tuple((k, v.dtype.str, v.shape[1:]) for k, v in batch.items())
        known = _ROWS.get(layout)
        if known is None:
            consts, before = [], _map_header(len(batch) + 4)
            for k, v in batch.items():
                head, tail = _array_pieces(v[0] if len(v) else np.empty(v.shape[1:], v.dtype))
                consts.append(before + _packed_key(k) + head)
                before = tail
            known = _remember(_ROWS, layout, (consts, before + _REWARD_HEAD))
        consts, last = known
        pairs = list(zip(consts, arrays))

        def pack(i: int, reward: float, done: bool, truncated: bool, success: bool) -> bytes:
            parts: list[Any] = []
            for const, array in pairs:
                parts.append(const)
                parts.append(array[i])
            parts.append(last)
            parts.append(_float64(_reward_value(reward)))
            parts.append(_FLAG_TAILS[bool(done), bool(truncated), bool(success)])
            return b"".join(parts)

        return pack
    keys = list(batch)
    return lambda i, *outcome: pack_frame({k: v[i] for k, v in zip(keys, arrays)}, *outcome)


def packb(obj: Any) -> bytes:
    """Encode ``obj`` (maps, lists, builtins, numpy arrays and scalars) as one openpi/0 frame."""
    if type(obj) is dict:
        try:
            return _pack_flat(obj)
        except _NotFlat:
            pass  # nested or unusual values: the general path below
        except WireError:
            raise
        except (TypeError, ValueError, OverflowError) as exc:
            raise WireError(f"cannot encode frame: {exc}") from None
    try:
        return msgpack.packb(obj, default=_encode)
    except WireError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireError(f"cannot encode frame: {exc}") from None


def unpackb(data: bytes) -> Any:
    """Decode one openpi/0 frame; raises :class:`WireError` on anything malformed."""
    if len(data) > MAX_FRAME_BYTES:
        raise WireError(f"frame of {len(data)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    try:
        return msgpack.unpackb(
            data,
            object_hook=_decode,
            raw=False,
            strict_map_key=False,
        )
    except WireError:
        raise
    except Exception as exc:  # msgpack raises a zoo of types on bad input
        raise WireError(f"frame is not valid msgpack: {type(exc).__name__}: {exc}") from None


# An action frame as openpi/0 peers write it: {"actions": <ndarray map with its keys in this order>}.
# Once one has decoded the slow way, its dtype-and-shape trailer is remembered, and later frames
# with that exact trailer are read by slicing: the same array, without msgpack's object hook.
_ACTION_HEAD = (b"\x81" + msgpack.packb("actions") + b"\x84" + msgpack.packb(b"__ndarray__") + _TRUE
                + msgpack.packb(b"data"))
_ACTION_TAILS: dict[bytes, tuple[np.dtype, tuple[int, ...], int]] = {}


def unpack_action(data: bytes | str) -> Any:
    """:func:`unpackb` for the frame a slot sends each step; the same result, faster for the usual one."""
    if type(data) is bytes and data.startswith(_ACTION_HEAD):
        at = len(_ACTION_HEAD)
        tag = data[at] if len(data) > at + 2 else 0  # a bin header fits (else: the slow path's error)
        if tag == 0xC4:
            n, at = data[at + 1], at + 2
        elif tag == 0xC5:
            n, at = int.from_bytes(data[at + 1:at + 3], "big"), at + 3
        else:
            n = -1
        if n >= 0:
            known = _ACTION_TAILS.get(data[at + n:])
            if known is not None and known[2] == n:
                dtype, shape, _ = known
                return {"actions": np.frombuffer(data, dtype, n // dtype.itemsize, at).reshape(shape)}
    frame = unpackb(data)
    if type(data) is bytes and type(frame) is dict and len(frame) == 1 and data.startswith(_ACTION_HEAD):
        arr = frame.get("actions")
        if type(arr) is np.ndarray and arr.dtype.kind in "biuf" and len(_ACTION_TAILS) < _CACHE_LIMIT:
            tail = _array_pieces(arr)[1]
            if data.endswith(tail) and len(data) == len(_ACTION_HEAD) + len(_bin_header(arr.nbytes)) + arr.nbytes + len(tail):
                _ACTION_TAILS[tail] = (arr.dtype, arr.shape, arr.nbytes)
    return frame


def unpack_map(data: bytes | str) -> dict[str, Any]:
    """Decode one openpi/0 message, which is always a map (metadata, claim, observation, action).

    Raises :class:`TextFrameError` for a text frame (the peer's error, which callers surface as
    is), :class:`NotAMapError` for any other decoded value, and :class:`WireError` for bytes that
    do not decode. Each side words these for its own user.

    >>> unpack_map(packb({"terminated": False}))
    {'terminated': False}
    """
    if isinstance(data, str):
        raise TextFrameError(data)
    frame = unpackb(data)
    if not isinstance(frame, dict):
        raise NotAMapError(type(frame).__name__)
    return frame


# An observation frame from a bridge has the same layout step after step: the same keys, arrays of
# the same dtypes and shapes, the reward's eight bytes and three flags; only those values change.
# A layout learned from one frame decoded the slow way reads the next frames by checking their
# constant bytes in place and slicing the values out: no msgpack object hook per array, and no copy
# of an array's bytes (a camera image is a view on the frame, as unpackb's arrays are views on a copy).
_ARRAY, _BOOL, _F64_VALUE, _GENERIC, _CONST = range(5)


class FrameLayout:
    """Where the values of one kind of flat frame sit; :meth:`read` decodes a frame with that layout.

    ``FrameLayout.learn(data, unpackb(data))`` returns None for frames it cannot lay out (a value
    whose encoded length varies, such as an int or a string, or anything nested). ``read`` returns
    None when a frame does not have the layout, and otherwise exactly what :func:`unpackb` returns.
    """

    __slots__ = ("checks", "fields", "size")

    def __init__(self, size: int, checks: list[tuple[int, bytes]], fields: list[tuple]) -> None:
        self.size = size
        self.checks = checks  # (offset, bytes that must be there)
        self.fields = fields  # (kind, key, offset, a, b) in the frame's key order

    @classmethod
    def learn(cls, data: bytes | str, frame: Any) -> FrameLayout | None:
        if type(data) is not bytes or type(frame) is not dict:
            return None
        pieces: list[Any] = [_map_header(len(frame))]  # bytes, or (kind, key, size, a, b) for a value
        try:
            for key, value in frame.items():
                if type(key) is not str:
                    return None
                pieces.append(_packed_key(key))
                kind = type(value)
                if kind is np.ndarray:
                    if value.dtype.kind not in "biuf" or not value.flags.c_contiguous:
                        return None
                    head, tail = _array_pieces(value)
                    pieces += [head, (_ARRAY, key, value.nbytes, value.dtype, (value.size, value.shape)), tail]
                elif kind is bool:
                    pieces.append((_BOOL, key, 1, None, None))
                elif value is None:
                    pieces += [_NIL, (_CONST, key, 0, None, None)]
                elif kind is float:
                    pieces += [b"\xcb", (_F64_VALUE, key, 8, None, None)]
                elif isinstance(value, np.generic) and value.dtype.kind == "f":
                    head, tail = _generic_pieces(value)
                    pieces += [head + b"\xcb", (_GENERIC, key, 8, value.dtype.type, None), tail]
                else:
                    return None
        except (_NotFlat, WireError):
            return None
        checks: list[tuple[int, bytes]] = []
        fields: list[tuple] = []
        at = 0
        for piece in pieces:
            if type(piece) is bytes:
                if checks and checks[-1][0] + len(checks[-1][1]) == at:
                    checks[-1] = (checks[-1][0], checks[-1][1] + piece)  # adjacent constants: one check
                else:
                    checks.append((at, piece))
                at += len(piece)
            else:
                kind, key, size, a, b = piece
                fields.append((kind, key, at, a, b))
                at += size
        layout = cls(at, checks, fields)
        return layout if layout.read(data) is not None else None

    def read(self, data: bytes | str) -> dict[str, Any] | None:
        if type(data) is not bytes or len(data) != self.size:
            return None
        for at, expected in self.checks:
            if not data.startswith(expected, at):
                return None
        frame: dict[str, Any] = {}
        for kind, key, at, a, b in self.fields:
            if kind == _ARRAY:
                frame[key] = np.frombuffer(data, a, b[0], at).reshape(b[1])
            elif kind == _BOOL:
                flag = data[at]
                if flag == 0xC3:
                    frame[key] = True
                elif flag == 0xC2:
                    frame[key] = False
                else:
                    return None
            elif kind == _F64_VALUE:
                frame[key] = _F64.unpack_from(data, at)[0]
            elif kind == _GENERIC:
                frame[key] = a(_F64.unpack_from(data, at)[0])
            else:
                frame[key] = None
        return frame
