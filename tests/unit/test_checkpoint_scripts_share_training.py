"""The checkpoint scripts build their policies from one training module and import no test module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
CHECKPOINT_SCRIPTS = sorted(SCRIPTS.glob("make_*checkpoint*.py"))


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def called_names(path: Path) -> set[str]:
    return {node.func.id for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}


def test_the_checkpoint_scripts_are_found() -> None:
    assert len(CHECKPOINT_SCRIPTS) == 5, CHECKPOINT_SCRIPTS


@pytest.mark.parametrize("script", CHECKPOINT_SCRIPTS, ids=lambda path: path.name)
def test_no_checkpoint_script_imports_a_test_module(script: Path) -> None:
    tests = {name for name in imported_modules(script)
             if any(part.startswith(("test_", "conftest")) or part == "tests" for part in name.split("."))}
    assert not tests, f"{script.name} imports {sorted(tests)}: move what it needs out of the test module"


@pytest.mark.parametrize("script", CHECKPOINT_SCRIPTS, ids=lambda path: path.name)
def test_the_act_configuration_is_written_once_in_the_training_module(script: Path) -> None:
    assert "ACTConfig" not in called_names(script), (
        f"{script.name} builds its own ACTConfig: use lerobot_training.small_act")
    assert "ACTConfig" in called_names(SCRIPTS / "lerobot_training.py")
