"""The policy server: one model copy serving many episodes over openpi's WebSocket protocol.

``python -m pytest_hud.serving --policy SPEC``."""
