"""LIBERO time per step with videos of failed episodes, a 10-step action chunk, renders skipped and
failed episodes replayed (now) against rendering every step (the way before), side by side in one
run through one real bridge (both 256-px cameras, width 1). Not a test.

A random policy never succeeds on LIBERO, so which episodes "failed" is set by the recorder here:
the share ``--failed`` of the episodes (by seed) gets a video, as a policy with that success rate
would. Encoding is left out on both sides (the recorder keeps the frames it would encode), so the
figures are what rendering and replaying cost. Two times per step taken by the policy: stepping
(each episode from its first observation to its last, plus every replay whole: its claim, reset and
steps) and the whole run (the episodes' resets too, which short episodes are dominated by).

    MUJOCO_GL=egl python benchmarks/libero_video_replay.py [--episodes 10] [--steps 30] [--failed 0.1 0.3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pytest_hud.agent.loop import Agent
from pytest_hud.client.bridge import BridgeAddress, ControlClient, SlotClient
from pytest_hud.client.episode import Episode
from pytest_hud.recording.video import VideoRecorder

SIM = Path(__file__).resolve().parents[1] / "evals" / "sims" / "libero.py"
TASK, CHUNK = "task_00", 10


class RandomChunks:
    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)

    def predict(self, obs, prompt=None):
        return self.rng.uniform(-1, 1, (CHUNK, 7)).astype(np.float32)


class PatientEpisode(Episode):
    """An episode whose slot may take minutes to answer its first observation (a LIBERO env's build
    and reset on a loaded machine), and whose replays are as patient."""

    def open_slot(self, recv_timeout: float) -> SlotClient:
        return SlotClient(self.address, self.token, connect_timeout=600, recv_timeout=recv_timeout)

    def rerun(self) -> Episode:
        return PatientEpisode(self.control, self.contract, **self.rerun_task())


class Videos(VideoRecorder):
    """The real recorder; an episode "failed" when its seed is among ``failed``; frames kept, not encoded."""

    def __init__(self, directory: Path, replays: bool, failed: set[int]) -> None:
        super().__init__(directory, "failed")
        self._replays, self.failed, self.frames, self._seed = replays, failed, 0, None

    @property
    def replays(self) -> bool:
        return self._replays

    def wants_replay(self, result, error) -> bool:
        return getattr(result, "seed", None) in self.failed

    def on_start(self, episode, observation):
        self._seed = episode.seed
        super().on_start(episode, observation)

    def on_end(self, episode, result, error):
        self._seed = episode.seed
        if result is not None:
            result.success = episode.seed not in self.failed
        super().on_end(episode, result, error)

    def _submit(self, frames, path):
        self.frames += len(frames)


class Clock:
    """Seconds spent stepping: from each episode's first observation (after its reset) to its last."""

    reads_images = False

    def __init__(self) -> None:
        self.stepping, self._t0, self._last = 0.0, 0.0, 0.0

    def on_start(self, episode, observation):
        self._t0 = self._last = time.perf_counter()

    def on_step(self, action, observation, inference_s):
        self._last = time.perf_counter()

    def on_end(self, episode, result, error):
        self.stepping += self._last - self._t0


class TimedAgent(Agent):
    """An agent that counts the seconds its replays take (claim, reset and every step rendered)."""

    replaying = 0.0

    def _replay(self, *args):
        t0 = time.perf_counter()
        super()._replay(*args)
        self.replaying += time.perf_counter() - t0


def run(address, episodes: int, steps: int, replays: bool, failed: set[int]) -> tuple[float, float, int]:
    """Seconds per step taken: the whole run's, and stepping's (replays included); video frames."""
    videos, clock = Videos(Path(tempfile.mkdtemp()), replays, failed), Clock()
    agent = TimedAgent(RandomChunks(), max_steps=steps, observers=[videos, clock], recv_timeout=600)
    t0, taken = time.perf_counter(), 0
    with ControlClient(address) as control:
        for seed in range(episodes):
            taken += agent.run(PatientEpisode(control, seed=seed, task=TASK)).steps
    return (time.perf_counter() - t0) / taken, (clock.stepping + agent.replaying) / taken, videos.frames


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=10)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--failed", type=float, nargs="+", default=[0.1, 0.3])
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    announce = tmp / "bridge.json"
    log = open(tmp / "bridge.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "pytest_hud.bridge", f"{SIM}:libero", "--width", "1",
                             "--announce", str(announce), "--parent-pid", str(os.getpid())], stdout=log, stderr=log)
    try:
        while not announce.exists():
            if proc.poll() is not None:
                raise RuntimeError((tmp / "bridge.log").read_text())
            time.sleep(0.05)
        address = BridgeAddress.from_announce(announce)
        with ControlClient(address) as control:  # build the task's env before timing anything
            Agent(RandomChunks(), max_steps=1, recv_timeout=600).run(PatientEpisode(control, seed=49, task=TASK))
        print(f"LIBERO libero_spatial/{TASK}, both 256-px cameras, {args.episodes} episodes of {args.steps} "
              f"steps, a chunk of {CHUNK}, videos of failed episodes (frames kept, not encoded)")
        for share in args.failed:
            failed = set(range(int(round(share * args.episodes))))
            before, stepping_before, frames_before = run(address, args.episodes, args.steps, False, failed)
            now, stepping_now, frames_now = run(address, args.episodes, args.steps, True, failed)
            assert frames_now == frames_before, (frames_now, frames_before)
            print(f"failed {share:.0%}, stepping (replays included, resets of the episodes not): rendering "
                  f"every step {stepping_before * 1e3:.0f} ms/step, skipping + replaying failed "
                  f"{stepping_now * 1e3:.0f} ms/step = {stepping_now / stepping_before:.2f}")
            print(f"failed {share:.0%}, whole run (resets included): rendering every step {before * 1e3:.0f} "
                  f"ms/step, skipping + replaying failed {now * 1e3:.0f} ms/step = {now / before:.2f} "
                  f"({frames_now} video frames either way)")
    finally:
        proc.terminate()
        proc.wait(120)


if __name__ == "__main__":
    main()
