"""The openpi/0 wire codec: msgpack with numpy arrays and scalars.

Byte-compatible with openpi-client's ``msgpack_numpy`` and the HUD SDK robot stack, so their
clients and ours interoperate. An array travels as a map with *bytes* keys::

    {b"__ndarray__": True, b"data": <raw C-order bytes>, b"dtype": "<f4", b"shape": [..]}

and a numpy scalar as ``{b"__npgeneric__": True, b"data": <item>, b"dtype": "<f4"}``.

Object, void and complex dtypes are refused: decoding must never run code (no pickle), and the
peers we talk to cannot represent them. Decoded arrays are read-only views on the frame's bytes;
copy before mutating.

The codec's two halves: :mod:`pytest_hud.wire.arrays` (``packb``, ``unpackb``, ``unpack_map``, the
errors) and :mod:`pytest_hud.wire.frames` (the per-step frames: ``pack_frame``, ``rows_packer``,
``pack_action``, ``unpack_action``, ``FrameLayout``). This module gives both under the one name
every caller imports (``from pytest_hud.wire.codec import ...``); it defines nothing itself.

No asyncio, no gym and no pytest: it is pure and cheap to import.
"""

from __future__ import annotations

from pytest_hud.wire.arrays import (
    MAX_FRAME_BYTES, NotAMapError, TextFrameError, WireError, packb, unpack_map, unpackb,
)
# Not public: tests/unit/test_wire.py checks the fast path against ``msgpack.packb(obj, default=_encode)``.
from pytest_hud.wire.arrays import _encode  # noqa: F401
from pytest_hud.wire.frames import FrameLayout, pack_action, pack_frame, rows_packer, unpack_action

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
    "FrameLayout",
]
