"""Worker CPU per step of pytest-hud's own code (policy and sim excluded), before vs after, in one run.

    python benchmarks/worker_cpu.py [--before REF] [--episodes 20] [--repeat 3] [--sim Pendulum-v1]

One bridge (this checkout's) serves ``--sim`` at width 1. A worker process, like an xdist worker,
runs episodes with ``Agent.run`` (the blocking slot client, the episode loop with the bridge's
timeouts armed, and the video recorder a pytest run opens by default when PyAV is installed)
and a policy that returns one constant zero array. The worker's CPU time (``time.process_time``:
all its threads) minus the policy's (its calls timed apart, in a loop: timing each call costs two
system calls, more than the call), divided by the steps, is what a worker spends per step; claims
and grading are included, amortised over each episode's steps. The sim runs in the
bridge process and is not counted.

What the kernel charges a process for waiting on a socket is in that figure too: each step the
worker sends, sleeps in ``recv`` until the bridge answers, and is woken, and on a virtual machine
that sleep and wake are expensive. So each round also runs a ``floor``: a bare client (a plain
socket, no WebSocket, no pytest-hud, frames the size of this sim's) against a peer process that
answers each message after the bridge's time per step, over the same transport (the bridge's Unix
socket, or TCP with ``--tcp-too``). It pays the same system calls and the same sleep and wake; the
worker's CPU less the floor's is pytest-hud's own code.

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
    from pytest_hud.client.protocol import action_frame
    from pytest_hud.client.bridge import BridgeAddress, ControlClient
    from pytest_hud.client.episode import Episode

    import dataclasses

    address = BridgeAddress.from_announce(announce)
    if transport == "tcp":
        address = dataclasses.replace(address, ws_unix=None)
    control = ControlClient(address)
    contract = control.contract()
    zero = np.zeros(contract.action.shape, np.float32)
    zero.flags.writeable = False

    class Zeros:  # one constant array: timing each call would cost more than the call (2 syscalls)
        def predict(self, observation, prompt=None):
            return zero

    policy = Zeros()
    calls = 20000
    t0 = time.process_time()
    for _ in range(calls):
        policy.predict(None)
    policy_cpu = [(time.process_time() - t0) / calls]  # per call, times the steps below

    observers = []
    try:
        import av  # noqa: F401 - a pytest run opens the video recorder by default when PyAV is here

        from pytest_hud.recording.video import VideoRecorder

        observers.append(VideoRecorder(video_dir, "failed"))
    except ImportError:
        pass
    agent = Agent(policy, first_action_timeout=300.0, step_timeout=30.0, recv_timeout=360.0,
                  observers=observers)
    agent.run(Episode(control, contract, seed=0))  # warm-up: imports, first connection
    steps = 0
    start = os.times()
    c0, w0 = time.process_time(), time.perf_counter()
    for seed in range(1, episodes + 1):
        steps += agent.run(Episode(control, contract, seed=seed)).steps
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    policy_cpu[0] *= steps
    times = os.times()
    for recorder in observers:
        recorder.close(30)
    control.close()
    print(json.dumps({"steps": steps, "cpu": cpu, "wall": wall, "policy": policy_cpu[0],
                      "sizes": [len(action_frame(zero)), _observation_bytes(contract)],
                      "user": times.user - start.user, "system": times.system - start.system,
                      "observers": [type(o).__name__ for o in observers]}))

def _observation_bytes(contract) -> int:
    """The size of one observation frame of this contract's arrays (what the bridge sends a step)."""
    import numpy as np

    from pytest_hud.wire.codec import pack_frame

    features = {name: np.zeros(f.shape, f.dtype) for name, f in contract.observation_features.items()}
    return len(pack_frame(features, 0.0, False, False, False))


def floor(transport: str, steps: int, reply_after: float, sizes: list[int]) -> None:
    """A bare blocking client against a peer that answers after ``reply_after`` seconds: the
    system calls and the sleep and wake of a step, with no WebSocket and no pytest-hud code."""
    import socket

    family = socket.AF_UNIX if transport == "unix" else socket.AF_INET
    server = socket.socket(family, socket.SOCK_STREAM)
    server.bind("\0pytest-hud-floor-%d" % os.getpid() if family == socket.AF_UNIX else ("127.0.0.1", 0))
    server.listen(1)
    peer_pid = os.fork()
    if peer_pid == 0:  # the peer: a bridge that steps for reply_after seconds, then answers
        try:
            server.settimeout(30)  # never outlives a client that failed before connecting
            conn, _ = server.accept()
            conn.settimeout(30)
            if family == socket.AF_INET:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reply = b"o" * sizes[1]
            while conn.recv(65536):
                until = time.perf_counter() + reply_after
                while time.perf_counter() < until:
                    pass
                conn.sendall(reply)
        finally:
            os._exit(0)
    client = socket.socket(family, socket.SOCK_STREAM)
    client.connect(server.getsockname())
    if family == socket.AF_INET:
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    action = b"a" * sizes[0]
    for _ in range(200):
        client.sendall(action)
        client.recv(262144)
    c0, start = time.process_time(), os.times()
    for _ in range(steps):
        client.sendall(action)
        client.recv(262144)
    cpu, times = time.process_time() - c0, os.times()
    client.close()
    os.waitpid(peer_pid, 0)
    print(json.dumps({"steps": steps, "cpu": cpu, "user": times.user - start.user,
                      "system": times.system - start.system}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--floor", help=argparse.SUPPRESS)
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
    if args.floor:
        spec = json.loads(args.floor)
        floor(spec["transport"], spec["steps"], spec["reply_after"], spec["sizes"])
        return
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        announce = workdir / "bridge.json"
        env = dict(os.environ, SDL_VIDEODRIVER="dummy", PYTHONPATH=str(ROOT))
        bridge = subprocess.Popen([sys.executable, "-m", "pytest_hud.bridge", args.sim, "--width", "1",
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
            floors = {"any": "floor, Unix", "tcp": "floor, TCP"}
            results: dict[str, list[float]] = {label: [] for label, _, _ in setups}
            results.update({floors[t]: [] for label, root, t in setups if root == ROOT})
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
                    print(f"{label:<18} worker CPU {us:6.1f} µs/step "
                          f"(user {user:5.1f} + system {system:5.1f}; {r['steps']} steps; policy {r['policy'] / r['steps'] * 1e6:.1f} µs/step excluded; "
                          f"observers: {', '.join(r['observers']) or 'none'})", flush=True)
                    if root != ROOT:
                        continue
                    # the floor: the same transport, frames and wait, without pytest-hud
                    spec = {"transport": "tcp" if transport == "tcp" else "unix", "steps": r["steps"],
                            "reply_after": max(r["wall"] - r["cpu"], 0.0) / r["steps"], "sizes": r["sizes"]}
                    out = subprocess.run([sys.executable, __file__, "--floor", json.dumps(spec)],
                                         capture_output=True, text=True)
                    if out.returncode != 0:
                        raise SystemExit(f"the floor failed:\n{out.stderr[-3000:]}")
                    f = json.loads(out.stdout.strip().splitlines()[-1])
                    results[floors[transport]].append(f["cpu"] / f["steps"] * 1e6)
                    print(f"{floors[transport]:<18} client CPU {f['cpu'] / f['steps'] * 1e6:6.1f} µs/step "
                          f"(user {f['user'] / f['steps'] * 1e6:5.1f} + system {f['system'] / f['steps'] * 1e6:5.1f}; "
                          f"a bare socket, {r['sizes'][0]} B out, {r['sizes'][1]} B back after "
                          f"{spec['reply_after'] * 1e6:.0f} µs)", flush=True)
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
    for label, transport in (("this checkout", "any"), ("this over TCP", "tcp")):
        if label in medians:
            own = medians[label] - medians[floors[transport]]
            print(f"  {label} less its floor: {own:6.1f} µs/step of pytest-hud's own code")


if __name__ == "__main__":
    main()
