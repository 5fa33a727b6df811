"""``python -m pytest_hud.serving --policy SPEC``: the policy server."""

from pytest_hud.serving.cli import run

run()
