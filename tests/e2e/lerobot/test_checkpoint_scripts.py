"""The checkpoint scripts on the installed LeRobot (CI runs this on 0.6.1 and on 0.4.4): each one
records its demonstrations as a LeRobot dataset, trains, saves policy + processors, loads them back
through the seam and rolls them out. Tiny settings (a few episodes and updates): the script's path,
not the policy's quality, is under test; the shipped checkpoints are made with the defaults.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
pytest.importorskip("lerobot.policies", reason="LeRobot is not installed: pip install 'pytest-hud[lerobot]'")

from pytest_hud.agent.lerobot import LeRobotPolicy  # noqa: E402

pytestmark = pytest.mark.timeout(600)

REPO = Path(__file__).resolve().parents[3]
TINY = ["--steps", "3", "--eval-episodes", "1", "--batch-size", "8"]
#: kind: (script, its tiny arguments, the checkpoints it saves, state size, action size)
SCRIPTS = {
    "act": ("make_lerobot_checkpoints.py", [*TINY, "--episodes", "4", "--early-steps", "1"], ("early", "final"),
            4, 2),
    "diffusion": ("make_diffusion_checkpoints.py",
                  [*TINY, "--episodes", "4", "--warmup", "1", "--inference-steps", "2"], ("final",), 4, 2),
    # records through a real pytest run of the Meta-World suite (one worker), then trains the shared ACT
    "metaworld": ("make_metaworld_checkpoints.py",
                  [*TINY, "--episodes", "1", "--early-steps", "1", "--workers", "1", "--max-steps", "5"],
                  ("early", "final"), 39, 4),
}


@pytest.mark.parametrize("kind", list(SCRIPTS))
def test_a_checkpoint_script_records_trains_saves_and_evaluates(tmp_path: Path, kind: str) -> None:
    if kind == "diffusion" and importlib.util.find_spec("diffusers") is None:
        pytest.skip("diffusers is not installed (LeRobot's Diffusion Policy needs it): "
                    "pip install 'lerobot[diffusion]'")
    if kind == "metaworld" and importlib.util.find_spec("metaworld") is None:
        pytest.skip("Meta-World is not installed: pip install 'pytest-hud[metaworld]'")
    script, args, folders, state, action = SCRIPTS[kind]
    out = tmp_path / "checkpoints"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / script), "--out", str(out),
                           "--dataset-dir", str(tmp_path / "dataset"), *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=560,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "dataset" / "meta" / "info.json").is_file()  # the recorded LeRobot dataset
    for folder in folders:
        checkpoint = out / folder
        assert (checkpoint / "config.json").is_file() and (checkpoint / "model.safetensors").is_file()
        model = LeRobotPolicy.from_checkpoint(checkpoint, {"state": ((state,), "float32")})
        chunk = np.asarray(model.predict({"state": np.zeros(state, np.float32)}))
        assert chunk.ndim == 2 and chunk.shape[1] == action and np.isfinite(chunk).all()
