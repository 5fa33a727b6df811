"""``python -m pytest_hud.sim TARGET --width N``: the bridge's entry point under its first name
(the same as ``python -m pytest_hud.bridge``)."""

from pytest_hud.bridge.__main__ import run

run()
