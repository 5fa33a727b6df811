"""The controller's half of a LeRobot recording: the workers' parts merged into one dataset.

:func:`merge_parts` joins every part a worker's
:class:`~pytest_hud.recording.dataset.DatasetRecorder` closed under ``root/parts/`` into one dataset
at ``root`` with LeRobot's own ``aggregate_datasets`` (episodes renumbered, tasks unified,
statistics aggregated) and removes the merged parts. A part whose worker died before closing it is
unreadable: the merge leaves it in place with a :class:`RecordingWarning`. A worker's part holds
one dataset per feature set (and fps), named after it, and parts of the same name are merged
together: when a run recorded one feature set (the usual case) the merged dataset is ``root``
itself; with several, each is merged into ``root/<group name>/``. ``meta/pytest_hud_episodes.jsonl`` (:data:`EPISODES_FILE`) maps each
``episode_index`` to its pytest-hud task, episode id, seed, success and score.

:func:`check_record_dir` is the controller's check before a run: a recording never overwrites or
silently extends an earlier one.

Apart from the recorder because only the controller runs it, once every worker has closed its
recorder; LeRobot is imported only when parts are merged.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

from pytest_hud.recording.dataset_parts import (
    DEFAULT_REPO_ID, PART_EPISODES_FILE, PARTS_DIR, RecordingWarning, quiet_lerobot, require_lerobot,
)

__all__ = ["EPISODES_FILE", "check_record_dir", "merge_parts"]

EPISODES_FILE = "pytest_hud_episodes.jsonl"  # in the merged dataset's meta/
_LEROBOT_DIRS = ("data", "videos", "images", "meta")  # meta last: its info.json marks a complete dataset


def _natural(path: Path) -> list[Any]:
    return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", path.as_posix())]


def _holds_dataset(folder: Path) -> bool:
    return (folder / "meta" / "info.json").is_file()


def check_record_dir(root: str | os.PathLike[str]) -> None:
    """Raise ``FileExistsError`` if ``root`` (or a folder in it) already holds a merged dataset.

    A recording never overwrites or silently extends an earlier one: call this before a run.
    Parts left by a crashed earlier run are fine: the next merge includes them.
    """
    root = Path(root)
    if not root.exists():
        return
    if not root.is_dir():
        raise FileExistsError(f"{root} is a file; --hud-record needs a folder")
    held = [root] if _holds_dataset(root) else []
    held += [p for p in sorted(root.iterdir()) if p.is_dir() and p.name != PARTS_DIR and _holds_dataset(p)]
    if held:
        raise FileExistsError(
            f"{held[0]} already holds a LeRobot dataset; record into a new folder or move it away"
        )


def _part_problem(part: Path) -> str | None:
    """Why ``part`` cannot be merged, or None when it is a complete LeRobot dataset."""
    import pyarrow.parquet as pq

    try:
        info = json.loads((part / "meta" / "info.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"unreadable meta/info.json ({exc})"
    episodes = sorted((part / "meta" / "episodes").rglob("*.parquet"))
    data = sorted((part / "data").rglob("*.parquet"))
    if not (part / "meta" / "tasks.parquet").is_file() or not episodes or not data:
        return "its recorder was never closed (did the worker crash?)"
    try:
        n_episodes = sum(pq.read_metadata(f).num_rows for f in episodes)
        n_frames = sum(pq.read_metadata(f).num_rows for f in data)
    except Exception as exc:  # a parquet file without its footer: the writer was never closed
        return f"its recorder was never closed (did the worker crash?): {type(exc).__name__}: {exc}"
    if (n_episodes, n_frames) != (info.get("total_episodes"), info.get("total_frames")):
        return (f"it holds {n_episodes} episodes / {n_frames} frames but its info.json says "
                f"{info.get('total_episodes')} / {info.get('total_frames')}")
    return None


def _episode_entries(part: Path, count: int) -> list[dict[str, Any]]:
    try:
        lines = (part / PART_EPISODES_FILE).read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    entries = []
    for i in range(count):
        try:
            entries.append(json.loads(lines[i]))
        except (IndexError, ValueError):
            entries.append({})
    return entries


def merge_parts(
    root: str | os.PathLike[str],
    out: str | os.PathLike[str] | None = None,
    *,
    repo_id: str = DEFAULT_REPO_ID,
) -> list[Path]:
    """Merge every closed part under ``root/parts/`` into one LeRobot dataset at ``out`` (default ``root``).

    Uses ``lerobot.datasets.aggregate.aggregate_datasets``: episodes are renumbered in part order
    (worker ids in natural order, then recording order), tasks unified, statistics aggregated.
    Merged parts are removed; a part that cannot be read (its worker died before
    :meth:`DatasetRecorder.close`) is left in place with a :class:`RecordingWarning`.

    Returns the datasets written: ``[out]``, or one ``out/<group>`` per feature set when the run
    recorded several sims, or ``[]`` when there was nothing to merge. Raises ``FileExistsError``
    (before writing anything) when a destination already holds a dataset.

        >>> merge_parts("rollouts/")
        [PosixPath('/abs/rollouts')]
    """
    require_lerobot()
    root = Path(root).resolve()
    out_dir = Path(out).resolve() if out is not None else root
    parts_dir = root / PARTS_DIR
    candidates = sorted((p.parent.parent for p in parts_dir.glob("*/*/meta/info.json")), key=_natural)
    groups: dict[str, list[Path]] = {}
    for part in candidates:
        problem = _part_problem(part)
        if problem is not None:
            warnings.warn(RecordingWarning(f"recorded part {part} was not merged: {problem}; "
                                           "it is left in place"), stacklevel=2)
            continue
        groups.setdefault(part.name, []).append(part)
    if not groups:
        _remove_empty(parts_dir)
        return []
    single = len(groups) == 1
    destinations = {name: out_dir if single else out_dir / name for name in groups}
    for dest in destinations.values():
        clash = [dest / d for d in _LEROBOT_DIRS if (dest / d).exists()]
        if clash:
            raise FileExistsError(
                f"{dest} already holds a LeRobot dataset ({clash[0].name}/ exists); merge into "
                "another folder (out=...) or move it away"
            )

    from lerobot.datasets.aggregate import aggregate_datasets

    for name, parts in sorted(groups.items()):
        dest = destinations[name]
        staging = parts_dir / f".merging-{name}-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        # aggregate_datasets prints tqdm bars on stderr; the controller's terminal is the user's
        with quiet_lerobot(), contextlib.redirect_stderr(io.StringIO()):
            aggregate_datasets([repo_id] * len(parts), repo_id, roots=parts, aggr_root=staging)
        index, episode_index = [], 0
        for part in parts:
            info = json.loads((part / "meta" / "info.json").read_text(encoding="utf-8"))
            for entry in _episode_entries(part, int(info["total_episodes"])):
                index.append(json.dumps({"episode_index": episode_index, **entry}, default=str))
                episode_index += 1
        (staging / "meta" / EPISODES_FILE).write_text("\n".join(index) + "\n", encoding="utf-8")
        dest.mkdir(parents=True, exist_ok=True)
        for sub in _LEROBOT_DIRS:  # meta/ last: a dataset with an info.json is complete
            if (staging / sub).exists():
                shutil.move(str(staging / sub), str(dest / sub))
        shutil.rmtree(staging, ignore_errors=True)
        for part in parts:
            shutil.rmtree(part)
    _remove_empty(parts_dir)
    return [destinations[name] for name in sorted(groups)]


def _remove_empty(parts_dir: Path) -> None:
    """Remove empty worker folders, then ``parts/`` itself if nothing is left in it."""
    if not parts_dir.is_dir():
        return
    for worker in parts_dir.iterdir():
        if worker.is_dir():
            with contextlib.suppress(OSError):
                worker.rmdir()
    with contextlib.suppress(OSError):
        parts_dir.rmdir()
