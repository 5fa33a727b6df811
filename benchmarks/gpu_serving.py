"""One batched policy server against one model copy per worker: LeRobot ACT and Diffusion, one run.

    python benchmarks/gpu_serving.py --device cuda                      # the GPU check (a few minutes)
    python benchmarks/gpu_serving.py --device cpu --quick               # a small CPU run (~1-2 min)

For each policy (``--policies act diffusion``) and each worker count N (``--workers 1 8 32``) it
measures, side by side:

- **server**: ``python -m pytest_hud.serving`` holds one copy of the model on ``--device``; N client
  processes (each a pytest worker's :class:`~pytest_hud.agent.remote.RemotePolicy`) send
  observations as fast as answers come back; the server coalesces them into batched forwards.
- **copies**: N processes each build their own copy of the model on ``--device`` and run batch-1
  forwards in a loop (what N xdist workers with an in-worker policy do).

Both run for ``--seconds`` after every process has warmed up. Printed (and written as JSON and a
Markdown table to ``--out``): requests answered per second, the server's forwards/s and mean batch,
and *policy-bound* episodes/hour (requests/s × ``n_action_steps`` / ``--episode-steps`` × 3600: what
the policy alone allows, the sim's time not counted), with the server/copies ratio.

The models are LeRobot's own classes built from their configs with random weights and no pretrained
backbone (nothing is downloaded): ACT with a ResNet18 camera at ``--image`` px, chunk 100; Diffusion
with its default UNet (down dims 512/1024/2048) and default 100 denoising steps at ``--image`` px.
ACT answers with ``predict_action_chunk``; Diffusion with ``generate_actions`` on an observation
history of the current frame repeated (an episode's first step: the same cost as any other step).
``--quick`` shrinks both (small ACT, small UNet, 2 denoising steps, 64 px) for a CPU smoke run.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

STATE_DIM, ACTION_DIM = 14, 14


# --------------------------------------------------------------------------------- the models
def _features(image: int) -> tuple[dict, dict]:
    from lerobot.configs.types import FeatureType, PolicyFeature

    inputs = {"observation.state": PolicyFeature(type=FeatureType.STATE, shape=(STATE_DIM,)),
              "observation.images.top": PolicyFeature(type=FeatureType.VISUAL, shape=(3, image, image))}
    return inputs, {"action": PolicyFeature(type=FeatureType.ACTION, shape=(ACTION_DIM,))}


class ServedModel:
    """A LeRobot policy with random weights behind the Model seam (``predict_batch``)."""

    def __init__(self, kind: str, device: str, image: int, quick: bool) -> None:
        import torch

        self.torch, self.kind, self.device, self.image = torch, kind, device, image
        torch.manual_seed(0)
        inputs, outputs = _features(image)
        if kind == "act":
            from lerobot.policies.act.configuration_act import ACTConfig
            from lerobot.policies.act.modeling_act import ACTPolicy

            extra = dict(dim_model=128, n_heads=4, dim_feedforward=512, chunk_size=20, n_action_steps=20) if quick else {}
            config = ACTConfig(input_features=inputs, output_features=outputs, device=device,
                               pretrained_backbone_weights=None, **extra)
            self.policy = ACTPolicy(config)
        elif kind == "diffusion":
            from lerobot.policies.diffusion.configuration_diffusion import DiffusionConfig
            from lerobot.policies.diffusion.modeling_diffusion import DiffusionPolicy

            extra = dict(down_dims=(64, 128), num_inference_steps=2) if quick else {}
            config = DiffusionConfig(input_features=inputs, output_features=outputs, device=device,
                                     pretrained_backbone_weights=None, crop_shape=None, **extra)
            self.policy = DiffusionPolicy(config)
        else:
            raise SystemExit(f"unknown policy {kind!r}: choose act or diffusion")
        self.policy.to(device).eval()
        self.config = self.policy.config
        self.n_action_steps = int(self.config.n_action_steps)
        self.parameters = sum(p.numel() for p in self.policy.parameters())

    def predict_batch(self, observations: list[dict[str, np.ndarray]], prompts: list[str | None]) -> list[np.ndarray]:
        torch = self.torch
        state = torch.from_numpy(np.stack([o["state"] for o in observations])).to(self.device)
        pixels = torch.from_numpy(np.stack([o["pixels"] for o in observations])).to(self.device)
        image = pixels.permute(0, 3, 1, 2).float().div_(255.0)  # HWC uint8 -> CHW in [0, 1], as LeRobot does
        with torch.inference_mode():
            if self.kind == "act":
                chunk = self.policy.predict_action_chunk({"observation.state": state,
                                                          "observation.images.top": image})
            else:
                n = self.config.n_obs_steps
                batch = {"observation.state": state.unsqueeze(1).expand(-1, n, -1),
                         "observation.images": image.unsqueeze(1).unsqueeze(1).expand(-1, n, 1, -1, -1, -1)}
                chunk = self.policy.diffusion.generate_actions(batch)
        out = chunk[:, : self.n_action_steps].float().cpu().numpy()
        return list(out)

    def predict(self, observation: dict[str, np.ndarray], prompt: str | None = None) -> np.ndarray:
        return self.predict_batch([observation], [prompt])[0]


def served_policy() -> ServedModel:
    """The server's factory (``--policy benchmarks/gpu_serving.py:served_policy``), set by BENCH_* variables."""
    env = os.environ
    return ServedModel(env["BENCH_POLICY"], env["BENCH_DEVICE"], int(env["BENCH_IMAGE"]), env.get("BENCH_QUICK") == "1")


def observation(rng: np.random.Generator, image: int) -> dict[str, np.ndarray]:
    return {"state": rng.standard_normal(STATE_DIM).astype(np.float32),
            "pixels": rng.integers(0, 256, (image, image, 3), dtype=np.uint8)}


# ------------------------------------------------------------------------------ the processes
def _run_phases(warm: Any, index: int, workers: list[int], barrier: Any, stop_at: Any, counts: Any) -> None:
    """A process's part in each phase: wait for its start, call ``warm()`` (one request) until
    ``stop_at`` if this process is one of the phase's first ``n``, report the count, wait for the end."""
    for n in workers:
        barrier.wait()
        done = 0
        if index < n:
            while time.monotonic() < stop_at.value:
                warm(done)
                done += 1
        counts[index] = done
        barrier.wait()


def _client(url: str, image: int, workers: list[int], index: int, barrier: Any, stop_at: Any, counts: Any) -> None:
    from pytest_hud.agent.remote import RemotePolicy

    rng = np.random.default_rng(index)
    frames = [observation(rng, image) for _ in range(4)]
    policy = RemotePolicy(url, timeout=600)
    policy.predict(frames[0])  # connect, and a first forward
    barrier.wait()
    _run_phases(lambda k: policy.predict(frames[k % 4]), index, workers, barrier, stop_at, counts)
    policy.close()


def _copy(kind: str, device: str, image: int, quick: bool, workers: list[int], index: int, barrier: Any,
          stop_at: Any, counts: Any) -> None:
    import torch

    torch.set_num_threads(1)
    model = ServedModel(kind, device, image, quick)
    rng = np.random.default_rng(index)
    frames = [observation(rng, image) for _ in range(4)]
    model.predict(frames[0])  # warm-up (cuDNN autotune, allocator)
    barrier.wait()
    _run_phases(lambda k: model.predict(frames[k % 4]), index, workers, barrier, stop_at, counts)


def _timed(ctx: Any, target: Any, args: tuple, workers: list[int], seconds: float, start_timeout: float,
           around: Any = None) -> list[float]:
    """Start ``max(workers)`` processes of ``target``; once all are warm, one phase per worker count
    ``n`` in which the first ``n`` run for ``seconds``: answered requests per second in each phase.
    ``around(phase, "before" | "after")`` is called as each phase starts and ends."""
    most = max(workers)
    barrier = ctx.Barrier(most + 1)
    stop_at = ctx.Value("d", 0.0)
    counts = ctx.Array("l", most)
    procs = [ctx.Process(target=target, args=(*args, workers, i, barrier, stop_at, counts), daemon=True)
             for i in range(most)]
    for proc in procs:
        proc.start()
    try:
        barrier.wait(timeout=start_timeout)  # every process is warm
    except Exception:
        for proc in procs:
            proc.kill()
        raise SystemExit(f"{most} processes of {target.__name__} did not warm up within {start_timeout:.0f} s "
                         "(out of memory? see their output above)") from None
    rates = []
    for k, n in enumerate(workers):
        if around:
            around(k, "before")
        stop_at.value = time.monotonic() + seconds  # the processes wait at the barrier: this is the last party
        barrier.wait(timeout=start_timeout)
        began = time.monotonic()
        barrier.wait(timeout=seconds + start_timeout)
        elapsed = time.monotonic() - began
        if around:
            around(k, "after")
        rates.append(sum(counts[:n]) / elapsed)
    for proc in procs:
        proc.join(60)
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        raise SystemExit(f"{len(bad)} of {most} {target.__name__} processes failed (exit codes {bad})")
    return rates


def measure(kind: str, workers: list[int], args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    from serving import policy_server_stats, start_policy_server

    env = {**os.environ, "BENCH_POLICY": kind, "BENCH_DEVICE": args.device, "BENCH_IMAGE": str(args.image),
           "BENCH_QUICK": "1" if args.quick else "0", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    rows = []
    fork, spawn = mp.get_context("fork"), mp.get_context("spawn")
    proc, url = start_policy_server(f"{Path(__file__).resolve()}:served_policy", ["--device", args.device], env,
                                    workdir, cwd=ROOT, timeout=args.start_timeout)
    stats: dict[tuple[int, str], dict] = {}
    try:
        served = _timed(fork, _client, (url, args.image), workers, args.seconds, args.start_timeout,
                        around=lambda k, when: stats.__setitem__((k, when), policy_server_stats(url)))
    finally:
        proc.terminate()
        proc.wait(30)
    for k, n in enumerate(workers):
        forwards = _delta(stats[k, "after"], stats[k, "before"], "forwards")
        requests = _delta(stats[k, "after"], stats[k, "before"], "requests")
        rows.append({"policy": kind, "workers": n, "mode": "server", "requests_per_s": served[k],
                     "forwards_per_s": forwards / args.seconds if forwards is not None else None,
                     "mean_batch": requests / forwards if forwards else None})
    copies = _timed(spawn, _copy, (kind, args.device, args.image, args.quick), workers, args.seconds, args.start_timeout)
    for n, rate in zip(workers, copies):
        rows.append({"policy": kind, "workers": n, "mode": "copies", "requests_per_s": rate,
                     "forwards_per_s": rate, "mean_batch": 1.0})
    probe = ServedModel(kind, "cpu", args.image, args.quick)  # its size and n_action_steps, for the table
    for row in rows:
        row.update(parameters=probe.parameters, n_action_steps=probe.n_action_steps, image=args.image,
                   device=args.device, episodes_per_hour=row["requests_per_s"] * probe.n_action_steps / args.episode_steps * 3600)
    return rows


def _delta(after: dict, before: dict, key: str) -> float | None:
    if key not in after or key not in before:
        return None
    return float(after[key]) - float(before[key])


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| policy | params | workers | server req/s | server fwd/s | mean batch | copies req/s | "
             "server ep/h | copies ep/h | server / copies |", "|" + "---|" * 10]
    for kind in dict.fromkeys(r["policy"] for r in rows):
        for n in dict.fromkeys(r["workers"] for r in rows if r["policy"] == kind):
            s = next(r for r in rows if r["policy"] == kind and r["workers"] == n and r["mode"] == "server")
            c = next(r for r in rows if r["policy"] == kind and r["workers"] == n and r["mode"] == "copies")
            fwd = "-" if s["forwards_per_s"] is None else f"{s['forwards_per_s']:.1f}"
            batch = "-" if s["mean_batch"] is None else f"{s['mean_batch']:.1f}"
            ratio = s["requests_per_s"] / c["requests_per_s"] if c["requests_per_s"] else float("nan")
            lines.append(f"| {kind} | {s['parameters'] / 1e6:.1f}M | {n} | {s['requests_per_s']:.1f} | {fwd} | {batch} | "
                         f"{c['requests_per_s']:.1f} | {s['episodes_per_hour']:.0f} | {c['episodes_per_hour']:.0f} | "
                         f"{ratio:.2f}x |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--policies", nargs="+", default=["act", "diffusion"])
    parser.add_argument("--workers", nargs="+", type=int, default=None, help="worker counts (default 1 8 32; quick: 1 2)")
    parser.add_argument("--seconds", type=float, default=None, help="measured time per row (default 6; quick: 3)")
    parser.add_argument("--image", type=int, default=None, help="camera size in px (default 224; quick: 64)")
    parser.add_argument("--episode-steps", type=int, default=400, help="env steps per episode, for episodes/hour")
    parser.add_argument("--start-timeout", type=float, default=300.0)
    parser.add_argument("--quick", action="store_true", help="small models, 2 worker counts, short rows (CPU smoke run)")
    parser.add_argument("--out", type=Path, default=None, help="folder for gpu_serving.json and gpu_serving.md")
    args = parser.parse_args()
    args.workers = args.workers or ([1, 2] if args.quick else [1, 8, 32])
    args.seconds = args.seconds or (3.0 if args.quick else 6.0)
    args.image = args.image or (64 if args.quick else 224)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    if args.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda, but torch sees no CUDA device (torch.cuda.is_available() is False); "
                             "run with --device cpu, or on a machine with an NVIDIA GPU and a CUDA build of torch")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.policies:
            started = time.monotonic()
            rows += measure(kind, args.workers, args, Path(tmp))
            print(f"# {kind}: measured in {time.monotonic() - started:.0f} s", flush=True)
            text = (f"policy server vs one copy per worker on {args.device} ({args.image} px, {args.seconds:g} s "
                    f"per row, episodes of {args.episode_steps} steps, policy-bound)\n\n" + table(rows))
            if args.out:  # after each policy: a run cut short keeps what it measured
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / "gpu_serving.json").write_text(json.dumps(rows, indent=2))
                (args.out / "gpu_serving.md").write_text(text + "\n")
    print(text, flush=True)

if __name__ == "__main__":
    main()
