"""The bridge process: serves one vectorized sim to many concurrent episodes.

``python -m pytest_hud.bridge TARGET --width N``. The sim runs
on the main thread; the control channel and the slot WebSockets on an asyncio loop
(:mod:`.server`), whose slot rules live in the pure :mod:`.engine`. Imports the sim adapters
(:mod:`pytest_hud.sim`), the wire and the core; never the controller, the workers or the agent.
"""
