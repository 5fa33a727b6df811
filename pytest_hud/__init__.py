"""pytest-hud: robot-policy evaluation as a pytest run.

Each episode is a test; one simulator process with ``width`` vectorized slots is shared by the
xdist workers; success rates, confidence intervals and a regression gate come out as reports.
"""

__version__ = "0.1.0"
