"""Which tables are a family: the pooled table of an axis is its verdict (Holm over its levels, at most
alpha); the per-task tables are exploratory, and every output says so."""

from __future__ import annotations

from pytest_hud.core.results import EpisodeRecord
from pytest_hud.core.sensitivity import sensitivity_tables
from pytest_hud.report.html import summary_section_html
from pytest_hud.report.markdown import summary_markdown
from pytest_hud.report.sensitivity import sensitivity_lines

LEVELS = ("none", "large")


def suite(task: str, large: int, n: int = 10) -> list[EpisodeRecord]:
    return [EpisodeRecord(task=f"{task}[p={lv}]", episode=str(s), nodeid=f"{task}[{lv}-{s}]", seed=s,
                          outcome="passed" if ok else "failed", success=ok,
                          axes={"p": {"level": lv, "index": LEVELS.index(lv), "reference": "none", "task": task}})
            for lv in LEVELS for s in range(n) for ok in [lv == "none" or s < large]]


def test_per_task_tables_are_labelled_exploratory_in_every_output():
    tables = sensitivity_tables(suite("a.py::t", large=2) + suite("b.py::t", large=10), per_task=True)
    pooled, per_a, per_b = tables
    assert not pooled.exploratory and per_a.exploratory and per_a.worse == ["large"]
    lines = sensitivity_lines([per_a])
    assert "exploratory: one-sided exact tests, Holm over this task's 1 level only" in lines[0]
    assert lines[4].endswith("WORSE (exploratory)")
    assert lines[-1].endswith("(exploratory, in a.py::t alone: not corrected across tasks)")
    assert "exploratory" not in " ".join(sensitivity_lines([pooled]))
    stored = [t.to_dict() for t in tables]
    assert [t["family"] for t in stored] == ["axis", "exploratory", "exploratory"]
    md = summary_markdown({}, sensitivity=[per_a])
    assert "exploratory" in md.splitlines()[-1] or "❔ worse (exploratory)" in md
    assert "#### Robustness: p (reference none; a.py::t; exploratory:" in md
    html = summary_section_html({}, sensitivity=[per_a])
    assert "worse (exploratory)</td>" in html and "the pooled table is the verdict" in html
