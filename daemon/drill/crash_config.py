"""The ``[drill]`` section: how ``b300ctl drill --method crash`` crashes a node, and how
a crashed node is brought back after the drill.

::

    [drill]
    crash_command = ["/usr/local/sbin/bmc-power", "off", "{node}"]   # argv, never a shell
    restore_command = ["/usr/local/sbin/bmc-power", "on", "{node}"]  # optional
    command_timeout = "60s"

``{node}`` is an argv element of its own (never inside another word): it is replaced
by the node's name, so no name ever reaches a shell.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

NODE = "{node}"


@dataclass(frozen=True, slots=True)
class DrillConfig:
    crash_command: tuple[str, ...] = ()
    restore_command: tuple[str, ...] = ()
    command_timeout_s: float = 60.0


def command_problem(argv: Sequence[str]) -> str | None:
    """Why ``argv`` cannot be a drill command, or None (an empty one is "not configured")."""
    if not argv:
        return None
    if not argv[0].startswith("/"):
        return f"must start with the program's absolute path, got {argv[0]!r}"
    if NODE not in argv:
        return f"must name the node as an argv element of its own, {NODE!r}"
    for word in argv:
        if NODE in word and word != NODE:
            return f"must have {NODE} as an argv element of its own, not inside {word!r}"
    return None


def node_argv(argv: Sequence[str], node: str) -> list[str]:
    """``argv`` with every ``{node}`` element replaced by ``node``."""
    return [node if word == NODE else word for word in argv]
