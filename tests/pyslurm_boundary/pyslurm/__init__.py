"""``import pyslurm`` for the backend's worker process in tests: the stand-in
generated from pyslurm 25.11.2's sources (tests/pyslurm_standin.py), reading
its recorded values from the file named by ``B300_PYSLURM_STATE``."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pyslurm_standin import StandIn

_standin = StandIn(Path(os.environ["B300_PYSLURM_STATE"]))
for _name, _value in vars(_standin.module).items():
    if not _name.startswith("__") or _name == "__version__":
        globals()[_name] = _value
