"""Bridge CPU per slot-step, like for like: the same external lean client against each bridge.

    python benchmarks/bridge_cpu.py [--before REF] [--ticks 3000] [--repeat 2] [--no-hud] [--env null]
    python benchmarks/bridge_cpu.py --env pusht --vectorization processes --read-every 10 --no-hud --before REF

Workload: Pendulum-v1 at width 8, 8 slots driven by one lean client process (msgpack +
websockets, no pytest-hud import, zero actions). What counts is the CPU time (user + system) of
the *bridge process* over a measured window, divided by the slot-steps in it, so the client's own
cost cannot hide or inflate the bridge's. Per-thread figures (from ``/proc/PID/task``) show where
the bridge spends it: the sim's main thread vs the I/O loop thread; then user vs system time, and
how often the bridge's threads went to sleep (voluntary context switches) per slot-step. ``--env
null`` serves an env with Pendulum's spaces and a step that costs nothing
(``benchmarks/null_env.py``) on every bridge: what is left is each bridge's own machinery. ``--env
pusht`` serves LeRobot's PushT from pixels (``evals/sims/pusht.py``, needs gym-pusht; pytest-hud
bridges only), and ``--read-every K`` has the client mark the images of all but every K-th step
unread (``"render": false``), as a worker running an ACT with K-step chunks does.
``--vectorization processes`` puts the envs in one process per core; their CPU counts in the
bridge's (``env processes``).

Bridges, measured in turn, ``--repeat`` times, interleaved (the machine is shared and noisy):

- ``this checkout``: ``python -m pytest_hud.bridge Pendulum-v1 --width 8`` from this tree;
- ``--before REF``: the same command from ``git archive REF`` (e.g. ``--before main``);
- ``--unix``: this checkout's bridge again, the same client dialling its abstract Unix socket
  (what pytest-hud's own workers use on the bridge's host); a transport HUD's bridge lacks;
- ``hud GymBridge``: the HUD SDK's ``hud.environment.robot.GymBridge`` when ``hud`` is
  importable (in this interpreter or ``--hud-python``); skipped with the reason otherwise.

Not a test: only side-by-side figures from one run mean anything. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from git_ref import extract_package

ROOT = Path(__file__).resolve().parent.parent
TICK_S = os.sysconf("SC_CLK_TCK")
TICK = ["lockstep"]  # --tick for bridges that have the option (set from the command line)
# --env: what each bridge serves (pytest-hud's target, the HUD SDK's gymnasium id)
ENVS = {"pendulum": ("Pendulum-v1", "Pendulum-v1"),
        "null": (f"{ROOT / 'benchmarks' / 'null_env.py'}:make", "null_env:NullPendulum-v0"),
        "pusht": (f"{ROOT / 'evals' / 'sims' / 'pusht.py'}:make_pusht", None)}
ACTION_DIMS = {"pendulum": 1, "null": 1, "pusht": 2}
ENV = ["pendulum"]
VECTORIZATION = ["sync"]  # --vectorization for pytest-hud bridges


# ----------------------------------------------------------------- the lean client
def _pack_array(arr) -> dict:
    return {b"__ndarray__": True, b"data": arr.tobytes(), b"dtype": arr.dtype.str, b"shape": list(arr.shape)}


async def _lean_client(spec: dict) -> None:
    """Runs in its own process: ``width`` slots, zero actions; prints ``ready`` then ``done N``."""
    import msgpack
    import numpy as np
    from websockets.asyncio.client import connect, unix_connect

    width, ticks, warm = spec["width"], spec["ticks"], spec["warmup"]
    zeros = _pack_array(np.zeros(spec["action_dim"], np.float32))
    read_every = spec.get("read_every", 1)
    action = msgpack.packb({"actions": zeros})
    unread_action = msgpack.packb({"actions": zeros, "render": False})  # its image goes unread
    steps = [0]
    marks: dict[str, asyncio.Event] = {"go": asyncio.Event(), "stop": asyncio.Event()}
    claiming = asyncio.Lock()
    go_at = warm * width
    stop_at = (warm + ticks) * width

    async def control():  # both bridges: newline-delimited JSON-RPC 2.0 on a TCP port
        reader, writer = await asyncio.open_connection("127.0.0.1", spec["control"])
        ids = iter(range(1, 1 << 30))

        async def call(method, **params):
            writer.write((json.dumps({"jsonrpc": "2.0", "id": next(ids), "method": method,
                                      "params": params}) + "\n").encode())
            reply = json.loads(await reader.readline())
            if "error" in reply:
                raise RuntimeError(reply["error"]["message"])
            return reply["result"]

        if spec["kind"] == "pytest-hud":
            await call("hello", secret=spec["secret"])
        return call

    async def claim(call, seed: int) -> str:
        if spec["kind"] == "pytest-hud":
            return (await call("reset", seed=seed))["token"]
        while True:  # GymBridge: one global reset per batch; a freed slot waits for all to be free
            try:
                async with claiming:  # its concurrent first claims would each reset the batch
                    return (await call("reset"))["token"]
            except RuntimeError as exc:
                if "claimed" not in str(exc):
                    raise
                await asyncio.sleep(0.001)

    async def slot(i: int) -> None:
        call = await control()
        url = spec.get("ws") or (await call("url"))["url"]
        seed = i
        while not marks["stop"].is_set():
            token = await claim(call, seed)
            seed += width
            unix, options = spec.get("unix"), dict(compression=None, max_size=None, ping_interval=None)
            async with (unix_connect("\0" + unix[1:], url, **options) if unix else connect(url, **options)) as ws:
                await ws.recv()  # metadata
                await ws.send(msgpack.packb({"claim": token}))
                frame = msgpack.unpackb(await ws.recv())
                t = 0
                while not frame.get("terminated") and not frame.get("truncated") and not marks["stop"].is_set():
                    t += 1
                    await ws.send(action if t % read_every == 0 else unread_action)
                    frame = msgpack.unpackb(await ws.recv())
                    steps[0] += 1
                    if steps[0] == go_at:
                        print("ready", flush=True)
                        marks["go"].set()
                    elif steps[0] == stop_at:
                        print(f"done {steps[0] - go_at}", flush=True)
                        marks["stop"].set()
            await call("result", token=token)

    await asyncio.gather(*(slot(i) for i in range(width)))


# ----------------------------------------------------------------- the bridges
def _cpu(pid: int) -> dict[str, float]:
    """CPU seconds of ``pid``'s main thread (the sim) and its other threads (I/O loop), plus ``total``."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
            name = "main" if task.name == str(pid) else "other threads"
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        user, system = int(fields[11]) / TICK_S, int(fields[12]) / TICK_S
        out[name] = out.get(name, 0.0) + user + system
        out["user"] = out.get("user", 0.0) + user
        out["system"] = out.get("system", 0.0) + system
        try:  # each voluntary switch is one sleep and one wake-up of a thread
            status = (task / "status").read_text()
            out["sleeps"] = out.get("sleeps", 0.0) + int(status.split("voluntary_ctxt_switches:")[1].split()[0])
        except (OSError, IndexError, ValueError):
            pass
    children = 0.0  # the env processes (--vectorization processes) and anything they started
    stack = [pid]
    while stack:
        try:
            kids = Path(f"/proc/{stack.pop()}/task").glob("*/children")
            found = [int(k) for f in kids for k in f.read_text().split()]
        except OSError:
            continue
        for kid in found:
            try:
                fields = Path(f"/proc/{kid}/stat").read_text().rsplit(")", 1)[1].split()
                children += (int(fields[11]) + int(fields[12])) / TICK_S
            except OSError:
                continue
            stack.append(kid)
    if children:
        out["env processes"] = children
    out["total"] = out.get("main", 0.0) + out.get("other threads", 0.0) + children
    return out


HUD_BRIDGE = """
import sys
from hud.environment.robot.bridge import serve_bridge
from hud.environment.robot.gym import GymBridge
serve_bridge(GymBridge(sys.argv[2], num_envs=int(sys.argv[1]), contract=None))
"""


def hud_available(python: str) -> str | None:
    """None when ``python`` can import the HUD SDK's GymBridge, else the reason it cannot."""
    probe = subprocess.run([python, "-c", "import hud, hud.environment.robot.gym as g; g.GymBridge; "
                            "print(hud.__version__)"], capture_output=True, text=True)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return f"`hud` is not importable by {python} ({last}); pip install hud, or pass --hud-python"
    return None


def start(kind: str, code_root: Path | None, python: str, width: int, workdir: Path, unix: bool = False):
    """A bridge subprocess and what the client needs to reach it (``unix``: its Unix socket)."""
    env = dict(os.environ, SDL_VIDEODRIVER="dummy")
    if kind == "pytest-hud":
        env["PYTHONPATH"] = str(code_root)
        announce = workdir / f"bridge-{time.monotonic_ns()}.json"
        tick = []  # lockstep on every side, like the other bridges (older trees have no --tick)
        if '"--tick"' in (Path(code_root) / "pytest_hud" / "sim" / "__main__.py").read_text():
            tick = ["--tick", TICK[0]]
        proc = subprocess.Popen([python, "-m", "pytest_hud.bridge", ENVS[ENV[0]][0], "--width", str(width),
                                 "--vectorization", VECTORIZATION[0],
                                 "--announce", str(announce), *tick], env=env, cwd=workdir)
        while not announce.exists():
            if proc.poll() is not None:
                raise SystemExit(f"the bridge from {code_root} failed to start")
            time.sleep(0.02)
        time.sleep(0.05)
        info = json.loads(announce.read_text())
        if unix and not info.get("ws_unix"):
            raise SystemExit(f"the bridge from {code_root} has no Unix socket (older tree, or not Linux)")
        return proc, {"control": info["control"], "ws": f"ws://127.0.0.1:{info['ws']}",
                      "secret": info["secret"], "unix": info.get("ws_unix") if unix else None}
    env["PYTHONPATH"] = str(ROOT / "benchmarks")  # null_env, for the gymnasium id that imports it
    proc = subprocess.Popen([python, "-c", HUD_BRIDGE, str(width), ENVS[ENV[0]][1]], env=env, cwd=workdir,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("HUD_SIM_PORT="):
            port = int(line.split("=", 1)[1])
            break
    else:
        raise SystemExit("the HUD SDK's GymBridge failed to start")
    threading.Thread(target=proc.stdout.read, daemon=True).start()  # keep its stdout drained
    return proc, {"control": port, "ws": None, "secret": None}


def measure(label: str, kind: str, code_root: Path | None, python: str, args, workdir: Path,
            unix: bool = False) -> dict:
    proc, where = start(kind, code_root, python, args.width, workdir, unix)
    spec = dict(where, kind=kind, width=args.width, ticks=args.ticks, warmup=args.warmup,
                action_dim=ACTION_DIMS[ENV[0]], read_every=args.read_every)
    client = subprocess.Popen([sys.executable, __file__, "--client", json.dumps(spec)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout is not None
        line = client.stdout.readline()
        if line.strip() != "ready":
            raise SystemExit(f"{label}: the client did not start ({line!r})")
        c0, w0 = _cpu(proc.pid), time.perf_counter()
        line = client.stdout.readline()
        c1, w1 = _cpu(proc.pid), time.perf_counter()
        steps = int(line.split()[1])
        client.wait(30)
    finally:
        client.kill()
        proc.terminate()
        proc.wait(10)
    per = {k: (c1[k] - c0.get(k, 0.0)) / steps * (1 if k == "sleeps" else 1e6) for k in c1}
    return {"label": label, "us": per, "rate": steps / (w1 - w0)}



def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--before", help="Also measure the bridge of this git ref (e.g. main)")
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--ticks", type=int, default=3000, help="Measured ticks per bridge")
    parser.add_argument("--warmup", type=int, default=300, help="Ticks before the measured window")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--no-hud", action="store_true", help="Skip the HUD SDK's GymBridge")
    parser.add_argument("--unix", action="store_true",
                        help="Also drive this checkout's bridge over its Unix socket, as same-host workers "
                             "do (the same client; HUD's bridge has no such socket, so that row is not like "
                             "for like with it)")
    parser.add_argument("--hud-python", default=sys.executable,
                        help="Interpreter with `hud` installed for the GymBridge run")
    parser.add_argument("--env", default="pendulum", choices=sorted(ENVS),
                        help="pendulum: Pendulum-v1; null: its spaces with a free step "
                             "(benchmarks/null_env.py), so the bridges' own cost shows; pusht: LeRobot's "
                             "PushT from pixels (gym-pusht; pytest-hud bridges only)")
    parser.add_argument("--vectorization", default="sync", choices=("sync", "processes"),
                        help="Vectorization of pytest-hud bridges (processes: their env processes' CPU counts)")
    parser.add_argument("--read-every", type=int, default=1,
                        help="The client reads the image of every K-th step and marks the others unread")
    parser.add_argument("--tick", default="lockstep", choices=("lockstep", "ready", "auto"),
                        help="Tick mode of pytest-hud bridges that have --tick (the others lockstep)")
    args = parser.parse_args()
    if args.read_every < 1:
        parser.error(f"--read-every must be at least 1 (1: the client reads every image), got {args.read_every}")
    TICK[0], ENV[0], VECTORIZATION[0] = args.tick, args.env, args.vectorization
    if ENVS[args.env][1] is None:
        args.no_hud = True  # no gymnasium id HUD's bridge could serve it as this one does
    if os.sep in args.hud_python:  # a path like .venv-hud/bin/python: the bridge starts in a temporary cwd
        args.hud_python = os.path.abspath(args.hud_python)
    if args.client:
        asyncio.run(_lean_client(json.loads(args.client)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        setups = [("this checkout", "pytest-hud", ROOT, sys.executable, False)]
        if args.unix:
            setups.append(("this, Unix socket", "pytest-hud", ROOT, sys.executable, True))
        if args.before:
            before = extract_package(args.before, workdir / "before")
            setups.insert(0, (f"before ({args.before})", "pytest-hud", before, sys.executable, False))
        if not args.no_hud:
            why = hud_available(args.hud_python)
            if why is None:
                setups.append(("hud GymBridge", "hud", None, args.hud_python, False))
            else:
                print(f"hud GymBridge          skipped: {why}")
        rows = []
        for _ in range(args.repeat):
            for label, kind, root, python, unix in setups:
                rows.append(measure(label, kind, root, python, args, workdir, unix))
                r = rows[-1]
                threads = "  ".join(f"{k} {r['us'][k]:6.1f}" for k in ("main", "other threads", "env processes",
                                                                        "user", "system")
                                    if r["us"].get(k, 0.0) > 0.5)
                threads += f"  sleeps/slot-step {r['us'].get('sleeps', 0.0):.2f}"
                print(f"{label:<22} bridge CPU {r['us']['total']:6.1f} µs/slot-step   "
                      f"{r['rate']:7.0f} slot-steps/s   [{threads}]", flush=True)
        print("median over runs:")
        medians = {}
        for label, *_ in setups:
            mine = sorted(r["us"]["total"] for r in rows if r["label"] == label)
            medians[label] = mine[len(mine) // 2]
            print(f"  {label:<22} {medians[label]:6.1f} µs/slot-step (runs: {', '.join(f'{v:.0f}' for v in mine)})")
        base = medians.get("this checkout")
        for label, value in medians.items():
            if label != "this checkout" and base:
                print(f"  {label} / this checkout: x{value / base:.2f}")


if __name__ == "__main__":
    main()
