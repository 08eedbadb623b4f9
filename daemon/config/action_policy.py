"""What a config lets the daemon do of its own accord (``[daemon] mode`` and the switches)."""

from __future__ import annotations

from ..safety.mode import ACT, ActionPolicy
from .settings import Config


def action_policy(config: Config) -> ActionPolicy:
    """The policy of a config: observe withholds everything; act allows what each switch allows."""
    if config.mode != ACT:
        return ActionPolicy(False, False, False, False,
                            why='[daemon] mode = "observe" (set mode = "act" to let the daemon act)')
    c = config.checkpoints
    nodes = config.recovery.enabled
    return ActionPolicy(nodes, c.allow_signals, c.prune or c.prunes_remote, bool(config.spares.pools),
                        why="" if nodes else "[recovery] enabled = false")
