"""The naive way, for comparisons: build the env and the policy in-process, no sharing."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from pytest_hud.agent.model import load_policy
from pytest_hud.core.contract import derive_contract
from pytest_hud.sim.target import resolve_factory


def build_env(target: str, **build: Any) -> gym.Env:
    factory = resolve_factory(target)
    return gym.make(target, **build) if factory is None else factory(**build)


def build_model(spec: str, env: gym.Env) -> tuple[Any, Any]:
    """The policy's model as pytest-hud loads it for ``env``'s contract, and that contract."""
    obs, _ = env.reset(seed=0)
    contract = derive_contract(env.observation_space, env.action_space, obs, env.metadata)
    return load_policy(spec, contract), contract


def build_policy(spec: str, env: gym.Env) -> Any:
    model, contract = build_model(spec, env)

    class Chunked:  # always a chunk [T, A], like the agent loop's open-loop queue
        def reset(self):
            if callable(getattr(model, "reset", None)):
                model.reset()

        def predict(self, observation, prompt=None):
            import numpy as np

            out = np.asarray(model.predict(observation, prompt=prompt) if prompt else model.predict(observation))
            if contract.action.type == "discrete":
                return out.reshape(-1, 1)[:, 0] if out.size > 1 else [int(out.reshape(-1)[0])]
            return out.reshape(-1, contract.action_dim)

    return Chunked()


def run_episode(env: gym.Env, policy: Any, seed: int, prompt: str | None = None) -> dict[str, Any]:
    """One episode in a plain loop (the policy's chunks executed open-loop); its last ``info``."""
    obs, _ = env.reset(seed=seed)
    policy.reset()
    queue: list = []
    while True:
        if not queue:
            queue = list(policy.predict(obs if isinstance(obs, dict) else {"state": obs}, prompt))
        obs, _, terminated, truncated, info = env.step(queue.pop(0))
        if terminated or truncated:
            return info
