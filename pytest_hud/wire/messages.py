"""Whole messages out of websockets' sans-I/O frames: the one reassembly of a fragmented message,
for the bridge's slot server (``bridge/wsserver.py``) and the workers' blocking client (``wsclient``)."""

from __future__ import annotations

from websockets.frames import Frame, Opcode

__all__ = ["MessageAssembly"]

_TEXT, _BINARY, _CONT = Opcode.TEXT, Opcode.BINARY, Opcode.CONT


class MessageAssembly:
    """One connection's message in the making: :meth:`feed` each data frame received."""

    __slots__ = ("_parts", "_text")

    def __init__(self) -> None:
        self._parts: list[bytes] = []  # a fragmented message's frames so far
        self._text = False

    def feed(self, frame: Frame) -> tuple[bytes, bool] | None:
        """``(payload, is text)`` of the message ``frame`` completes; None for a fragment before the
        last, or a control frame (websockets answers pings and closes itself)."""
        opcode = frame.opcode
        if opcode is _BINARY or opcode is _TEXT:
            if frame.fin:  # the common case: one frame, one message
                return frame.data, opcode is _TEXT
            self._parts, self._text = [frame.data], opcode is _TEXT
        elif opcode is _CONT:
            self._parts.append(frame.data)
            if frame.fin:
                parts, self._parts = self._parts, []
                return b"".join(parts), self._text
        return None
