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


def _decode(obj: dict) -> Any:
    if b"__ndarray__" in obj:
        try:
            dtype = np.dtype(obj[b"dtype"])
            _check_dtype(dtype)
            shape = tuple(int(d) for d in obj[b"shape"])
            data = obj[b"data"]
            if not isinstance(data, (bytes, bytearray, memoryview)):
                raise WireError("ndarray 'data' must be bytes")
            expected = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
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
            dtype = np.dtype(obj[b"dtype"])
            _check_dtype(dtype)
            return dtype.type(obj[b"data"])
        except WireError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise WireError(f"malformed numpy scalar in frame: {exc}") from None
    return obj


def packb(obj: Any) -> bytes:
    """Encode ``obj`` (maps, lists, builtins, numpy arrays and scalars) as one openpi/0 frame."""
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
