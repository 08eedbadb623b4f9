"""``python -m b300.docs_reference --write | --check``."""

import sys

from . import main

sys.exit(main())
