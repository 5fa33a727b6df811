"""Loading a checkpoint imports only its own policy type's LeRobot code, and nothing else changes.

Other policies' packages stay unrun (LeRobot 0.6's factory imports GR00T's configuration, whose
package ``__init__`` imports GR00T's model and LeRobot's datasets) until someone asks one for a name.

Each side runs in a fresh interpreter (what is imported is the point): the shipped ACT loaded
through :meth:`LeRobotPolicy.from_checkpoint` alone, and the same after ``import lerobot.policies``
(the whole package, as before). Runs only where LeRobot is installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lerobot.policies")

REPO = Path(__file__).resolve().parents[3]
CHECKPOINT = REPO / "evals" / "checkpoints" / "reach_act" / "final"

SCRIPT = r"""
import json, sys, threading
import numpy as np
if sys.argv[1] == "whole":
    import lerobot.policies
from pytest_hud.agent.lerobot import LeRobotPolicy

model = LeRobotPolicy.from_checkpoint(sys.argv[2])
configs = sorted(k for k in sys.modules if k.startswith("lerobot.policies.") and ".configuration_" in k)
models = sorted(k for k in sys.modules if k.startswith("lerobot.policies.") and ".modeling_" in k)
datasets = "lerobot.datasets" in sys.modules
# the checkpoint type's own package ran its __init__ (which may register its processors' steps)
own = "__getattr__" not in vars(sys.modules["lerobot.policies.act"])
acts = sorted(k for k in sys.modules if k.startswith("lerobot.policies.act."))
rng = np.random.default_rng(0)
observations = [{"state": rng.uniform(0, 1, 4).astype(np.float32)} for _ in range(3)]
chunks = [c.tolist() for c in model.predict_batch(observations, ["reach"] * 3)]

# the package as a whole, and another policy's package, asked for names from two threads at once
import importlib.util
diffusion = importlib.util.find_spec("lerobot.policies.diffusion")
# (a regular package, LeRobot >= 0.5, whose __init__ names its model: diffusers brings it)
ask_diffusion = diffusion.origin not in (None, "namespace") and importlib.util.find_spec("diffusers") is not None
found, errors = [], []
def ask():
    try:
        from lerobot.policies import ACTConfig, DiffusionConfig  # noqa: F401
        import lerobot.policies as package
        ok = package.ACTConfig is type(model.policy.config)
        if ask_diffusion:
            from lerobot.policies.diffusion import DiffusionPolicy
            ok = ok and DiffusionPolicy.__name__ == "DiffusionPolicy"
        found.append(ok)
    except Exception as exc:
        errors.append(repr(exc))
threads = [threading.Thread(target=ask) for _ in range(2)]
for t in threads: t.start()
for t in threads: t.join()
import lerobot.policies as package
print(json.dumps({"configs": configs, "models": models, "datasets": datasets, "own": own, "acts": acts,
                  "chunks": chunks, "found": found, "errors": errors,
                  "has_getattr": "__getattr__" in vars(package), "missing": hasattr(package, "no_such_name")}))
"""


def load(mode: str) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode, str(CHECKPOINT)], capture_output=True,
                         text=True, timeout=300, cwd=REPO, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_checkpoint_loads_with_its_own_policy_code_and_the_package_completes_when_asked():
    from importlib.metadata import version

    lean, whole = load("lean"), load("whole")

    assert lean["chunks"] == whole["chunks"]  # the same policy, processors and actions, bit for bit
    assert "lerobot.policies.act.configuration_act" in lean["configs"]
    if int(version("lerobot").split(".")[0]) > 0 or int(version("lerobot").split(".")[1]) >= 5:
        # LeRobot >= 0.5: the package's __init__ imports every policy's configuration, the
        # factory only a few (0.4.4's factory imports them all, so both sides load the same there)
        assert "lerobot.policies.diffusion.configuration_diffusion" in whole["configs"]
        assert "lerobot.policies.diffusion.configuration_diffusion" not in lean["configs"]
        assert len(lean["configs"]) < len(whole["configs"])
        if "lerobot.policies.groot.modeling_groot" in whole["models"]:
            # LeRobot 0.6: GR00T's package __init__ brought LeRobot's datasets (0.4.4's factory
            # imports them itself)
            assert whole["datasets"] and not lean["datasets"]
    # no other policy's model (each policy's package __init__ imports its own)
    assert lean["models"] == ["lerobot.policies.act.modeling_act"]
    assert set(lean["models"]) <= set(whole["models"])
    assert not lean["datasets"] or whole["datasets"]
    assert lean["own"] and whole["own"] and lean["acts"] == whole["acts"]  # ACT's own code, all of it
    for side in (lean, whole):  # afterwards the package is whole either way, from any thread
        assert side["errors"] == [] and side["found"] == [True, True]
        assert not side["has_getattr"] and side["missing"] is False


REGISTERED = r"""
import json, sys
side, policy_type = sys.argv[1], sys.argv[2]
if side == "whole":
    import lerobot.policies, lerobot.policies.factory  # noqa: E401,F401
else:
    from pytest_hud.agent.lerobot_import import import_policy_code
    import_policy_code(policy_type)
from lerobot.processor import ProcessorStepRegistry
print(json.dumps(sorted(name for name in ProcessorStepRegistry.list()
                        if ProcessorStepRegistry.get(name).__module__.startswith(f"lerobot.policies.{policy_type}."))))
"""


@pytest.mark.parametrize("policy_type", ["smolvla", "pi0", "act"])
def test_a_policy_types_processor_steps_are_registered_as_by_the_whole_package(policy_type):
    # A checkpoint's saved processors name their steps; LeRobot finds them in its registry, filled
    # as processor modules are imported. LeRobot 0.4's ``lerobot.policies`` imports SmolVLA's
    # processor module for that alone: the lean import must register them too.
    def registered(side: str) -> list[str]:
        out = subprocess.run([sys.executable, "-c", REGISTERED, side, policy_type], capture_output=True, text=True,
                             timeout=300, cwd=REPO, check=False)
        assert out.returncode == 0, out.stderr[-3000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    # (the lean side may register more: its type's processor module whole, which the package's
    # __init__ need not import)
    assert set(registered("whole")) <= set(registered("lean"))
