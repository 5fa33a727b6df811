"""The per-step frames of openpi/0: observation and action frames packed and read from cached bytes.

A bridge sends an observation frame and reads an action frame for every slot on every step, so
these are the codec's hot path: :func:`pack_frame` and :func:`rows_packer` (a tick's observation
frames, one join each), :func:`pack_action`, :func:`unpack_action` and :class:`FrameLayout` (a
frame read by slicing once its layout is known). Each gives exactly the bytes or values that
:func:`~pytest_hud.wire.arrays.packb` / :func:`~pytest_hud.wire.arrays.unpackb` give, which
``tests/unit/test_wire.py`` checks; they are apart from those because only the step path needs them.
Import them from :mod:`pytest_hud.wire.codec` (or from here).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np

from pytest_hud.wire.arrays import (
    _CACHE_LIMIT, _F64, _FALSE, _JOIN_LIMIT, _NIL, _TRUE, WireError, _array_pieces, _bin_header,
    _float64, _generic_pieces, _map_header, _NotFlat, _pack_items, _packed_key, _remember, packb, unpackb,
)

__all__ = ["FrameLayout", "pack_action", "pack_frame", "rows_packer", "unpack_action"]

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
