"""The policy server's model loading: for a contract, ahead of one, or once one is written.

Apart from the server because loading is policy-kind business (LeRobot checkpoints, factories, the
contract they are loaded for) and the serving is not: :class:`~pytest_hud.serving.server.PolicyServer`
takes any model, and the command line (:mod:`pytest_hud.serving.cli`) picks one of these.

Which contract the policy is loaded for:

- ``--contract PATH`` (a ``contract.json``): ``load_policy(spec, contract)``, exactly as a worker
  would load it, so a LeRobot checkpoint's input features are checked against it up front;
- no ``--contract``, a LeRobot checkpoint: loaded on its own; the checkpoint's input features *are*
  what clients must send (``state`` / ``observation.state`` / ...; see
  :func:`pytest_hud.agent.lerobot.lerobot_feature_name`), and a request that cannot feed it fails
  with a message listing both sides;
- no ``--contract``, a ``module:factory``: a factory that takes an argument is called with
  ``None`` (pass ``--contract`` if yours needs one), one that takes none is called without.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

from pytest_hud.core.specs import Spec, resolve
from pytest_hud.launch.announce import parent_alive

__all__ = ["check_contract", "load_ahead", "load_server_policy", "wait_for_contract"]


def load_server_policy(spec: Spec | str, contract_path: str | None = None, device: str = "cpu",
                       rename: dict[str, str] | None = None) -> Any:
    """The model a server ``--policy`` spec names (see the module docstring for the contract rules)."""
    from pytest_hud.core.contract import Contract
    from pytest_hud.agent.model import PolicyError, check_policy_spec, load_policy, policy_spec

    spec = policy_spec(spec)
    if spec.kind == "url":
        raise PolicyError(
            f"--policy {spec.text!r} is a policy-server URL; the server serves a local policy "
            "(a LeRobot checkpoint directory or 'module:factory'); point --hud-policy at the URL instead"
        )
    if contract_path:
        return load_policy(spec, Contract.load(contract_path), device=device, rename=rename)
    if spec.kind == "checkpoint":
        check_policy_spec(spec)  # a folder that is no checkpoint says what it lacks
        try:
            from pytest_hud.agent.lerobot import LeRobotPolicy
        except ImportError as exc:
            raise PolicyError(
                f"policy {spec.text!r} is a LeRobot checkpoint but LeRobot is not importable ({exc}); "
                "install it with: pip install 'pytest-hud[lerobot]'"
            ) from None
        return LeRobotPolicy.from_checkpoint(spec.text, None, device=device, rename=rename)
    return load_policy(spec, None, device=device)  # type: ignore[arg-type]


def load_ahead(spec: Spec | str, device: str = "cpu", rename: dict[str, str] | None = None) -> Any | None:
    """What a server can do for ``spec`` before its contract is known.

    A LeRobot checkpoint loads without one (the contract only checks the inputs, afterwards:
    :func:`check_contract`), so it is loaded now and returned: torch, LeRobot and the weights are
    most of a server's start. A factory may build its model from the contract, so only its module
    is imported (None is returned). Raises what the load raises; the import is best effort (it
    fails again in the real load, which reports it).
    """
    from pytest_hud.agent.model import policy_spec

    spec = policy_spec(spec)
    if spec.kind == "checkpoint":
        return load_server_policy(spec, None, device, rename)
    if spec.is_factory:
        with contextlib.suppress(Exception):
            resolve(spec)
    return None


def check_contract(model: Any, contract_path: str) -> None:
    """Raise ``ValueError`` unless ``model`` (a LeRobot checkpoint loaded ahead) can take the
    observations of the contract at ``contract_path``, as loading it for that contract would have."""
    from pytest_hud.core.contract import Contract

    model.check_observation_features(Contract.load(contract_path).observation_shapes())


def wait_for_contract(path: str, parent: int) -> bool:
    """Wait until ``path`` exists (the pool writes it atomically once a worker has the sim's contract);
    False if the parent died first."""
    while not os.path.exists(path):
        if parent > 1 and not parent_alive(parent):
            return False
        time.sleep(0.01)
    return True
