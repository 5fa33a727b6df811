"""``python -m pytest_hud.serving --policy SPEC``: the policy server."""

from .server import run

run()
