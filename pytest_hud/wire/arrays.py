"""msgpack with numpy arrays and scalars, openpi/0's encoding: ``packb``, ``unpackb``, ``unpack_map``.

Byte-compatible with openpi-client's ``msgpack_numpy`` and the HUD SDK robot stack, so their
clients and ours interoperate. An array travels as a map with *bytes* keys::

    {b"__ndarray__": True, b"data": <raw C-order bytes>, b"dtype": "<f4", b"shape": [..]}

and a numpy scalar as ``{b"__npgeneric__": True, b"data": <item>, b"dtype": "<f4"}``.

Object, void and complex dtypes are refused: decoding must never run code (no pickle), and the
peers we talk to cannot represent them. Decoded arrays are read-only views on the frame's bytes;
copy before mutating.

Apart from the per-step frames (:mod:`pytest_hud.wire.frames`), which build on this module's
cached byte pieces (``_array_pieces``, ``_packed_key``, ``_map_header``, ... : the wire package's
internals, shared on purpose) but are needed only on the step path; :mod:`pytest_hud.wire.codec`
gives both under one name. No asyncio, no gym and no pytest: it is pure and cheap to import.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import msgpack
import numpy as np

from pytest_hud.wire.jsonrpc import MAX_FRAME_BYTES

__all__ = [
    "MAX_FRAME_BYTES",
    "NotAMapError",
    "TextFrameError",
    "WireError",
    "packb",
    "unpack_map",
    "unpackb",
]


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
