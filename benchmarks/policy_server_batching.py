"""Batching speed-up of the policy server: coalesced forwards vs one forward per request, one run.

    python benchmarks/policy_server_batching.py [--device cuda] [--clients 8] [--requests 200]

A torch MLP policy (``--width`` hidden units, ``--layers`` layers, an action chunk of 10×7) served by
``python -m pytest_hud.serving`` twice: with the default 2 ms batching window, and with
``--max-batch 1`` (every request its own forward). ``--clients`` threads each send ``--requests``
observations through :class:`pytest_hud.agent.remote.RemotePolicy`. Prints requests/s for both,
their ratio, and the server's mean batch size. Needs torch; meaningful on a GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pytest_hud.agent.remote import RemotePolicy  # noqa: E402
from serving import policy_server_stats, start_policy_server  # noqa: E402

OBS_DIM, CHUNK, ACT_DIM = 64, 10, 7


class MLPPolicy:
    """predict_batch runs one forward for the whole batch on ``device``."""

    def __init__(self, device: str, width: int, layers: int) -> None:
        import torch

        self.torch = torch
        self.device = device
        mods: list = []
        dim = OBS_DIM
        for _ in range(layers):
            mods += [torch.nn.Linear(dim, width), torch.nn.GELU()]
            dim = width
        mods.append(torch.nn.Linear(dim, CHUNK * ACT_DIM))
        self.net = torch.nn.Sequential(*mods).to(device).eval()

    def predict_batch(self, observations, prompts):
        torch = self.torch
        x = torch.as_tensor(np.stack([o["state"] for o in observations]), device=self.device)
        with torch.inference_mode():
            y = self.net(x).reshape(len(observations), CHUNK, ACT_DIM)
        out = y.float().cpu().numpy()
        return list(out)

    def predict(self, observation, prompt=None):
        return self.predict_batch([observation], [prompt])[0]


def make_policy():
    return MLPPolicy(os.environ.get("BENCH_DEVICE", "cpu"), int(os.environ.get("BENCH_WIDTH", "2048")),
                     int(os.environ.get("BENCH_LAYERS", "6")))


def hammer(url: str, clients: int, requests: int) -> float:
    def client(i: int) -> None:
        policy = RemotePolicy(url, timeout=120)
        rng = np.random.default_rng(i)
        policy.predict({"state": rng.standard_normal(OBS_DIM).astype(np.float32)})  # connect + warm-up
        barrier.wait()
        for _ in range(requests):
            policy.predict({"state": rng.standard_normal(OBS_DIM).astype(np.float32)})
        policy.close()

    barrier = threading.Barrier(clients + 1)
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    return clients * requests / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=6)
    args = parser.parse_args()
    env = dict(os.environ, BENCH_DEVICE=args.device, BENCH_WIDTH=str(args.width), BENCH_LAYERS=str(args.layers),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    rates = {}
    with tempfile.TemporaryDirectory() as workdir:
        for label, extra in (("batched (default window)", []), ("one forward per request", ["--max-batch", "1"])):
            proc, url = start_policy_server(f"{Path(__file__).resolve()}:make_policy", extra, env, Path(workdir))
            try:
                rates[label] = hammer(url, args.clients, args.requests)
                stats = policy_server_stats(url)
            finally:
                proc.terminate()
                proc.wait(30)
            mean_batch = stats["requests"] / max(1, stats["forwards"])
            print(f"{label:<26} {rates[label]:9.0f} requests/s   mean batch {mean_batch:5.2f}")
    (a, b) = rates.values()
    print(f"device {args.device}, MLP {args.layers}x{args.width}, {args.clients} clients: batching speed-up x{a / b:.2f}")


if __name__ == "__main__":
    main()
