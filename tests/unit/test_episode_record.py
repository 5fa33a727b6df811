"""One episode record from the worker to the results line and back: what a newer pytest-hud wrote is
kept and named, never dropped."""

from __future__ import annotations

import json
import warnings

import pytest

from pytest_hud.core.results import EpisodeRecord, EpisodeResult, ResultsWarning, ResultsWriter, load_results

NEWER = {"task": "t.py::test_x", "episode": "3", "nodeid": "t.py::test_x[3]", "outcome": "passed", "success": True,
         "steps": 12, "shelf_life": 3, "placement": {"rack": "b7"}}


def test_a_record_keeps_the_fields_it_does_not_know_and_names_them():
    with pytest.warns(ResultsWarning, match="does not know: placement, shelf_life; kept as they are"):
        record = EpisodeRecord.from_dict(NEWER)
    assert (record.task, record.steps) == ("t.py::test_x", 12)
    assert record.unknown == {"shelf_life": 3, "placement": {"rack": "b7"}}
    data = record.to_dict()
    assert data["shelf_life"] == 3 and data["placement"] == {"rack": "b7"} and "unknown" not in data
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert EpisodeRecord.from_dict(data, warn=False) == record  # the caller reports them itself


def test_a_record_this_version_wrote_reads_back_equal_and_without_a_warning():
    record = EpisodeRecord(task="t", episode="1", nodeid="t[1]", outcome="failed", success=False, seed=1,
                           extra={"env_success": False}, claim={"seed": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert EpisodeRecord.from_dict(json.loads(json.dumps(record.to_dict()))) == record


def test_a_newer_results_file_loads_with_one_warning_and_is_written_back_whole(tmp_path):
    newer = tmp_path / "newer.jsonl"
    writer = ResultsWriter(newer, {}, "run-1")
    writer.close()
    with open(newer, "a", encoding="utf-8") as fh:
        for episode in ("3", "4"):
            fh.write(json.dumps({"record": "episode", **NEWER, "episode": episode}) + "\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = load_results(newer)
    named = [w for w in caught if issubclass(w.category, ResultsWarning)]
    assert len(named) == 1, [str(w.message) for w in caught]  # one per file, not one per line
    assert str(named[0].message).startswith(f"{newer}: its episode records have fields")
    assert "placement, shelf_life" in str(named[0].message)
    assert [r.unknown["shelf_life"] for r in results.episodes] == [3, 3]

    again = tmp_path / "again.jsonl"  # e.g. a merge or a resumed run writing the records again
    writer = ResultsWriter(again, {}, "run-2")
    for record in results.episodes:
        writer.episode(record)
    writer.close()
    lines = [json.loads(line) for line in again.read_text().splitlines()[1:]]
    assert all(line["shelf_life"] == 3 and line["placement"] == {"rack": "b7"} for line in lines)


def test_the_bridges_grade_names_fields_it_cannot_record():
    grade = {"success": True, "score": 1.0, "total_reward": 2.0, "steps": 5, "task": {"seed": 1}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert EpisodeResult.from_dict(grade).steps == 5  # the claim's task is the episode's own business
    with pytest.warns(ResultsWarning, match="the bridge's episode result has fields .* does not know: sim_time"):
        EpisodeResult.from_dict({**grade, "sim_time": 0.5})


def test_to_builtin_gives_new_json_types_for_builtin_and_numpy_values_alike():
    import json
    import math

    import numpy as np

    from pytest_hud.core.results import to_builtin

    class Flag(int):
        pass

    value = {"a": [1, 2.5, (3, "x")], 4: {"b": None, "c": True}, "nan": math.nan, "np": np.float32(0.5),
             "arr": np.arange(3), "sub": Flag(7), "inf": [math.inf], "t": (np.int64(2),)}
    out = to_builtin(value)
    assert out == {"a": [1, 2.5, [3, "x"]], "4": {"b": None, "c": True}, "nan": None, "np": 0.5,
                   "arr": [0, 1, 2], "sub": 7, "inf": [None], "t": [2]}
    assert type(out["sub"]) is int and type(out["np"]) is float and type(out["t"][0]) is int
    assert json.loads(json.dumps(out)) == out
    assert out["a"] is not value["a"] and out["4"] is not value[4]  # nothing mutable is shared


def test_an_episode_result_as_a_dict_shares_no_artefacts_with_it():
    from pytest_hud.core.results import EpisodeResult

    result = EpisodeResult(True, 1.0, 5.0, 10, artefacts={"video": "v.mp4"})
    data = result.to_dict()
    assert data == {**{k: getattr(result, k) for k in data}, "artefacts": {"video": "v.mp4"}}
    data["artefacts"]["trace"] = "t.json"
    assert result.artefacts == {"video": "v.mp4"} and EpisodeResult.from_dict(data).artefacts == data["artefacts"]
