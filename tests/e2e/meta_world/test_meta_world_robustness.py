"""The Meta-World robustness suite as a user runs it: a sensitivity table whose large perturbations
are flagged, and perturbation builds that keep an episode a function of (task, seed, build).

Skipped without Meta-World (``pip install "pytest-hud[metaworld]"``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("metaworld", reason='Meta-World is not installed: pip install "pytest-hud[metaworld]"')

from pytest_hud.core.results import load_results  # noqa: E402

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "evals" / "sims"))
from meta_world import MetaWorldTask  # noqa: E402


def rollout(env: MetaWorldTask, seed: int, steps: int = 5) -> np.ndarray:
    obs, _ = env.reset(seed=seed)
    states = [obs["state"]]
    for _ in range(steps):
        obs, *_ = env.step(np.full(4, 0.5, np.float32))
        states.append(obs["state"])
    return np.stack(states)


def test_perturbations_are_drawn_from_the_seed_and_off_by_default() -> None:
    plain, noisy, delayed = (MetaWorldTask("reach-v3", **kw) for kw in
                             ({}, {"obs_noise": 0.01, "action_noise": 0.2}, {"action_delay": 3}))
    base = rollout(plain, 4)
    assert np.array_equal(base, rollout(plain, 4))
    first = rollout(noisy, 4)
    assert np.array_equal(first, rollout(noisy, 4))  # same seed, same noise, after other episodes too
    rollout(noisy, 5)
    assert np.array_equal(first, rollout(noisy, 4))
    assert 0.001 < np.abs(first[0] - base[0]).mean() < 0.05  # the same variation, seen through noise
    late = rollout(delayed, 4)
    moved = np.abs(base[3, :3] - base[0, :3]).max()
    assert moved > 1e-3 and np.abs(late[3, :3] - late[0, :3]).max() < moved / 2  # the hand (nearly) holds for 3 steps
    assert np.abs(late[5, :3] - late[3, :3]).max() > 1e-3  # then moves
    with pytest.raises(ValueError, match="must be >= 0"):
        MetaWorldTask("reach-v3", action_delay=-1)


def test_the_robustness_suite_flags_the_large_perturbations(tmp_path: Path) -> None:
    results = tmp_path / "robustness.jsonl"
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                          "evals/test_meta_world_robustness.py", "-n", "2", "--hud-width=2", f"--hud-results={results}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=580)
    assert out.returncode in (0, 1), out.stdout[-3000:] + out.stderr[-3000:]
    assert "coverage: 112/112 declared episodes reported, 112 graded, 0 errors" in out.stdout, out.stdout[-3000:]
    assert "robustness: perturbation (reference none; pooled over 2 tasks;" in out.stdout
    (pooled,) = [t for t in load_results(results).summary["sensitivity"] if t["scope"] == "pooled"]
    rows = {r["level"]: r for r in pooled["rows"]}
    assert list(rows)[0] == "none" and rows["none"]["successes"] >= 14
    assert "action_delay_15" in pooled["worse"]  # the expert cannot work 15 steps late
    assert not rows["action_noise_0.3"]["significantly_worse"]  # a little actuation noise does not hurt it
    assert all(r["test"] == "paired-mcnemar" for r in pooled["rows"][1:])  # one seed, one variation, every level
