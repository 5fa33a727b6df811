"""The LeRobot dataset a run recorded (``--hud-record``): the workers' parts merged, and what came of it."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

__all__ = ["merged_recording"]


def merged_recording(root: str) -> dict[str, Any]:
    """Merge every worker's dataset part into one LeRobot dataset (per feature set) under ``root``:
    ``{"datasets": [{"path", "episodes", "frames"}], "warnings": [...]}``, or ``{"error": ...}``."""
    from pytest_hud.recording.dataset import RecordingWarning, merge_parts

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RecordingWarning)
        try:
            paths = merge_parts(root)
        except Exception as exc:  # noqa: BLE001 - a failed merge must not hide the results
            return {"error": f"{type(exc).__name__}: {exc}", "datasets": []}
    datasets = []
    for path in paths:
        try:
            info = json.loads((Path(path) / "meta" / "info.json").read_text())
        except (OSError, ValueError):
            info = {}
        datasets.append({"path": str(path), "episodes": info.get("total_episodes"),
                         "frames": info.get("total_frames")})
    return {"datasets": datasets, "warnings": [str(w.message) for w in caught]}
