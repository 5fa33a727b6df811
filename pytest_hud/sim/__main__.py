"""``python -m pytest_hud.sim``: the bridge's former command, kept so that old scripts still start a
bridge; it says so on stderr and runs ``python -m pytest_hud.bridge`` with the same arguments.

The bridge is run by name (:func:`runpy.run_module`), not imported: the sim adapters sit below the
bridge and import nothing above them.
"""

import runpy
import sys

sys.stderr.write("pytest-hud: `python -m pytest_hud.sim` is deprecated; "
                 "run `python -m pytest_hud.bridge` (same arguments)\n")
runpy.run_module("pytest_hud.bridge", run_name="__main__", alter_sys=True)
