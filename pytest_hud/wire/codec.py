"""The openpi/0 wire codec: msgpack with numpy arrays and scalars.

Byte-compatible with openpi-client's ``msgpack_numpy`` and the HUD SDK robot stack; the encoding
of arrays and scalars, and what is refused, is told in :mod:`pytest_hud.wire.arrays`.

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
