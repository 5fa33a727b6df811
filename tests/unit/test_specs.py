"""Sim and policy specs: one parse from the text, one resolver, errors that name the fix."""

from __future__ import annotations

import pytest

from pytest_hud.core.specs import Spec, SpecError, parse_spec, resolve


@pytest.mark.parametrize("text, role, kind, location, attr", [
    ("ws://gpu-box:8000", "policy", "url", "", ""),
    ("wss://gpu-box/policy", "policy", "url", "", ""),
    ("evals/policies/reach.py:expert", "policy", "file", "evals/policies/reach.py", "expert"),
    ("/abs/sims.py:make", "sim", "file", "/abs/sims.py", "make"),
    ("my_pkg.policies:make", "policy", "module", "my_pkg.policies", "make"),
    ("evals.sims.classic:cartpole", "sim", "module", "evals.sims.classic", "cartpole"),
    ("evals/checkpoints/reach_act/final", "policy", "checkpoint", "", ""),
    ("CartPole-v1", "sim", "gym", "", ""),
    ("gym_pusht/PushT-v0", "sim", "gym", "", ""),
])
def test_a_spec_kind_is_read_from_its_text_once(text, role, kind, location, attr):
    spec = parse_spec(text, role)
    assert (spec.kind, spec.location, spec.attr, spec.text, str(spec)) == (kind, location, attr, text, text)
    assert spec.is_factory == (kind in ("file", "module"))


def test_a_checkpoint_folder_with_a_colon_in_its_name_is_a_checkpoint(tmp_path):
    folder = tmp_path / "run:3"
    folder.mkdir()
    assert parse_spec(str(folder), "policy").kind == "checkpoint"
    assert parse_spec(str(folder), "sim").kind == "module"  # a sim is never a folder


@pytest.mark.parametrize("text, role, message", [
    ("", "policy", "an empty policy spec: use 'module:factory'"),
    ("ws://host:1", "sim", "sim 'ws://host:1' is a URL: a bridge's address goes to --hud-sim-url"),
    (":make", "sim", "sim ':make' names no module or file: use a gymnasium id"),
    ("pkg.mod:", "policy", "policy 'pkg.mod:' names no factory: use 'module:factory'"),
])
def test_text_that_is_no_spec_of_its_role_says_which_forms_are(text, role, message):
    with pytest.raises(SpecError) as caught:
        parse_spec(text, role)
    assert str(caught.value).startswith(message)


def test_the_one_resolver_loads_files_and_modules_and_refuses_other_kinds(tmp_path):
    (tmp_path / "sims.py").write_text("from neighbour import VALUE\n\ndef make():\n    return VALUE\n")
    (tmp_path / "neighbour.py").write_text("VALUE = 7\n")
    assert resolve(parse_spec(f"{tmp_path / 'sims.py'}:make", "sim"))() == 7  # its folder is importable
    assert resolve(parse_spec("json:dumps", "policy")).__name__ == "dumps"
    assert resolve(parse_spec("no_such_module_hud:f", "sim")) is None  # maybe a namespaced gym id
    with pytest.raises(SpecError, match="policy file '.*nope.py' does not exist"):
        resolve(parse_spec(f"{tmp_path / 'nope.py'}:make", "policy"))
    with pytest.raises(SpecError, match="has no attribute 'nothing'"):
        resolve(parse_spec(f"{tmp_path / 'sims.py'}:nothing", "sim"))
    with pytest.raises(SpecError, match="is a url spec, not a factory"):
        resolve(parse_spec("ws://h:1", "policy"))


def test_a_spec_is_a_value():
    assert parse_spec("a.py:f", "sim") == Spec("a.py:f", "file", "sim", "a.py", "f")
    assert len({parse_spec("a.py:f", "sim"), parse_spec("a.py:f", "sim")}) == 1
