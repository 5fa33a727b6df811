"""What a worker records of its episodes: videos, per-tick traces and a LeRobot dataset, behind
one recorder protocol; and the controller's merge of the workers' dataset parts."""

import importlib.util


def video_available() -> bool:
    """True when PyAV can be imported (without importing it, nor numpy: the controller asks at start-up)."""
    return importlib.util.find_spec("av") is not None
