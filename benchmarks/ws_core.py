"""The WebSocket stack end to end: real suites under this checkout against a git ref, side by side.

    HF_HUB_OFFLINE=1 SDL_VIDEODRIVER=dummy MUJOCO_GL=egl \\
        .venv-lr/bin/python benchmarks/ws_core.py --before REF [--suites pusht,metaworld-pixels] \\
        [--width 2] [--rounds 2]

``REF`` is the tree to compare with (e.g. the last commit whose bridge and worker client ran the
hand-written WebSocket core, before websockets' sans-I/O protocol replaced it). Each suite runs as
a user runs it, ``pytest SUITE -n W --hud-width=W`` in a subprocess, once per side and round, the
sides alternating (A B, B A, ...) on the same machine; only the ``pytest_hud`` package differs
(the ref's side runs in this tree with ``git archive REF``'s package in place of its own:
``git_ref.tree_with_package``).

- ``pusht``: ``evals/test_pusht.py`` (LeRobot's PushT from 96x96 pixels, an ACT checkpoint, 300
  steps an episode; ``--pusht-episodes``). Needs LeRobot and gym-pusht.
- ``metaworld-pixels``: ``evals/test_meta_world_pixels.py`` (MT10, a 128-px camera rendered every
  step, scripted experts). Needs Meta-World.

Per run: the wall time of the whole command, and the bridge's CPU time (user + system, read from
``/proc`` every 50 ms until the bridge exits: the last 50 ms at most are missed) per slot-step (the
``steps`` of every episode in ``--hud-results``). Printed: each run, then per suite the median of
each side and the ratio checkout / ref (below 1: the checkout costs less).

Not a test: the machine may be shared, and only figures from one run, side by side, mean anything.
Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from git_ref import check_package, tree_with_package

ROOT = Path(__file__).resolve().parent.parent
TICK_S = os.sysconf("SC_CLK_TCK")
SUITES = {"pusht": "evals/test_pusht.py", "metaworld-pixels": "evals/test_meta_world_pixels.py"}


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(entry))
    return kids


def _bridge_pids(root: int) -> list[int]:
    """The bridge processes among ``root``'s descendants (``python -m pytest_hud.bridge`` or ``.sim``)."""
    kids, found, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        for kid in kids.get(pid, []):
            todo.append(kid)
            try:
                cmdline = Path(f"/proc/{kid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"pytest_hud.bridge" in cmdline or b"pytest_hud.sim" in cmdline:
                found.append(kid)
    return found


def _cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK_S  # utime + stime


def run_suite(python: str, suite: str, width: int, pythonpath: Path, scratch: Path, name: str,
              env: dict[str, str]) -> dict:
    results = scratch / f"{name}.jsonl"
    command = [python, "-m", "pytest", SUITES[suite], "-n", str(width), f"--hud-width={width}", "-q",
               "-p", "no:cacheprovider", f"--hud-results={results}"]
    env = dict(env, PYTHONPATH=str(pythonpath))
    cpu: dict[int, float] = {}
    started = time.perf_counter()
    with open(scratch / f"{name}.log", "w") as log:  # in the tree whose package it measures
        proc = subprocess.Popen(command, cwd=pythonpath, env=env, stdout=log, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            for pid in _bridge_pids(proc.pid):
                seconds = _cpu_s(pid)
                if seconds is not None:
                    cpu[pid] = seconds
            time.sleep(0.05)
    wall = time.perf_counter() - started
    steps = episodes = 0
    if results.is_file():
        for line in results.read_text().splitlines():
            record = json.loads(line)
            if record.get("steps"):
                steps += int(record["steps"])
                episodes += 1
    bridge = sum(cpu.values())
    return {"wall_s": wall, "bridge_cpu_s": bridge, "steps": steps, "episodes": episodes,
            "code": proc.returncode, "us_per_step": bridge / steps * 1e6 if steps else float("nan")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="Git ref whose pytest_hud is the other side")
    parser.add_argument("--suites", default=",".join(SUITES), help="Comma-separated: " + ", ".join(SUITES))
    parser.add_argument("--width", type=int, default=2, help="-n and --hud-width")
    parser.add_argument("--rounds", type=int, default=1, help="Runs of each side per suite")
    parser.add_argument("--pusht-episodes", type=int, default=8, help="PUSHT_EPISODES")
    parser.add_argument("--python", default=sys.executable, help="The interpreter that runs pytest")
    args = parser.parse_args(argv)
    suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    unknown = [s for s in suites if s not in SUITES]
    if unknown:
        parser.error(f"unknown suite(s) {', '.join(unknown)}: choose from {', '.join(SUITES)}")
    env = dict(os.environ, PUSHT_EPISODES=str(args.pusht_episodes))
    with tempfile.TemporaryDirectory(prefix="ws-core-") as tmp:
        scratch = Path(tmp)
        sides = {"checkout": ROOT, args.before: tree_with_package(args.before, scratch / "ref")}
        for tree in sides.values():
            check_package(args.python, tree)
        rows: dict[tuple[str, str], list[dict]] = {}
        for suite in suites:
            for round_ in range(args.rounds):
                order = list(sides) if round_ % 2 == 0 else list(sides)[::-1]
                for side in order:
                    row = run_suite(args.python, suite, args.width, sides[side], scratch,
                                    f"{suite}-{side.replace('/', '_')}-{round_}", env)
                    rows.setdefault((suite, side), []).append(row)
                    print(f"{suite:17} {side:10} round {round_}: wall {row['wall_s']:7.1f} s  bridge CPU "
                          f"{row['bridge_cpu_s']:6.1f} s over {row['steps']} slot-steps ({row['episodes']} "
                          f"episodes) = {row['us_per_step']:7.0f} µs/step  exit {row['code']}", flush=True)
        print(f"\nmedians, -n {args.width} --hud-width={args.width}; ratio checkout / {args.before}")
        for suite in suites:
            mine, theirs = rows[(suite, "checkout")], rows[(suite, args.before)]
            for key, label in (("wall_s", "suite wall s"), ("us_per_step", "bridge CPU µs/slot-step")):
                a = statistics.median(r[key] for r in mine)
                b = statistics.median(r[key] for r in theirs)
                print(f"  {suite:17} {label:24} checkout {a:9.1f}  {args.before} {b:9.1f}  x{a / b:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
