"""``python -m b300.ctl``: b300ctl's old module name, kept for scripts and tests (see b300.cli)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
