"""``python -m b300.docs_reference --write | --check``."""

import sys

from . import main

if __name__ == "__main__":  # not when imported as a module (the wheel test imports every module)
    sys.exit(main())
