"""The node-down trigger: slurmctld wakes the daemon when a node goes down.

The daemon writes a tiny program into its state directory and arms a permanent
``strigger --node --down`` that runs it, so slurmctld runs no string of ours
through a shell. Polling stays the safety net (slurmctld runs trigger programs in
its 15 s trigger pass, see docs/design/failure-recovery.md).
"""

from __future__ import annotations

import json
import os
import sys

import structlog

from ..errors import SlurmError
from ..interfaces import SlurmClient

log = structlog.get_logger(__name__)


def trigger_script(socket_path: str) -> str:
    """The node-down trigger program: Python in isolated mode without site-packages
    (``-IS``: no import of b300, its dependencies or anything on the path), one
    ``wake`` request on the control socket. slurmctld runs it as the user who set the
    trigger; that user must be allowed on the socket (root, b300, or the admin group)."""
    return (f"#!{sys.executable} -IS\n"
            "# Written by b300d: slurmctld runs this when a node goes down (strigger).\n"
            "# Standard library only: ask the daemon for a poll cycle now.\n"
            "import json, socket, sys\n"
            f"SOCKET = {json.dumps(socket_path)}\n"
            "why = ('node-down ' + ' '.join(sys.argv[1:]))[:200]\n"
            "with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:\n"
            "    s.settimeout(10)\n"
            "    s.connect(SOCKET)\n"
            "    s.sendall(json.dumps({'op': 'wake', 'why': why}).encode() + b'\\n')\n"
            "    reply = s.makefile('rb').readline()\n"
            "sys.exit(0 if reply and json.loads(reply).get('ok') else 1)\n")


def arm_node_trigger(slurm: SlurmClient, program: str, socket_path: str) -> None:
    """Write the program (atomically) and make sure slurmctld's trigger runs it; a failure is
    a warning (the daemon then relies on polling alone)."""
    try:
        tmp = program + ".tmp"
        with open(tmp, "w") as f:
            f.write(trigger_script(socket_path))
        os.chmod(tmp, 0o755)  # noqa: S103 - slurmctld (SlurmUser) must execute it
        os.replace(tmp, program)
        armed = slurm.ensure_node_down_trigger(program)
    except (OSError, SlurmError) as exc:
        log.warning("trigger.not_armed", error=str(exc))
        return
    log.info("trigger.armed" if armed else "trigger.not_allowed", program=program)
