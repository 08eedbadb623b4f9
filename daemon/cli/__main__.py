"""``python -m b300.cli``: b300ctl."""

import sys

from . import main

sys.exit(main())
