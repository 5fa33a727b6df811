"""Shards and their merge, as users run them: ``pytest --hud-shard I/N`` in separate runs (real
bridges, one shard under xdist), then ``python -m pytest_hud merge``, then the gate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_hud.core.results import load_results
from pluginkit import INI, SIMS

pytestmark = pytest.mark.timeout(400)

POLICIES = '''
def balance():
    return lambda obs: int(obs["state"][2] + 0.5 * obs["state"][3] > 0)

def tilt():
    """Weak: about half of the episodes fail, and episode lengths depend on the seed."""
    return lambda obs: int(obs["state"][3] - 1.5 * obs["state"][1] > 0)

def lean():
    """Weaker: every episode fails."""
    return lambda obs: int(obs["state"][2] > 0)
'''

# Four tasks of 12, 4, 4 and 1 episodes: with 3 shards, test_single lands in one shard only.
SUITE = '''
import pytest

@pytest.mark.parametrize("seed", range(12))
def test_balance(shared_sim, robot_agent, seed):
    assert robot_agent.run(shared_sim.episode(seed=seed)).success

@pytest.mark.parametrize("seed", range(100, 104))
@pytest.mark.parametrize("arm", ["left", "right"])
def test_arms(shared_sim, robot_agent, arm, seed):
    assert robot_agent.run(shared_sim.episode(seed=seed)).success

def test_single(shared_sim, robot_agent):
    assert robot_agent.run(shared_sim.episode(seed=7)).success
'''
SUITE_SIZE = 21


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(sims=SIMS, policies=POLICIES, test_suite=SUITE)
    pytester.makeini(INI)
    return pytester


def run(pytester: pytest.Pytester, *args: str, xdist: bool = False) -> pytest.RunResult:
    plugins = ["-n", "2", "--hud-width=2"] if xdist else ["-p", "no:xdist"]
    return pytester.runpytest_subprocess("-p", "no:cacheprovider", *plugins, *args, timeout=240)


def shards(project: pytest.Pytester, policy: str, *extra: str, prefix: str = "shard") -> list[Path]:
    """Run the suite as 3 shards (shard 2 under xdist); their results files."""
    paths = []
    for i in (1, 2, 3):
        path = project.path / f"{prefix}-{i}.jsonl"
        run(project, f"--hud-policy={policy}", f"--hud-shard={i}/3", f"--hud-results={path.name}", *extra,
            xdist=i == 2)
        paths.append(path)
    return paths


def cli(project: pytest.Pytester, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest_hud", *map(str, args)], cwd=project.path,
                          capture_output=True, text=True, timeout=120)


def by_episode(path: Path) -> dict[tuple[str, str], tuple]:
    return {(r.task, r.episode): (r.outcome, r.success, r.steps, r.total_reward, r.seed)
            for r in load_results(path).latest_episodes()}


def test_three_shards_merged_equal_one_unsharded_run_episode_for_episode(project):
    run(project, "--hud-policy=policies:tilt", "--hud-results=whole.jsonl")
    paths = shards(project, "policies:tilt")
    sizes = []
    for i, path in enumerate(paths, 1):
        results = load_results(path)
        shard = results.run["provenance"]["shard"]  # the header records the shard
        assert (shard["index"], shard["count"], shard["suite"]["episodes"]) == (i, 3, SUITE_SIZE)
        assert results.complete and results.summary["coverage"]["missing"] == []
        sizes.append(len(results.latest_episodes()))
    assert sorted(sizes) == [7, 7, 7]  # dealt evenly

    done = cli(project, "merge", *paths, "-o", "all.jsonl")
    assert done.returncode == 0, done.stderr
    assert f"{SUITE_SIZE} of {SUITE_SIZE} suite episodes -> all.jsonl" in done.stdout
    whole, merged = by_episode(project.path / "whole.jsonl"), by_episode(project.path / "all.jsonl")
    assert len(whole) == SUITE_SIZE and merged == whole  # success, steps, return (and outcome, seed)
    assert len({steps for _, _, steps, _, _ in whole.values()}) > 2  # a policy whose episodes differ
    summary = load_results(project.path / "all.jsonl").summary
    assert summary["coverage"]["declared"] == SUITE_SIZE and summary["coverage"]["missing"] == []
    assert summary["tasks"] == {
        task: dict(s, episodes_per_hour=summary["tasks"][task]["episodes_per_hour"])
        for task, s in load_results(project.path / "whole.jsonl").summary["tasks"].items()}


def test_the_gate_on_the_merged_file_says_what_it_says_on_the_unsharded_run(project):
    run(project, "--hud-policy=policies:balance", "--hud-results=base.jsonl")
    run(project, "--hud-policy=policies:lean", "--hud-results=whole.jsonl")
    paths = shards(project, "policies:lean")
    assert cli(project, "merge", *paths, "-o", "all.jsonl").returncode == 0

    verdicts = {}
    for name in ("whole.jsonl", "all.jsonl"):
        done = cli(project, "report", name, "--compare", "base.jsonl")
        assert done.returncode == 1, done.stdout + done.stderr
        assert "regression: test_suite.py::test_balance: dropped" in done.stdout
        verdicts[name] = sorted(line.split(":", 2)[:2] for line in done.stdout.splitlines()
                                if line.startswith(("regression:", "inconclusive:", "pass:", "insufficient")))
    assert verdicts["all.jsonl"] == verdicts["whole.jsonl"]
    # The merged file is an ordinary results file: a later run can use it as its baseline.
    assert cli(project, "report", "base.jsonl", "--compare", "all.jsonl").returncode == 0


def test_a_shards_own_gate_leaves_the_other_shards_episodes_out(project):
    run(project, "--hud-policy=policies:balance", "--hud-results=base.jsonl")
    for i in (1, 2, 3):
        result = run(project, f"--hud-shard={i}/3", "--hud-baseline=base.jsonl", "--hud-results=s.jsonl")
        assert result.ret == 0, result.stdout.str()
        assert "insufficient coverage" not in result.stdout.str()
        results = load_results(project.path / "s.jsonl")
        gate = {v["task"]: v for v in results.summary["gate"]}
        # test_single's one episode is in one shard; elsewhere it is not a task of this shard.
        assert ("test_suite.py::test_single" in gate) == ("test_suite.py::test_single" in results.tasks())
        # Paired with the same episodes of the baseline, not compared with all 12 of them.
        assert gate["test_suite.py::test_balance"]["n_baseline"] == 4
        assert gate["test_suite.py::test_balance"]["test"] == "paired-mcnemar"


def test_merge_reports_a_missing_shard_and_duplicate_episodes(project):
    one, two, three = shards(project, "policies:tilt")
    missing = cli(project, "merge", one, three, "-o", "all.jsonl")
    assert missing.returncode == 1
    assert "missing shard 2/3" in missing.stderr
    assert f"7 of {SUITE_SIZE} episodes of the suite are in no file" in missing.stderr
    assert "--allow-missing" in missing.stderr and not (project.path / "all.jsonl").exists()
    allowed = cli(project, "merge", one, three, "-o", "all.jsonl", "--allow-missing")
    assert allowed.returncode == 0, allowed.stderr
    merged = load_results(project.path / "all.jsonl")
    assert merged.summary["coverage"]["declared"] == SUITE_SIZE and len(merged.summary["coverage"]["missing"]) == 7

    # The same file twice: identical duplicates are kept once and said so.
    twice = cli(project, "merge", one, two, three, one, "-o", "all.jsonl")
    assert twice.returncode == 0, twice.stderr
    assert "shard 1/3 is given 2 times" in twice.stderr and "with the same result (kept once)" in twice.stderr
    assert len(load_results(project.path / "all.jsonl").latest_episodes()) == SUITE_SIZE

    # A rerun of shard 1 with another result for one episode: a conflict, named.
    lines = one.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if json.loads(line)["record"] == "episode")
    record = json.loads(lines[at])
    record["success"], record["outcome"] = not record["success"], "failed" if record["success"] else "passed"
    lines[at] = json.dumps(record)
    rerun = project.path / "shard-1-rerun.jsonl"
    rerun.write_text("\n".join(lines) + "\n")
    conflict = cli(project, "merge", one, two, three, rerun, "-o", "all.jsonl")
    assert conflict.returncode == 1
    assert (f"episode {record['episode']} of {record['task']} is in {one} and {rerun} with different "
            "results: outcome") in conflict.stderr
    prefer = cli(project, "merge", one, two, three, rerun, "-o", "all.jsonl", "--allow-conflicts")
    assert prefer.returncode == 0
    assert by_episode(project.path / "all.jsonl")[(record["task"], record["episode"])][1] is record["success"]

    # Not shards of one suite or policy: usage errors (2), naming the files.
    run(project, "--hud-policy=policies:lean", "--hud-shard=2/3", "--hud-results=lean-2.jsonl")
    other = cli(project, "merge", one, project.path / "lean-2.jsonl", three, "-o", "all.jsonl")
    assert other.returncode == 4 and "policy differ" in other.stderr and "lean-2.jsonl" in other.stderr
    run(project, "--hud-policy=policies:tilt", "--hud-results=whole.jsonl")
    unsharded = cli(project, "merge", one, "whole.jsonl", "-o", "all.jsonl")
    assert unsharded.returncode == 4 and "whole.jsonl is not a shard's results file" in unsharded.stderr


@pytest.mark.parametrize("value, says", [
    ("0/3", "I must be between 1 and N=3"),
    ("4/3", "I must be between 1 and N=3"),
    ("3", "is not I/N"),
    ("one/two", "is not I/N"),
    ("1/0", "N (the number of shards) must be at least 1"),
    ("", "is not I/N"),
])
def test_bad_shard_values_are_usage_errors_before_anything_runs(project, value, says):
    result = run(project, f"--hud-shard={value}", "--hud-results=r.jsonl")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--hud-shard {value!r}*{says}*e.g. --hud-shard 2/4*"])
    assert not (project.path / "r.jsonl").exists()


def test_the_ini_key_is_checked_too(project):
    project.makeini(INI + "hud_shard = 5/4\n")
    result = run(project)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--hud-shard '5/4'*ini key: hud_shard*"])


ONE_EPISODE = '''
def test_single(shared_sim, robot_agent):
    assert robot_agent.run(shared_sim.episode(seed=7)).success
'''


def test_a_shard_with_no_episodes_of_its_own_passes_and_still_writes_its_file(pytester):
    """More shards than episodes (an array job sized for a bigger suite) is not a failure."""
    pytester.makepyfile(sims=SIMS, policies=POLICIES, test_one=ONE_EPISODE)
    pytester.makeini(INI)
    codes = [run(pytester, "--hud-policy=policies:balance", f"--hud-shard={i}/2", f"--hud-results=s{i}.jsonl").ret
             for i in (1, 2)]
    assert codes == [pytest.ExitCode.OK, pytest.ExitCode.OK]
    merged = cli(pytester, "merge", "s1.jsonl", "s2.jsonl", "-o", "all.jsonl")
    assert merged.returncode == 0, merged.stderr
    assert len(load_results(pytester.path / "all.jsonl").latest_episodes()) == 1
