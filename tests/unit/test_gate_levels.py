"""The gate holds each robustness level to its own level in the baseline, not to the reference: a
perturbed level that was 5/30 in the baseline and is 5/30 now passes, although the same level
held to the reference's 30/30 fails."""

from __future__ import annotations

from pytest_hud.controller.ledger import Ledger
from pytest_hud.core.results import EpisodeRecord, Results
from pytest_hud.gate import GateConfig, gate_passed

TASK = "t.py::test_x"


def level(name: str, successes: int, n: int = 30, as_level: str | None = None) -> list[EpisodeRecord]:
    """``successes`` of ``n`` seeds at level ``name`` (recorded under ``as_level``'s task id when given)."""
    shown = as_level or name
    return [EpisodeRecord(task=f"{TASK}[p={shown}]", episode=str(s), nodeid=f"{TASK}[{shown}-{s}]", seed=s,
                          outcome="passed" if s < successes else "failed", success=s < successes,
                          axes={"p": {"level": shown, "index": 0 if shown == "none" else 1, "reference": "none",
                                      "task": TASK}})
            for s in range(n)]


def verdicts(baseline: list[EpisodeRecord], current: list[EpisodeRecord]) -> dict[str, object]:
    ledger = Ledger(GateConfig(), Results(run={"record": "run"}, episodes=baseline, summary=None))
    ledger.declare([{"task": r.task, "episode": r.episode, "seed": r.seed, "nodeid": r.nodeid} for r in current])
    for r in current:
        ledger.add(r)
    return {v.task: v for v in ledger.verdicts()}


def test_a_perturbed_level_passes_against_its_own_level_and_would_fail_against_the_reference():
    now = level("none", 30) + level("perturbed", 5)
    own = verdicts(level("none", 30) + level("perturbed", 5), now)
    perturbed = own[f"{TASK}[p=perturbed]"]
    assert perturbed.baseline_rate == 5 / 30 and perturbed.current_rate == 5 / 30
    assert perturbed.verdict in ("pass", "inconclusive") and perturbed.p_value == 1.0
    assert gate_passed(list(own.values()))
    # the same run held to the reference's outcomes at that level (a baseline whose perturbed level
    # ran like the reference): 25 worse pairs of 25, a regression
    against_reference = verdicts(level("none", 30) + level("none", 30, as_level="perturbed"), now)
    wrong = against_reference[f"{TASK}[p=perturbed]"]
    assert wrong.baseline_rate == 1.0 and wrong.verdict == "regression" and wrong.discordant == (25, 0)
    assert not gate_passed(list(against_reference.values()))
