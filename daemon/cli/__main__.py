"""``python -m b300.cli``: b300ctl."""

import sys

from . import main

if __name__ == "__main__":  # not when imported as b300.cli.__main__ (the wheel test imports every module)
    sys.exit(main())
