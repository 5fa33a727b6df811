"""``python -m pytest_hud.bridge TARGET --width N``: serve a vectorized sim to many episodes.

The sim owns the main thread, and by default the control channel and the slot WebSockets are
served by an asyncio loop on that same thread, which calls the sim directly: a tick costs no
thread hand-off (two wake-ups and two GIL transfers, about a quarter of the bridge's CPU per step
on a cheap sim). With ``--io-thread`` the loop runs on a thread of its own and queues every sim
call to the main thread instead: the sockets stay responsive (pings answered, frames read) while a
single sim call runs for many seconds, at that CPU cost. Once both sockets are bound the bridge writes its announce file (mode
0600): ``{"control": PORT, "ws": PORT, "pid": PID, "width": N, "secret": SECRET}``, and on Linux
``"ws_unix": "@NAME"``, the same WebSocket on an abstract Unix socket that clients on this host
prefer. It exits by itself when its parent process dies, and removes the announce file on the way
out.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import sys
import threading

from pytest_hud.launch.announce import parent_alive, write_announce
from pytest_hud.bridge.mainthread import InlineExecutor, MainThreadExecutor
from pytest_hud.bridge.engine import DEFAULT_START_WINDOW, DEFAULT_TICK_WINDOW, TICK_MODES, resolve_tick
from pytest_hud.bridge.server import BridgeServer, Timeouts
from pytest_hud.sim.target import TargetError, load_sim

SECRET_ENV = "PYTEST_HUD_SECRET"
LOOP_ENV = "PYTEST_HUD_LOOP"  # "asyncio" forces the standard loop even where uvloop is installed


def new_event_loop() -> asyncio.AbstractEventLoop:
    """The serving thread's loop: uvloop when installed (``pytest-hud[fast]``), else asyncio's.

    uvloop runs the same sockets and protocols with less CPU per message; nothing on the wire
    changes. ``PYTEST_HUD_LOOP=asyncio`` opts out.
    """
    if os.environ.get(LOOP_ENV, "") != "asyncio":
        try:
            import uvloop
        except ImportError:
            pass
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def preload() -> None:
    """Import what a bridge imports before its sim's own module: this module's imports (asyncio,
    numpy, the wire), the event loop, and gymnasium where installed. A standby bridge calls it while
    the run starts (:mod:`pytest_hud.launch.standby`); nothing here reads the bridge's arguments or
    environment, which arrive later."""
    import importlib.util

    new_event_loop().close()
    if importlib.util.find_spec("gymnasium") is not None:
        import gymnasium  # noqa: F401


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m pytest_hud.bridge",
        description="Serve a vectorized simulator to concurrent episodes over the openpi/0 wire.",
    )
    p.add_argument("target", help="Gymnasium id, 'module:factory' or 'path/to/file.py:factory'")
    p.add_argument("--width", type=int, default=1, help="Number of slots (vectorized sub-envs)")
    p.add_argument("--announce", help="Write the announce JSON here (mode 0600) once serving")
    p.add_argument("--contract", help="Validate against this contract.json (and use its names)")
    p.add_argument("--save-contract", help="Write the derived contract.json here and continue")
    p.add_argument("--fps", type=float, help="Control rate in Hz recorded in the contract")
    p.add_argument("--vectorization", choices=("auto", "sync", "async", "processes", "threads"), default="auto",
                   help="How single envs are vectorized (auto: processes when an env's step takes 1 ms or "
                        "more and there are several slots and cores, else sync; sync: one after another in "
                        "this process; async: one process per slot; processes: one process per core, each "
                        "serving a block of slots; threads: the envs stepped on one thread per core, each "
                        "env always on the same thread)")
    p.add_argument("--check-threads", nargs="?", type=int, const=200, default=None, metavar="TICKS",
                   help="Serve nothing: run seeded episodes with random actions for TICKS ticks (default "
                        "200) with --vectorization sync and threads, compare everything, exit 0 if "
                        "identical, 1 naming the first difference")
    p.add_argument("--host", default="127.0.0.1", help="Interface to bind (loopback by default)")
    p.add_argument("--control-port", type=int, default=0, help="Control port (0: any free port)")
    p.add_argument("--ws-port", type=int, default=0, help="WebSocket port (0: any free port)")
    p.add_argument("--build-args", default="{}", help="JSON object of env-defining arguments")
    p.add_argument("--hold", choices=("zeros", "repeat"), default="zeros",
                   help="Action given to free, finished and disconnected slots")
    p.add_argument("--tick", choices=TICK_MODES, default="auto",
                   help="auto: ready where the slots are independent envs, else lockstep (and, with "
                        "--batched-policy when the slots step in parallel, lanes for processes, else "
                        "lockstep); lockstep: step when every episode has acted; ready: step the slots "
                        "whose actions are in; lanes: each env process steps when all of its own "
                        "episodes have acted, while the others step")
    p.add_argument("--batched-policy", action="store_true",
                   help="The episodes' actions come from one batching policy server (pytest's "
                        "--hud-policy-server): --tick auto then steps parallel slots in lockstep (each "
                        "env process on its own: lanes), so that the server's batches fill")
    p.add_argument("--start-together", type=int, default=0, metavar="N",
                   help="Hold each new episode's first observation until it and the running episodes are N "
                        "(the agents sharing this bridge), or --start-window seconds have passed: episodes "
                        "that start together ask a batching policy server together (0: start at once)")
    p.add_argument("--start-window", type=float, default=DEFAULT_START_WINDOW,
                   help="Seconds a held episode waits for the others (--start-together)")
    p.add_argument("--tick-window", type=float, default=DEFAULT_TICK_WINDOW,
                   help="Ready mode: seconds a tick waits for more actions after the first one arrives")
    p.add_argument("--io-thread", action="store_true",
                   help="Serve the sockets on a thread of their own, apart from the sim's (answers pings "
                        "and reads frames while one sim call runs for many seconds; more CPU per step)")
    p.add_argument("--claim-timeout", type=float, default=30.0, help="Seconds to send the claim frame")
    p.add_argument("--first-action-timeout", type=float, default=300.0,
                   help="Seconds for the first action (model warm-up)")
    p.add_argument("--step-timeout", type=float, default=30.0, help="Seconds for each later action")
    p.add_argument("--parent-pid", type=int, default=None,
                   help="Exit when this process dies (default: the parent process)")
    p.add_argument("--lease", type=float, default=None,
                   help="Exit when the controller has not renewed the lease for this many seconds "
                        "(for bridges on other machines; see pytest_hud.launch.lease)")
    return p.parse_args(argv)


def _check_threads(args: argparse.Namespace, build_args: dict) -> int:
    from pytest_hud.sim.threadcheck import check_threads

    if args.check_threads < 1:
        print(f"pytest-hud bridge: --check-threads takes a number of ticks >= 1, got {args.check_threads}",
              file=sys.stderr)
        return 2
    try:
        difference = check_threads(args.target, args.width, args.check_threads, build_args)
    except (TargetError, ValueError) as exc:
        print(f"pytest-hud bridge: {exc}", file=sys.stderr)
        return 2
    if difference is not None:
        print(f"pytest-hud bridge: {args.target}: {difference}", file=sys.stderr)
        return 1
    print(f"{args.target}: {args.check_threads} ticks at width {args.width} identical with --vectorization "
          "sync and threads (evidence, not proof: races need not show in every run)")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    parent = args.parent_pid if args.parent_pid is not None else os.getppid()
    try:
        build_args = json.loads(args.build_args)
        if not isinstance(build_args, dict):
            raise ValueError("not an object")
    except ValueError as exc:
        print(f"pytest-hud bridge: --build-args must be a JSON object ({exc})", file=sys.stderr)
        return 2
    if args.width < 1:
        print(f"pytest-hud bridge: --width must be at least 1, got {args.width}", file=sys.stderr)
        return 2
    if args.check_threads is not None:
        return _check_threads(args, build_args)
    try:
        sim = load_sim(args.target, args.width, args.vectorization, build_args, args.fps)
        contract = sim.contract()
        if args.contract:
            from pytest_hud.core.contract import Contract

            saved = Contract.load(args.contract)
            saved.check_matches(contract)
            sim.contract = lambda: saved  # type: ignore[method-assign]  # names from the file win
        if args.save_contract:
            contract.save(args.save_contract)
        if not args.tick_window >= 0:
            raise ValueError(f"--tick-window must be a non-negative number of seconds, got {args.tick_window}")
        if args.start_together < 0 or not args.start_window >= 0:
            raise ValueError(f"--start-together must be >= 0 and --start-window a non-negative number of seconds, "
                             f"got {args.start_together} and {args.start_window}")
        parallel = sim.lanes is not None and len(set(sim.lanes)) > 1
        tick = resolve_tick(args.tick, slot_step=sim.supports_slot_step, slot_reset=sim.supports_slot_reset,
                            batched_parallel=args.batched_policy and parallel, lane_ticks=sim.supports_lane_ticks)
    except (TargetError, ValueError) as exc:
        print(f"pytest-hud bridge: {exc}", file=sys.stderr)
        return 2

    secret = os.environ.pop(SECRET_ENV, None) or secrets.token_hex(16)
    executor: MainThreadExecutor | InlineExecutor = MainThreadExecutor() if args.io_thread else InlineExecutor()
    loop = new_event_loop()
    server = BridgeServer(
        sim,
        executor.submit_to,
        secret=secret,
        host=args.host,
        timeouts=Timeouts(args.claim_timeout, args.first_action_timeout, args.step_timeout),
        hold=args.hold,
        build_args=build_args,
        target=args.target,
        tick=tick,
        tick_window=args.tick_window,
        start_together=args.start_together,
        start_window=args.start_window,
        call=executor.call_to,
    )
    serving = _serve_on_thread(server, executor, loop, args) if args.io_thread else _serve_here(server, loop, args)
    if not serving:
        sim.close()
        return 2
    payload = {"control": server.control_port, "ws": server.ws_port, "pid": os.getpid(),
               "width": args.width, "secret": secret, "host": args.host,
               "vectorization": sim.vectorization, "tick": tick}  # as run: what auto chose
    if server.ws_unix:
        payload["ws_unix"] = server.ws_unix
    if sim.env_step_s is not None:
        payload["env_step_s"] = sim.env_step_s  # the pool weighs it against a round trip (--hud-inline)
    # whether a worker could step such a sim itself, and whether it renders images (--hud-inline)
    payload["cameras"] = len(sim.contract().cameras)
    payload["slot_envs"] = bool(sim.supports_slot_reset and sim.isolates_slots)
    if sim.vectorization_note:
        payload["vectorization_note"] = sim.vectorization_note
        print(f"pytest-hud bridge: --vectorization {sim.vectorization_note}", file=sys.stderr, flush=True)
    if sim.auto_choice:
        payload["vectorization_auto"] = sim.auto_choice
        print(f"pytest-hud bridge: --vectorization {sim.auto_choice}", file=sys.stderr, flush=True)
    lease = None
    if args.lease is not None:
        from pytest_hud.launch.lease import Lease

        lease = Lease(args.host, secret, args.lease)
        payload["lease"] = lease.port
    if args.announce:
        write_announce(args.announce, payload)
        unix = f" (on this host also {server.ws_unix})" if server.ws_unix else ""
        print(f"pytest-hud bridge: serving {args.target} with {args.width} slots: slot WebSockets at "
              f"ws://{args.host}:{server.ws_port}{unix}, control port {server.control_port}; "
              f"announce file {args.announce}", file=sys.stderr, flush=True)
    else:
        print(json.dumps({k: v for k, v in payload.items() if k != "secret"}), file=sys.stderr)

    def should_exit() -> bool:
        if parent > 1 and not parent_alive(parent):
            return True
        ended = lease.expired() if lease is not None else None
        if ended:
            print(f"pytest-hud bridge: exiting: {ended}", file=sys.stderr, flush=True)
            return True
        return False

    try:
        if isinstance(executor, MainThreadExecutor):
            signal.signal(signal.SIGTERM, lambda *_: executor.stop())
            signal.signal(signal.SIGINT, lambda *_: executor.stop())
            executor.run(poll=lambda: executor.stop() if should_exit() else None, poll_every=0.25)
        else:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, loop.stop)

            def watch() -> None:
                if should_exit():
                    loop.stop()
                else:
                    loop.call_later(0.25, watch)

            loop.call_later(0.25, watch)
            loop.run_forever()
    finally:
        if args.announce:
            try:
                os.unlink(args.announce)
            except OSError:
                pass
        if isinstance(executor, MainThreadExecutor):
            asyncio.run_coroutine_threadsafe(server.close(), loop)
        else:
            try:
                loop.run_until_complete(asyncio.wait_for(server.close(), 2.0))
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass
        try:
            sim.close()
        except Exception:  # noqa: BLE001 - best effort on the way out
            pass
    return 0


def _serve_here(server: BridgeServer, loop: asyncio.AbstractEventLoop, args: argparse.Namespace) -> bool:
    """Bind the sockets on this thread's loop (run later by ``main``); False if they cannot be bound."""
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(server.start(args.control_port, args.ws_port))
    except BaseException as exc:  # noqa: BLE001 - reported, exit code 2
        print(f"pytest-hud bridge: cannot bind sockets: {exc}", file=sys.stderr)
        return False
    return True


def _serve_on_thread(server: BridgeServer, executor: MainThreadExecutor, loop: asyncio.AbstractEventLoop,
                     args: argparse.Namespace) -> bool:
    """``--io-thread``: bind and serve the sockets on a loop in a background thread."""
    ready = threading.Event()
    failure: list[BaseException] = []

    def serve() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(server.start(args.control_port, args.ws_port))
        except BaseException as exc:  # noqa: BLE001 - reported on the main thread
            failure.append(exc)
            ready.set()
            executor.stop()
            return
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, name="hud-bridge-loop", daemon=True)
    thread.start()
    ready.wait()
    if failure:
        print(f"pytest-hud bridge: cannot bind sockets: {failure[0]}", file=sys.stderr)
        return False
    return True


def run() -> None:
    """Run :func:`main` and exit at once with its code (what ``python -m`` runs)."""
    # os._exit: a sim library's non-daemon threads must not keep an orphaned bridge alive.
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
