"""Worker CPU per step of pytest-hud's own code (policy and sim excluded), before vs after, in one run.

    python benchmarks/worker_cpu.py [--before REF] [--episodes 20] [--repeat 3] [--sim Pendulum-v1]

One bridge (this checkout's) serves ``--sim`` at width 1. A worker process, like an xdist worker,
runs episodes with ``Agent.run`` (the blocking slot client, the episode loop with the bridge's
timeouts armed, and the video recorder a pytest run opens by default when PyAV is installed)
and a policy that returns zeros. The worker's CPU time (``time.process_time``: all its threads)
minus the policy's own CPU time, divided by the steps, is what pytest-hud costs a worker per
step; claims and grading are included, amortised over each episode's steps. The sim runs in the
bridge process and is not counted.

``--before REF`` runs the same worker with the package from ``git archive REF`` (e.g. ``main``),
interleaved with this checkout's. Not a test: only side-by-side figures mean anything.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from git_ref import extract_package

ROOT = Path(__file__).resolve().parent.parent


def worker(announce: str, episodes: int, video_dir: str, transport: str = "any") -> None:
    """Runs in a subprocess with the package under test first on ``sys.path``."""
    import numpy as np

    from pytest_hud.agent import Agent
    from pytest_hud.client import BridgeAddress, ControlClient
    from pytest_hud.episode import Episode

    import dataclasses

    address = BridgeAddress.from_announce(announce)
    if transport == "tcp":
        address = dataclasses.replace(address, ws_unix=None)
    control = ControlClient(address)
    contract = control.contract()
    zero = np.zeros(contract.action.shape, np.float32)
    policy_cpu = [0.0]

    class Zeros:
        def predict(self, observation, prompt=None):
            t0 = time.thread_time()
            out = zero.copy()
            policy_cpu[0] += time.thread_time() - t0
            return out

    observers = []
    try:
        import av  # noqa: F401 - a pytest run opens the video recorder by default when PyAV is here

        from pytest_hud.report.video import VideoRecorder

        observers.append(VideoRecorder(video_dir, "failed"))
    except ImportError:
        pass
    agent = Agent(Zeros(), first_action_timeout=300.0, step_timeout=30.0, recv_timeout=360.0,
                  observers=observers)
    agent.run(Episode(control, contract, seed=0))  # warm-up: imports, first connection
    policy_cpu[0] = 0.0
    steps = 0
    start = os.times()
    c0 = time.process_time()
    for seed in range(1, episodes + 1):
        steps += agent.run(Episode(control, contract, seed=seed)).steps
    cpu = time.process_time() - c0
    times = os.times()
    for recorder in observers:
        recorder.close(30)
    control.close()
    print(json.dumps({"steps": steps, "cpu": cpu, "policy": policy_cpu[0],
                      "user": times.user - start.user, "system": times.system - start.system,
                      "observers": [type(o).__name__ for o in observers]}))



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--before", help="Also measure the worker code of this git ref (e.g. main)")
    parser.add_argument("--sim", default="Pendulum-v1")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tcp-too", action="store_true",
                        help="Also run this checkout's worker over TCP instead of the bridge's Unix socket")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), args.worker[2], args.worker[3])
        return
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        announce = workdir / "bridge.json"
        env = dict(os.environ, SDL_VIDEODRIVER="dummy", PYTHONPATH=str(ROOT))
        bridge = subprocess.Popen([sys.executable, "-m", "pytest_hud.sim", args.sim, "--width", "1",
                                   "--announce", str(announce)], env=env, cwd=workdir)
        try:
            while not announce.exists():
                if bridge.poll() is not None:
                    raise SystemExit("the bridge failed to start")
                time.sleep(0.02)
            time.sleep(0.05)
            setups = [("this checkout", ROOT, "any")]
            if args.tcp_too:
                setups.append(("this over TCP", ROOT, "tcp"))
            if args.before:
                setups.insert(0, (f"before ({args.before})", extract_package(args.before, workdir / "before"), "any"))
            results: dict[str, list[float]] = {label: [] for label, _, _ in setups}
            for _ in range(args.repeat):
                for label, root, transport in setups:
                    out = subprocess.run(
                        [sys.executable, __file__, "--worker", str(announce), str(args.episodes),
                         str(workdir / "videos"), transport],
                        env=dict(env, PYTHONPATH=str(root)), capture_output=True, text=True)
                    if out.returncode != 0:
                        raise SystemExit(f"{label}: the worker failed:\n{out.stderr[-3000:]}")
                    r = json.loads(out.stdout.strip().splitlines()[-1])
                    us = (r["cpu"] - r["policy"]) / r["steps"] * 1e6
                    results[label].append(us)
                    user, system = (r["user"] - r["policy"]) / r["steps"] * 1e6, r["system"] / r["steps"] * 1e6
                    print(f"{label:<18} worker CPU {us:6.1f} µs/step of pytest-hud code "
                          f"(user {user:5.1f} + system {system:5.1f}; {r['steps']} steps; policy {r['policy'] / r['steps'] * 1e6:.1f} µs/step excluded; "
                          f"observers: {', '.join(r['observers']) or 'none'})", flush=True)
        finally:
            bridge.terminate()
            bridge.wait(10)
    print("median over runs:")
    medians = {label: sorted(v)[len(v) // 2] for label, v in results.items()}
    for label, value in medians.items():
        print(f"  {label:<18} {value:6.1f} µs/step")
    if args.before:
        before = medians[f"before ({args.before})"]
        print(f"  before / this checkout: x{before / medians['this checkout']:.2f}")


if __name__ == "__main__":
    main()
