"""What every process of a run shares: the contract, the settings, shards, episode records and the
results file, and how a sim or policy spec names its target. Imports nothing of the project but
:mod:`pytest_hud.stats`."""
