"""SIGTERM ends a run like Ctrl-C, so that teardown still stops the pool and removes its secrets."""

from __future__ import annotations

import signal
import threading
from typing import Any


def sigterm_as_interrupt():
    """Make SIGTERM end the run like Ctrl-C, so teardown stops the pool and removes its secrets.

    Returns the previous handler (None when not on the main thread or someone else handles it).
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGTERM)
    if previous not in (signal.SIG_DFL, None):
        return None  # another tool manages SIGTERM: leave it alone

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, interrupt)
    return previous
