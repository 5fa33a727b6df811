"""The policy server's batching window with lockstep clients whose requests leave a few ms apart, one run.

    python benchmarks/batch_window.py [--before REF] [--clients 8] [--rounds 60] [--forward-ms 130]

What a bridge ticking in lockstep with a batched policy server looks like from the server: every
round, each of ``--clients`` callers sends one request and the round ends when all have their
reply (as a lockstep tick waits for every slot's action). The callers' sends are spread the way
8 xdist workers on 2 busy cores spread them: each waits a seeded random delay first (exponential,
mean 0.6 ms, and in 3 % of sends 3-12 ms more, as a worker the scheduler put aside). The spreads
this gives (median 1.5 ms, a tail past 5 ms) match those ``strace`` showed in a PushT run.

The model sleeps ``--forward-ms`` per forward plus 1 ms per row (a forward's time without its
CPU, so the machine's load barely moves the figures). A batch that splits costs the round a
second forward; so the mean forwards per round and the round time show what the window does:

- ``this checkout``: the window stretches to 10 % of a recent forward (up to 20 ms) and a batch goes
  at once when every open connection has a request waiting;
- ``this, share 0``: the same with ``--batch-window-share 0`` (the fixed 2 ms window, with the
  early start when every connection waits);
- ``--before REF``: the server of that git ref (e.g. a fixed 2 ms window and nothing else).

Not a test: only side-by-side figures mean anything.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from git_ref import extract_package
from serving import policy_server_stats, start_policy_server

ROOT = Path(__file__).resolve().parent.parent


class SleepyPolicy:
    """A forward of ``BENCH_FORWARD_MS`` (+1 ms per row), spent sleeping."""

    def __init__(self) -> None:
        self.forward_s = float(os.environ.get("BENCH_FORWARD_MS", "130")) / 1000.0

    def predict_batch(self, observations, prompts):
        time.sleep(self.forward_s + 0.001 * len(observations))
        return [np.zeros((10, 2), np.float32) + float(np.asarray(o["state"])[0]) for o in observations]

    def predict(self, observation, prompt=None):
        return self.predict_batch([observation], [prompt])[0]


def make_policy() -> SleepyPolicy:
    return SleepyPolicy()


def delays(seed: int, clients: int, rounds: int) -> np.ndarray:
    """Each caller's wait before its send, per round (seconds)."""
    rng = np.random.default_rng(seed)
    base = rng.exponential(0.0006, (rounds, clients))
    put_aside = rng.random((rounds, clients)) < 0.03
    return base + put_aside * rng.uniform(0.003, 0.012, (rounds, clients))


def lockstep(url: str, clients: int, rounds: int, seed: int) -> tuple[float, float]:
    """(seconds per round, forwards per round) over ``rounds`` lockstep rounds."""
    from pytest_hud.agent.remote import RemotePolicy

    wait = delays(seed, clients, rounds)
    tick = threading.Barrier(clients + 1)
    errors: list[BaseException] = []

    def caller(i: int) -> None:
        try:
            with RemotePolicy(url, timeout=120) as policy:
                policy.connect()
                tick.wait()
                for r in range(rounds):
                    tick.wait()  # the tick's observations are out
                    time.sleep(wait[r, i])
                    policy.predict({"state": np.array([i, r], np.float32)})
                    tick.wait()  # every action is in
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
            tick.abort()

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    tick.wait()
    before = policy_server_stats(url)["forwards"]
    started = time.perf_counter()
    for _ in range(rounds):
        tick.wait()
        tick.wait()
    elapsed = time.perf_counter() - started
    for t in threads:
        t.join(60)
    if errors:
        raise SystemExit(f"a caller failed: {errors[0]!r}")
    return elapsed / rounds, (policy_server_stats(url)["forwards"] - before) / rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", help="Also measure the policy server of this git ref (e.g. main)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--forward-ms", type=float, default=130.0)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    env = dict(os.environ, BENCH_FORWARD_MS=str(args.forward_ms))
    results: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        setups = [("this checkout", ROOT, []), ("this, share 0", ROOT, ["--batch-window-share", "0"])]
        if args.before:
            setups.append((f"before ({args.before})", extract_package(args.before, workdir / "before"), []))
        for repeat in range(args.repeat):
            for label, package, extra in setups:
                path = os.pathsep.join([str(package), str(ROOT / "benchmarks")])
                proc, url = start_policy_server(f"{Path(__file__).resolve()}:make_policy", extra,
                                                dict(env, PYTHONPATH=path), workdir)
                try:
                    # the same delays for every setup within a repeat
                    results.setdefault(label, []).append(lockstep(url, args.clients, args.rounds, seed=repeat))
                finally:
                    proc.terminate()
                    proc.wait(30)
                per_round, forwards = results[label][-1]
                print(f"{label:<20} {per_round * 1000:7.1f} ms per round   {forwards:4.2f} forwards per round",
                      flush=True)
    print(f"{args.clients} lockstep clients, {args.rounds} rounds x {args.repeat}, forward {args.forward_ms:g} ms "
          "+ 1 ms per row; medians:")
    medians = {label: (float(np.median([r for r, _ in runs])), float(np.median([f for _, f in runs])))
               for label, runs in results.items()}
    for label, (per_round, forwards) in medians.items():
        print(f"  {label:<20} {per_round * 1000:7.1f} ms per round   {forwards:4.2f} forwards per round")
    if args.before:
        before = medians[f"before ({args.before})"][0]
        print(f"  round time, before / this checkout: x{before / medians['this checkout'][0]:.2f}")


if __name__ == "__main__":
    main()
