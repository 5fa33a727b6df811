"""Where services run and how they stay alive: the launcher seam (local, static endpoints, Ray),
announce files, leases and standby interpreters. Imports nothing else of the project."""
