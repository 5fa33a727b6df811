"""pytest-hud against the naive way on cheap and state-only sims, side by side in one run.

    python benchmarks/vs_naive.py [--suites cartpole-n0,cartpole-n2,cartpole-n8,meta_world-n2] [--repeats 2]
                                  [--before REF] [--no-bytecode-cache]

(``meta_world`` needs Meta-World: run it in a venv that has it, with this checkout first on
``PYTHONPATH``.) Each suite is the same parametrized episodes written twice:

- **pytest-hud**: ``pytest -n W --hud-width=W`` with ``shared_sim`` and ``robot_agent`` as a user
  writes them, everything else left to its defaults (``--hud-inline=auto`` and
  ``--hud-vectorization=auto`` choose where the envs run, and the summary's note says what they chose);
- **naive**: ``pytest -n W -p no:hud``, each test building its own env and policy in-process and
  looping there, as hand-written eval suites do (``naive_support.py``).

``-n0`` runs a suite in one process, without xdist workers, as it runs without ``-n``.

Suites: ``cartpole`` (200 episodes of CartPole-v1, a linear policy; an env-step of microseconds),
``meta_world`` (Meta-World MT10 from state with its scripted experts, 4 seeds per task; an
env-step of about a millisecond). The two sides alternate ``--repeats`` times; the ratio printed is
naive wall / pytest-hud wall of the fastest run of each (>= 1.0: pytest-hud is no slower), and beside
it the median CPU seconds of each side's runs (pytest and all its processes; on a shared machine
the CPU is steadier than the wall time, and on a busy one the wall time follows it). Both
sides run as users run pytest, its cache on: from its second run on, pytest-hud remembers a sim its
bridge found camera-less and starts no bridge to find out again; ``first run`` is pytest-hud's run
with no cache, for that ratio.

``--before REF`` adds a third side, alternating with the other two: the same suite run by git ref
``REF``'s ``pytest_hud`` (in a tree of its own, :func:`git_ref.tree_with_package`), so that a
change is measured against the code before it in the same run.

``--no-bytecode-cache`` runs every side with ``PYTHONDONTWRITEBYTECODE=1``, as many container
images set it: each process compiles what it imports from source, every run.
"""

from __future__ import annotations

import argparse
import atexit
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EVALS = ROOT / "evals"
BENCH = ROOT / "benchmarks"
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")

MT10 = ("reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3", "drawer-close-v3",
        "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3")

SUITES = {  # name: (pytest-hud test file, naive test file)
    "cartpole": ('''
import pytest

@pytest.mark.hud(sim={sims!r} + ":cartpole", policy={policies!r} + ":cartpole")
@pytest.mark.parametrize("seed", range(200))
def test_balance(shared_sim, robot_agent, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed))
    assert result.success
''', '''
import sys
sys.path.insert(0, {bench!r})
import pytest
from naive_support import build_env, build_policy, run_episode

@pytest.mark.parametrize("seed", range(200))
def test_balance(seed):
    env = build_env({sims!r} + ":cartpole")  # its own env and policy per test
    policy = build_policy({policies!r} + ":cartpole", env)
    info = run_episode(env, policy, seed)
    env.close()
    assert info.get("is_success")
'''),
    "meta_world": ('''
import pytest

@pytest.mark.hud(sim={sims_mw!r} + ":meta_world", build={{"tasks": "MT10"}},
                 policy={policies_mw!r} + ":expert")
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("task", {mt10!r})
def test_mt10(shared_sim, robot_agent, task, seed):
    result = robot_agent.run(shared_sim.episode(seed=seed, task=task))
    assert result.success
''', '''
import sys
sys.path.insert(0, {bench!r})
import pytest
from naive_support import build_env, build_policy, run_episode

@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("task", {mt10!r})
def test_mt10(task, seed):
    env = build_env({sims_mw!r} + ":single_task", task=task)  # its own env and policy per test
    policy = build_policy({policies_mw!r} + ":expert", env)
    info = run_episode(env, policy, seed, prompt=task)
    env.close()
    assert info.get("success")
'''),
}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """Wall and CPU seconds of ``cmd`` (the CPU of pytest and every process it waited for)."""
    cpu0, t0 = _children_cpu(), time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False, env=env)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    tail = out.stdout.strip().splitlines()[-1:] or [out.stderr.strip()[-300:]]
    if "passed" not in tail[0]:
        print(f"    (run ended: {tail[0]})")
    return wall, cpu, out.stdout


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suites", default="cartpole-n0,cartpole-n2,cartpole-n8,meta_world-n2",
                        help="Comma-separated SUITE-nW (suites: cartpole, meta_world)")
    parser.add_argument("--repeats", type=int, default=2, help="Runs of each side, alternating")
    parser.add_argument("--before", metavar="REF", help="Also run each suite with git ref REF's pytest_hud")
    parser.add_argument("--no-bytecode-cache", action="store_true",
                        help="Run every side with PYTHONDONTWRITEBYTECODE=1 (modules compiled at each import)")
    args = parser.parse_args()
    fill = {"sims": str(EVALS / "sims" / "classic.py"), "policies": str(EVALS / "policies" / "numpy_policies.py"),
            "sims_mw": str(EVALS / "sims" / "meta_world.py"),
            "policies_mw": str(EVALS / "policies" / "meta_world_experts.py"), "mt10": MT10, "bench": str(BENCH)}
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    # as users run Python: compiled modules cached (pytest-hud's too), unless asked otherwise
    if args.no_bytecode_cache:
        os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    else:
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    print(f"pytest-hud vs the naive way ({os.cpu_count()} cores; wall seconds, fastest of {args.repeats}"
          + ("; no bytecode cache: PYTHONDONTWRITEBYTECODE=1)" if args.no_bytecode_cache else ")"))
    before_tree = None
    if args.before:
        from git_ref import check_package, tree_with_package

        scratch = tempfile.mkdtemp(prefix="hud-before-")
        atexit.register(shutil.rmtree, scratch, True)
        before_tree = tree_with_package(args.before, Path(scratch) / "tree")
        before_env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(before_tree), str(BENCH)])}
    rows = []
    for entry in args.suites.split(","):
        suite, _, workers = entry.partition("-n")
        hud_src, naive_src = SUITES[suite]
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            (tmp / "hud").mkdir()
            (tmp / "naive").mkdir()
            (tmp / "hud" / f"test_{suite}.py").write_text(hud_src.format(**fill))
            (tmp / "naive" / f"test_{suite}_naive.py").write_text(naive_src.format(**fill))
            base = [sys.executable, "-m", "pytest", "-q", "-n", workers]
            hud, naive, hud_cpu, naive_cpu, notes = [], [], [], [], set()
            before, before_cpu = [], []
            if before_tree is not None:
                (tmp / "before").mkdir()
                (tmp / "before" / f"test_{suite}.py").write_text(hud_src.format(**fill))
                check_package(sys.executable, before_tree, cwd=tmp / "before", env=before_env)
            width = max(1, int(workers))  # -n 0: one process, one slot
            for _ in range(args.repeats):  # the naive side first: both find the same warm disk cache
                wall, cpu, _ = timed(base + ["-p", "no:hud", str(tmp / "naive")], tmp / "naive")
                naive.append(wall)
                naive_cpu.append(cpu)
                wall, cpu, out = timed(base + [f"--hud-width={width}", f"--hud-results={tmp / 'r.jsonl'}",
                                               str(tmp / "hud")], tmp / "hud")
                hud.append(wall)
                hud_cpu.append(cpu)
                notes.update(re.findall(r"--hud-inline=auto: (each worker steps its own env)", out))
                if before_tree is not None:
                    wall, cpu, _ = timed(base + [f"--hud-width={width}", f"--hud-results={tmp / 'b.jsonl'}",
                                                 str(tmp / "before")], tmp / "before", env=before_env)
                    before.append(wall)
                    before_cpu.append(cpu)
        where = "envs in the workers (inline)" if notes else "shared bridge"
        rows.append((f"{suite} -n {workers}", min(naive), min(hud), where))
        print(f"  {rows[-1][0]:<16} naive {min(naive):6.2f} s  pytest-hud {min(hud):6.2f} s  "
              f"naive / pytest-hud {min(naive) / min(hud):5.2f}  ({where}; first run {hud[0]:.2f} s: "
              f"{min(naive) / hud[0]:.2f})\n{'':18}CPU (median) naive {statistics.median(naive_cpu):6.2f} s  "
              f"pytest-hud {statistics.median(hud_cpu):6.2f} s  naive / pytest-hud "
              f"{statistics.median(naive_cpu) / statistics.median(hud_cpu):5.2f}", flush=True)
        if before:
            print(f"{'':18}pytest-hud at {args.before}: {min(before):6.2f} s, naive / it {min(naive) / min(before):5.2f} "
                  f"(first run {before[0]:.2f} s); CPU (median) {statistics.median(before_cpu):6.2f} s, "
                  f"naive / it {statistics.median(naive_cpu) / statistics.median(before_cpu):5.2f}", flush=True)


if __name__ == "__main__":
    main()
