"""Which checks run: ``[liveness] primary`` and ``confirm`` to probers, with a fallback.

A host probe that cannot open its socket here (no CAP_NET_RAW, the daemon's group
outside ``net.ipv4.ping_group_range``) is found at start-up, by opening one, and
replaced by the slurmd TCP connect; :func:`choose` says so in one line naming what to
set. The SSH confirmation needs ``[drift]``'s SSH settings and node list; without
them the confirmation falls back the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .icmp import IcmpProber, open_icmp_socket
from .rounds import PrimaryProber
from .syn import SynProber, open_syn_socket
from .tcp import TcpProber
from .timing import LivenessConfig
from .verdicts import CheckOutcome, CheckResult, ConfirmOutcome, ConfirmResult, Target

#: What to set so that each host probe can run, for the start-up line.
HOW_TO_ENABLE = {
    "icmp": "grant CAP_NET_RAW (AmbientCapabilities=CAP_NET_RAW in b300d.service) or put the "
            "daemon's group in net.ipv4.ping_group_range (sysctl)",
    "syn": "grant CAP_NET_RAW (AmbientCapabilities=CAP_NET_RAW in b300d.service)",
}


def can_run(kind: str) -> str:
    """"" when probe ``kind`` can run in this process, else why not (opens and closes a socket)."""
    try:
        if kind == "icmp":
            open_icmp_socket()[0].close()
        elif kind == "syn":
            open_syn_socket().close()
    except OSError as exc:
        return str(exc.strerror or exc)
    return ""


def prober(kind: str, config: LivenessConfig, timeout_s: float) -> PrimaryProber:
    """The prober of a host-level ``kind`` ("icmp", "syn", "connect")."""
    connect = _PortProber(TcpProber(timeout_s=timeout_s, max_in_flight=config.max_in_flight), config.port)
    batch = max(config.max_in_flight, 1024)  # one socket a round: answers waiting, not descriptors
    if kind == "icmp":
        return _Ipv4Only(IcmpProber(timeout_s=timeout_s, max_in_flight=batch), connect)
    if kind == "syn":
        return _Ipv4Only(SynProber(timeout_s=timeout_s, max_in_flight=batch, port=config.port), connect)
    if kind == "connect":
        return connect
    raise ValueError(f"unknown probe {kind!r}")


@dataclass(frozen=True, slots=True)
class Choice:
    """The checks that will run (``confirm`` empty: none can confirm here, liveness is off),
    and one line for each configured check that cannot run."""

    primary: str
    confirm: str
    notes: tuple[str, ...] = ()


def choose(config: LivenessConfig, *, ssh_ready: bool, probe: Callable[[str], str] = can_run) -> Choice:
    """The checks to run for ``config``: each configured one that can run here; else the
    primary falls back to "connect" and the confirmation to the first of syn, icmp,
    connect, ssh that can run and differs from the primary; with none, liveness is off."""
    def why_not(kind: str) -> str:
        if kind == "ssh":
            return "" if ssh_ready else "it needs [drift]'s SSH settings and nodes"
        why = probe(kind) if kind in HOW_TO_ENABLE else ""
        return f"{why}; to use it, {HOW_TO_ENABLE[kind]}" if why else ""

    notes = []
    primary: str = config.primary
    if why := why_not(primary):
        notes.append(f"primary = {primary!r} cannot run: {why}; checking with 'connect' "
                     "(a TCP connect to slurmd: two slurmd log lines per check) instead")
        primary = "connect"
    confirm: str = config.confirm
    why = why_not(confirm) or ("it is the primary check now" if confirm == primary else "")
    if why:
        spare: tuple[str, ...] = ("syn", "icmp", "connect", "ssh")
        confirm = next((k for k in spare if k != primary and not why_not(k)), "")
        instead = f"confirming with {confirm!r} instead" if confirm else \
            "no independent confirmation can run here: liveness is off; failures are found by Slurm alone"
        notes.append(f"confirm = {config.confirm!r} cannot run: {why}; {instead}")
    return Choice(primary, confirm, tuple(notes))


class ProbeConfirmer:
    """A host probe as the confirmation check: a suspect that answers it is alive.

    ``lookup`` gives a node's target (the primary's, from the monitor's last round);
    a node without one is ``NOT_CHECKED``. A RST to a connect counts as an answer here
    (the host's kernel replied), unlike in the primary connect check."""

    def __init__(self, prober: PrimaryProber, lookup: Callable[[str], Target | None], budget_s: float,
                 name: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._prober = prober
        self._lookup = lookup
        self._budget = budget_s
        self._name = name
        self._clock = clock

    def confirm(self, nodes: Sequence[str]) -> list[ConfirmResult]:
        """One result per node, never an exception."""
        found = {n: t for n in nodes if (t := self._lookup(n)) is not None}
        start = self._clock()
        try:
            results = {r.node: r for r in self._prober.check(list(found.values()), self._budget)}
        except Exception as exc:  # a broken prober must not read as "the nodes are dead"
            return [ConfirmResult(n, ConfirmOutcome.NOT_CHECKED, self._clock() - start,
                                  f"{self._name} failed: {exc}") for n in nodes]
        out = []
        for n in nodes:
            r = results.get(n)
            if r is None:
                out.append(ConfirmResult(n, ConfirmOutcome.NOT_CHECKED, 0.0, "no address known"))
                continue
            text = f"{self._name} {r.outcome.value}{' (' + r.detail + ')' if r.detail else ''}"
            if r.outcome in (CheckOutcome.OK, CheckOutcome.REFUSED):
                outcome = ConfirmOutcome.ANSWERED
            elif r.outcome is CheckOutcome.NOT_CHECKED:
                outcome = ConfirmOutcome.NOT_CHECKED
            else:
                outcome = ConfirmOutcome.FAILED
            out.append(ConfirmResult(n, outcome, r.latency_s, text))
        return out


class _PortProber:
    """The connect check at ``[liveness] port`` when one is set (else each target's own)."""

    def __init__(self, inner: TcpProber, port: int | None) -> None:
        self._inner = inner
        self._port = port

    def check(self, targets: Sequence[Target], budget_s: float) -> list[CheckResult]:
        if self._port is not None:
            targets = [Target(t.node, t.host, self._port) for t in targets]
        return self._inner.check(targets, budget_s)


class _Ipv4Only:
    """A host probe for the IPv4 targets, the connect check for the IPv6 ones (the host
    probes speak IPv4 only); one result per target, in order."""

    def __init__(self, v4: PrimaryProber, v6: PrimaryProber) -> None:
        self._v4 = v4
        self._v6 = v6

    def check(self, targets: Sequence[Target], budget_s: float) -> list[CheckResult]:
        v6 = [i for i, t in enumerate(targets) if ":" in t.host]
        if not v6:
            return self._v4.check(targets, budget_s)
        six = set(v6)
        v4 = [i for i in range(len(targets)) if i not in six]
        # One after the other, each within half the budget: a round still ends in time.
        out: dict[int, CheckResult] = dict(zip(v4, self._v4.check([targets[i] for i in v4], budget_s / 2),
                                               strict=True))
        out.update(zip(v6, self._v6.check([targets[i] for i in v6], budget_s / 2), strict=True))
        return [out[i] for i in range(len(targets))]
