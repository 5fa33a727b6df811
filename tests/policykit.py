"""Small policies for the policy-server tests (specs such as ``tests/policykit.py:echo``), and a
helper that starts the server as a subprocess.

numpy only: the server tests run in the core environment, without torch.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path

import msgpack
import numpy as np
import websockets
from websockets.asyncio.server import serve
from websockets.frames import CloseCode

from conftest import launch

REPO = Path(__file__).resolve().parents[1]

HORIZON = 3  # rows per action chunk


def expected_chunk(state: np.ndarray, prompt: str | None = None) -> np.ndarray:
    """What :class:`EchoPolicy` answers: row ``t`` is ``[*state, t, len(prompt)]``.

    Every caller sends a different state, so a reply that went to the wrong caller is detectable.
    """
    state = np.asarray(state, dtype=np.float32).reshape(-1)
    tail = [[t, len(prompt or "")] for t in range(HORIZON)]
    return np.concatenate([np.tile(state, (HORIZON, 1)), np.asarray(tail, np.float32)], axis=1)


class EchoPolicy:
    """A batched policy whose actions depend on each caller's observation and prompt.

    Each forward sleeps ``forward_s`` (a model's cost, so concurrent callers have time to pile up).
    An observation whose ``state[0]`` is negative makes it raise, as a policy fed garbage would.
    """

    metadata = {"robot": "policykit", "horizon": HORIZON}

    def __init__(self, forward_s: float = 0.005) -> None:
        self.forward_s = forward_s
        self.batch_sizes: list[int] = []

    def predict_batch(self, observations, prompts):
        self.batch_sizes.append(len(observations))
        time.sleep(self.forward_s)
        states = np.stack([np.asarray(obs["state"], np.float32) for obs in observations])
        if (states[:, 0] < 0).any():
            raise ValueError(f"state[0] must be >= 0, got {states[:, 0].min():g}")
        return [expected_chunk(state, prompt) for state, prompt in zip(states, prompts)]

    def predict(self, observation, prompt=None):
        return self.predict_batch([observation], [prompt])[0]


class LoopPolicy:
    """The same answers without ``predict_batch``: the server loops over ``predict``."""

    def predict(self, observation, prompt=None):
        state = np.asarray(observation["state"], np.float32)
        if state[0] < 0:
            raise ValueError("state[0] must be >= 0")
        return expected_chunk(state, prompt)


def echo() -> EchoPolicy:
    return EchoPolicy()


def loop() -> LoopPolicy:
    return LoopPolicy()


def slow() -> EchoPolicy:
    """A model whose forward takes 0.2 s."""
    return EchoPolicy(forward_s=0.2)


# ------------------------------------------------------------------------------ the server
def start_server(tmp_path: Path, policy: str, *extra: str, timeout: float = 60.0, env: dict | None = None):
    """Start ``python -m pytest_hud.serving`` and wait for its announce file; (process, announce)."""
    announce = tmp_path / f"policy-{time.monotonic_ns()}.json"
    proc, _ = launch([sys.executable, "-m", "pytest_hud.serving", "--policy", policy, "--port", "0",
                      *extra, "--announce", str(announce)], tmp_path, "policy server", timeout, cwd=REPO,
                      env=env)
    return proc, json.loads(announce.read_text())


def serve_waiting(tmp_path: Path, spec: str, *extra: str) -> tuple[subprocess.Popen, Path, Path]:
    """A server started as the pool prestarts one: ``--contract-wait`` on ``contract.json``, not written
    yet; (process, its announce path, the contract path)."""
    announce, contract = tmp_path / "policy.json", tmp_path / "contract.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_hud.serving", "--policy", spec, "--port", "0",
         "--contract-wait", str(contract), "--announce", str(announce), *extra],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTEST_HUD_SECRET"},
    )
    return proc, announce, contract


def write_atomically(path: Path, text: str) -> None:
    """Write ``path`` as the pool writes a contract: a temporary file in the same folder, then
    ``os.replace``, so a server polling for ``path`` never reads it half written."""
    part = path.with_name(f".{path.name}.{os.getpid()}.part")
    part.write_text(text)
    os.replace(part, path)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> dict:
    """The announce at ``path`` once it appears (the process must not exit first)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)
    return json.loads(path.read_text())


# ------------------------------------------------------------------------- openpi wire
def openpi_pack(obj):
    """openpi-client 0.1.2's ``msgpack_numpy.pack_array`` hook, as it behaves on the wire."""
    if isinstance(obj, np.ndarray):
        return {b"__ndarray__": True, b"data": obj.tobytes(), b"dtype": obj.dtype.str, b"shape": obj.shape}
    if isinstance(obj, np.generic):
        return {b"__npgeneric__": True, b"data": obj.item(), b"dtype": obj.dtype.str}
    return obj


def openpi_unpack(obj):
    if b"__ndarray__" in obj:
        return np.ndarray(buffer=obj[b"data"], dtype=np.dtype(obj[b"dtype"]), shape=obj[b"shape"])
    if b"__npgeneric__" in obj:
        return np.dtype(obj[b"dtype"]).type(obj[b"data"])
    return obj


def openpi_style_server(reply, metadata):
    """A server that behaves as openpi's ``WebsocketPolicyServer`` on the wire; (url, stop)."""
    ready = threading.Event()
    address: list = []
    loop = asyncio.new_event_loop()
    stopped = asyncio.Event()

    async def handler(ws):
        await ws.send(msgpack.packb(metadata, default=openpi_pack))
        while True:
            try:
                obs = msgpack.unpackb(await ws.recv(), object_hook=openpi_unpack)
                action = reply(obs)
                action["server_timing"] = {"infer_ms": 0.1}
                await ws.send(msgpack.packb(action, default=openpi_pack))
            except websockets.ConnectionClosed:
                break
            except Exception:
                await ws.send(traceback.format_exc())
                await ws.close(CloseCode.INTERNAL_ERROR, "Internal server error.")
                break

    async def main():
        async with serve(handler, "127.0.0.1", 0, compression=None, max_size=None) as server:
            address.append(server.sockets[0].getsockname()[1])
            ready.set()
            await stopped.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(10)

    def stop_server():
        loop.call_soon_threadsafe(stopped.set)
        thread.join(10)

    return f"ws://127.0.0.1:{address[0]}", stop_server
