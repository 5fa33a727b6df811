"""``python -m pytest_hud.serving --policy SPEC``: the policy server's command line and process.

Apart from :mod:`pytest_hud.serving.server` because a process's concerns (arguments, the key from
the environment, loading the model, the announce file, exiting with the parent or the lease) are
not the protocol's: an embedded :class:`~pytest_hud.serving.server.PolicyServer` has none of them.

A key: the server takes one from ``--api-key``, else ``PYTEST_HUD_SECRET`` (the run secret, which
pytest-hud sets only for the servers it starts, and which its workers send), else the
``PYTEST_HUD_POLICY_KEY`` environment variable (a key of your own for a server you start). Bound
beyond loopback (``--host 0.0.0.0``, a LAN address), the server refuses to start without a key.
Prefer the environment variable to ``--api-key``, which other users of the host can read in ``ps``.

Once bound, the server writes its announce file (mode 0600, atomic)
``{"ws": PORT, "pid": PID, "host": HOST, "url": "ws://HOST:PORT"}`` and exits by itself when its
parent process dies (``--parent-pid``, default: the process that started it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
from typing import Any

from pytest_hud.agent.remote import API_KEY_ENV
from pytest_hud.launch.announce import parent_alive, write_announce
from pytest_hud.serving.batcher import DEFAULT_WINDOW_SHARE, MAX_WINDOW_S
from pytest_hud.serving.loading import check_contract, load_ahead, load_server_policy, wait_for_contract
from pytest_hud.serving.server import PolicyServer, key_required_error

__all__ = ["SECRET_ENV", "main", "parse_args", "run"]

SECRET_ENV = "PYTEST_HUD_SECRET"  # the run secret the pool hands its children (the default key)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The server's arguments (validated further by :func:`main`, which knows the environment too)."""
    p = argparse.ArgumentParser(
        prog="python -m pytest_hud.serving.server",
        description="Serve one policy to many clients over the openpi protocol, batching their requests.",
    )
    p.add_argument("--policy", required=True,
                   help="A LeRobot checkpoint directory, 'module:factory' or 'path/to/file.py:factory'")
    p.add_argument("--port", type=int, default=8000, help="Port to bind (0: any free port; default 8000)")
    p.add_argument("--host", default="127.0.0.1", help="Interface to bind (loopback by default)")
    contract = p.add_mutually_exclusive_group()
    contract.add_argument("--contract", default=None,
                          help="Load the policy for this contract.json (checked up front)")
    contract.add_argument("--contract-wait", default=None, metavar="PATH",
                          help="Start now: import what the policy needs, then wait for PATH (a contract.json "
                               "written later) and load the policy for it (pytest-hud's pool starts its "
                               "servers this way while the sim boots)")
    p.add_argument("--batch-window-ms", type=float, default=2.0,
                   help="How long the first waiting request waits for others to join its batch (at least)")
    p.add_argument("--batch-window-share", type=float, default=DEFAULT_WINDOW_SHARE,
                   help="Wait up to this share of a recent forward's time instead, when that is longer "
                        f"(at most {MAX_WINDOW_S * 1000:g} ms; 0: always --batch-window-ms)")
    p.add_argument("--max-batch", type=int, default=0,
                   help="Run a batch as soon as this many requests wait (0: no limit)")
    p.add_argument("--announce", default=None, help="Write the announce JSON here (mode 0600) once serving")
    p.add_argument("--device", default="cpu", help="Torch device for LeRobot checkpoints")
    p.add_argument("--rename", type=json.loads, default=None, metavar="JSON",
                   help='A LeRobot checkpoint\'s inputs under other names: {"OBS": "FEATURE", ...}')
    p.add_argument("--threads", type=int, default=0,
                   help="Torch intra-op threads for the model (0: torch's default, one per core)")
    p.add_argument("--parent-pid", type=int, default=None,
                   help="Exit when this process dies (default: the parent process)")
    p.add_argument("--lease", type=float, default=None,
                   help="Exit when the controller has not renewed the lease for this many seconds "
                        "(for servers on other machines; the lease secret comes from $PYTEST_HUD_SECRET)")
    p.add_argument("--api-key", default=None,
                   help=f"Require this key from clients (default: ${SECRET_ENV}, else ${API_KEY_ENV}; "
                        "required beyond loopback). Prefer the environment variable: ps shows arguments")
    return p.parse_args(argv)


async def _serve(args: argparse.Namespace, model: Any, parent: int) -> int:
    """Serve ``model`` until a signal, the parent's death or the lease's end; the exit code."""
    server = PolicyServer(
        model,
        batch_window_s=args.batch_window_ms / 1000.0,
        window_share=args.batch_window_share,
        max_batch=args.max_batch,
        metadata={"policy": args.policy},
        name=args.policy,
        api_key=args.api_key,
    )
    try:
        port = await server.start(args.host, args.port)
    except PermissionError as exc:
        print(f"pytest-hud policy server: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"pytest-hud policy server: cannot bind {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    payload = {"ws": port, "pid": os.getpid(), "host": args.host, "url": f"ws://{args.host}:{port}"}
    lease = None
    if args.lease is not None:
        from pytest_hud.launch.lease import Lease

        lease = Lease(args.host, args.lease_secret, args.lease)
        payload["lease"] = lease.port
    if args.announce:
        write_announce(args.announce, payload)
    print(f"pytest-hud policy server: serving {args.policy} on ws://{args.host}:{port} "
          f"(pid {os.getpid()}, {'key required' if server.api_key else 'no key'})", file=sys.stderr, flush=True)
    try:
        while not stop.is_set():
            if parent > 1 and not parent_alive(parent):
                break
            ended = lease.expired() if lease is not None else None
            if ended:
                print(f"pytest-hud policy server: exiting: {ended}", file=sys.stderr, flush=True)
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)
    finally:
        if args.announce:
            with contextlib.suppress(OSError):
                os.unlink(args.announce)
        await server.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    """The server process: the key and the model before binding (a refusal or a load failure exits 2
    before any client can connect), then :func:`_serve`; the exit code."""
    args = parse_args(argv)
    parent = args.parent_pid if args.parent_pid is not None else os.getppid()
    if args.lease is not None and not os.environ.get("PYTEST_HUD_SECRET"):
        print("pytest-hud policy server: --lease needs the run's secret in $PYTEST_HUD_SECRET", file=sys.stderr)
        return 2
    if args.batch_window_ms < 0 or args.max_batch < 0 or args.threads < 0 or not 0 <= args.batch_window_share <= 1:
        print("pytest-hud policy server: --batch-window-ms, --max-batch and --threads must be >= 0, "
              "--batch-window-share between 0 and 1", file=sys.stderr)
        return 2
    # The key: the flag, else the run secret a pytest-hud launcher passes (it beats a user's own key
    # that happens to be in the environment: the run's workers send the secret), else the user's.
    # Popped, so that nothing the policy starts inherits them.
    args.lease_secret = os.environ.get(SECRET_ENV, "")  # the lease is held with the run secret
    keys = [os.environ.pop(SECRET_ENV, None), os.environ.pop(API_KEY_ENV, None)]
    args.api_key = args.api_key or next((key for key in keys if key), None)
    if args.api_key is None and (refusal := key_required_error(args.host)):
        print(f"pytest-hud policy server: {refusal}", file=sys.stderr)  # before loading a model
        return 2
    from pytest_hud.agent.lerobot import offline

    offline()  # a checkpoint is a local folder; never reach out
    try:
        from pytest_hud.agent.model import policy_spec

        spec = policy_spec(args.policy)  # parsed once: both loads dispatch on its kind
        model = None
        if args.contract_wait:
            model = load_ahead(spec, args.device, args.rename)  # while the sims boot
            if not wait_for_contract(args.contract_wait, parent):
                return 0  # the run ended before any worker needed this server
            args.contract = args.contract_wait
        if model is None:
            model = load_server_policy(spec, args.contract, args.device, args.rename)
        elif args.contract:
            check_contract(model, args.contract)
    except Exception as exc:  # noqa: BLE001 - any load failure is reported the same way
        print(f"pytest-hud policy server: cannot load policy {args.policy!r}: {type(exc).__name__}: {exc}",
              file=sys.stderr)
        return 2
    if args.threads and "torch" in sys.modules:
        # On a CPU shared with sims and workers, torch's one-thread-per-core default can spin-wait
        # itself to a crawl; a small model often runs best on one thread.
        sys.modules["torch"].set_num_threads(args.threads)
    return asyncio.run(_serve(args, model, parent))


def run() -> None:
    """Run :func:`main` and exit at once with its code (what ``python -m`` runs)."""
    # os._exit: a forward still running on the worker thread (or a library's non-daemon thread)
    # must not keep an orphaned server alive.
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
