"""Named crash points for the fault-injection tests.

The crash-safety tests start the real daemon with ``B300_CRASH_AT`` naming one
of these points, to stop it between an intent and its confirmation (the other
fault tests kill it at random moments). In normal operation they do nothing.
"""

from __future__ import annotations

import os
import signal


def crashpoint(name: str, attempt: int | None = None) -> None:
    """Die here, as SIGKILL would, when ``B300_CRASH_AT`` names this point
    (``name``, or ``name_a<attempt>`` for one attempt number only)."""
    where = os.environ.get("B300_CRASH_AT")
    if where and where in (name, f"{name}_a{attempt}"):
        os.kill(os.getpid(), signal.SIGKILL)
