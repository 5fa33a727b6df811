"""The bridge: one vectorized simulator served to many concurrent episodes.

Run it with ``python -m pytest_hud.bridge TARGET --width N``; write a :class:`VectorSim` subclass to
serve a sim that is not gym-shaped.
"""

from pytest_hud.sim.base import GymSim, SlotFaults, StepBatch, VectorSim
from pytest_hud.sim.claims import ClaimRules
from pytest_hud.sim.multitask import MultiTaskSim

__all__ = ["ClaimRules", "GymSim", "MultiTaskSim", "SlotFaults", "StepBatch", "VectorSim"]
