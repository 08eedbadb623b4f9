"""Typed, immutable records of liveness checking (plain data, no I/O).

A *target* is where a node's primary check goes (its slurmd's address and
port); a *check result* is one answer of the primary check, a
*confirmation* one answer of the second, independent check; a *decision*
is what the state machine concluded about a node, with the evidence.
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

from ..model import is_node_name


def check_node(node: str) -> str:
    """``node`` when it is a plain Slurm node name, else ValueError naming it."""
    if not is_node_name(node):
        raise ValueError(f"bad node name {node!r}")
    return node


@dataclass(frozen=True, slots=True)
class Target:
    """Where to check ``node``: an IP address literal and a TCP port.

    Built by :func:`b300.liveness.slurm_addr.targets_from_scontrol` (or by hand in tests);
    a host name is refused here so that no check ever blocks on DNS.
    """

    node: str
    host: str
    port: int

    def __post_init__(self) -> None:
        check_node(self.node)
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            raise ValueError(f"node {self.node}: {self.host!r} is not an IP address "
                             "(resolve NodeAddr first)") from None
        if not isinstance(self.port, int) or isinstance(self.port, bool) or not 0 < self.port < 65536:
            raise ValueError(f"node {self.node}: bad port {self.port!r}")


class CheckOutcome(enum.StrEnum):
    """How one check of one node went.

    ``OK`` and ``REFUSED`` are answers of the node's kernel (a handshake, a
    reset); ``TIMEOUT`` and ``UNREACHABLE`` are silence or a router's word;
    ``NOT_CHECKED`` means the prober could not check it in this round (too many
    in flight, its own stall): it is no evidence either way.
    """

    OK = "ok"
    REFUSED = "refused"
    TIMEOUT = "timeout"
    UNREACHABLE = "unreachable"
    ERROR = "error"
    NOT_CHECKED = "not_checked"

    @property
    def answered(self) -> bool:
        return self is CheckOutcome.OK

    @property
    def counts(self) -> bool:
        """Whether this outcome is evidence (a miss or an answer) at all."""
        return self is not CheckOutcome.NOT_CHECKED


class CheckResult(NamedTuple):
    """One primary check of one node: its outcome, how long it took, the errno text.

    A named tuple, not a frozen dataclass: a round makes one per node in use (10,000 a
    second at 10,000 nodes), and a tuple is made in half the time."""

    node: str
    outcome: CheckOutcome
    latency_s: float
    detail: str = ""


class ConfirmOutcome(enum.StrEnum):
    """The confirmation check's answer about a suspect node."""

    ANSWERED = "answered"          # the node answered: alive
    ANSWERED_REFUSED = "refused_us"  # something at its address answered but refused us (auth, host key)
    FAILED = "failed"              # no answer: refused connection, unreachable, timed out
    NOT_CHECKED = "not_checked"    # no address for it, or the confirmer itself failed

    @property
    def alive(self) -> bool:
        return self in (ConfirmOutcome.ANSWERED, ConfirmOutcome.ANSWERED_REFUSED)


@dataclass(frozen=True, slots=True)
class ConfirmResult:
    node: str
    outcome: ConfirmOutcome
    latency_s: float
    detail: str = ""


class Verdict(enum.StrEnum):
    """What the state machine says about a node at one step."""

    SUSPECT = "suspect"      # missed N primary checks in a row: run the confirmation check
    DEAD = "dead"            # confirmed: the primary missed all through the window, the confirmation failed
    CLEARED = "cleared"      # suspect, but answered (either check) within the window: no action
    RECOVERED = "recovered"  # answers the primary check again after being suspect, split or dead


@dataclass(frozen=True, slots=True)
class Decision:
    """A verdict about ``node`` at ``at``; ``evidence`` is the text for an event or a drain reason:
    the recent check results with their times."""

    node: str
    verdict: Verdict
    at: datetime
    evidence: str
    misses: int = 0
