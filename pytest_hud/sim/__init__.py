"""The bridge: one vectorized simulator served to many concurrent episodes.

Run it with ``python -m pytest_hud.sim TARGET --width N``; write a :class:`VectorSim` subclass to
serve a sim that is not gym-shaped.
"""

from .base import GymSim, SlotFaults, StepBatch, VectorSim
from .claims import ClaimRules
from .multitask import MultiTaskSim

__all__ = ["ClaimRules", "GymSim", "MultiTaskSim", "SlotFaults", "StepBatch", "VectorSim"]
