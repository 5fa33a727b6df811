"""What a bad ``--hud-policy`` says: the spec's kind, and what a would-be checkpoint lacks."""

from __future__ import annotations

import json

import pytest

from pytest_hud.agent.model import PolicyError, load_policy, policy_kind


def test_a_path_that_is_no_checkpoint_says_what_it_lacks(tmp_path):
    no_weights, no_type, transformers = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for folder in (no_weights, no_type, transformers):
        folder.mkdir()
    (no_weights / "config.json").write_text(json.dumps({"type": "act"}))
    for folder, config in ((no_type, {}), (transformers, {"model_type": "bert"})):
        (folder / "config.json").write_text(json.dumps(config))
        (folder / "model.safetensors").write_bytes(b"")
    cases = {
        tmp_path / "nope" / "final": "does not exist",
        no_weights: "has no model.safetensors",
        tmp_path / "empty": "has no config.json and no model.safetensors",
        no_weights / "config.json": "is a file, not a checkpoint directory",
        no_type: 'config.json\' names no policy "type"',
        transformers: 'names no policy "type"',
    }
    (tmp_path / "empty").mkdir()
    for path, why in cases.items():
        with pytest.raises(PolicyError, match="is neither 'module:factory'") as caught:
            policy_kind(str(path))
        assert why in str(caught.value), (path, str(caught.value))


def test_a_factory_that_cannot_be_found_says_which_part_is_missing(tmp_path):
    with pytest.raises(PolicyError, match="no module 'nosuchmod' is importable here"):
        load_policy("nosuchmod:make", None)
    missing = tmp_path / "nope.py"
    with pytest.raises(PolicyError, match=f"policy file '{missing}' does not exist"):
        load_policy(f"{missing}:make", None)
    (tmp_path / "pols.py").write_text("thing = 3\n")
    with pytest.raises(PolicyError, match="does not name a callable factory"):
        load_policy(f"{tmp_path / 'pols.py'}:thing", None)
