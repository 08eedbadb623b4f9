"""``python -m b300.launcher``: the batch script entry of a run (see b300.launcher.launch)."""
import sys

from .launch import main

if __name__ == "__main__":
    sys.exit(main())
