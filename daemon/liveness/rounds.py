"""One liveness round per interval: primary checks, the state machine, confirmations.

:class:`LivenessMonitor` is what the daemon calls every ``interval_s`` with the
targets of the nodes in use (running attempts' nodes and their slurmd
addresses) and ``now``; it returns the decisions. Confirmations run in one
worker thread so that a slow SSH never delays the next round; their answers
are folded in at the start of the round after they arrive.

The seams are two protocols (to move into ``b300.interfaces`` when this is wired):
:class:`PrimaryProber` (b300.liveness.tcp.TcpProber) and :class:`Confirmer`
(b300.liveness.confirm.SshConfirmer).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter
from typing import Protocol

from .machine import NodeLiveness, observe_checks, observe_confirmations
from .timing import LivenessConfig
from .verdicts import CheckOutcome, CheckResult, ConfirmOutcome, ConfirmResult, Decision, Target

_NODE, _OUTCOME = attrgetter("node"), attrgetter("outcome")


class PrimaryProber(Protocol):
    """Checks many targets at once. Returns one result per target, in order, within
    ``budget_s``; never raises for a node's trouble (that is an outcome)."""

    def check(self, targets: Sequence[Target], budget_s: float) -> list[CheckResult]: ...


class Confirmer(Protocol):
    """The second, independent check of suspect nodes. One result per node; never raises
    (its own failure is ``NOT_CHECKED``, never "dead")."""

    def confirm(self, nodes: Sequence[str]) -> list[ConfirmResult]: ...


@dataclass(frozen=True, slots=True)
class RoundReport:
    """What one round found: the decisions (DEAD ones are what the daemon acts on), the
    number of nodes checked and answering, and a note when silences were not counted."""

    decisions: tuple[Decision, ...]
    checked: int
    answered: int
    confirming: tuple[str, ...] = ()
    note: str = ""
    uncounted: tuple[str, ...] = ()  # silent nodes of a mass-silence round (not counted)

    @property
    def dead(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if d.verdict.value == "dead")


class LivenessMonitor:
    """Holds the per-node states between rounds (in memory only; see machine.py on restarts)."""

    def __init__(self, config: LivenessConfig, prober: PrimaryProber, confirmer: Confirmer) -> None:
        self._config = config
        self._prober = prober
        self._confirmer = confirmer
        self._states: Mapping[str, NodeLiveness] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="liveness-confirm")
        self._confirming: Future[list[ConfirmResult]] | None = None
        self._confirm_nodes: tuple[str, ...] = ()
        self._queued: list[str] = []
        self._targets: dict[str, Target] = {}

    def target(self, node: str) -> Target | None:
        """Where ``node`` was checked in the last round (for a host-probe confirmation)."""
        return self._targets.get(node)

    @property
    def states(self) -> Mapping[str, NodeLiveness]:
        return self._states

    def round(self, targets: Sequence[Target], now: datetime) -> RoundReport:
        """Check ``targets`` once (within ``interval_s``) and return what was decided."""
        decisions: list[Decision] = []
        decisions += self._collect(now)
        self._targets = dict(zip(map(_NODE, targets), targets, strict=True))
        results = self._prober.check(targets, self._config.interval_s)
        step = observe_checks(self._states, results, now, self._config)
        self._states = step.states
        decisions += step.decisions
        self._queued = list(dict.fromkeys([*self._queued, *step.confirm]))
        started = self._start_confirmations()
        answered = list(map(_OUTCOME, results)).count(CheckOutcome.OK)
        return RoundReport(tuple(decisions), len(results), answered, started, step.note, step.uncounted)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _collect(self, now: datetime) -> list[Decision]:
        if self._confirming is None or not self._confirming.done():
            return []
        future, self._confirming = self._confirming, None
        try:
            results = future.result()
        except Exception as exc:  # a confirmer that broke says nothing about the nodes
            results = [ConfirmResult(n, ConfirmOutcome.NOT_CHECKED, 0.0, f"confirmer failed: {exc}")
                       for n in self._confirm_nodes]
        step = observe_confirmations(self._states, results, now, self._config)
        self._states = step.states
        return list(step.decisions)

    def _start_confirmations(self) -> tuple[str, ...]:
        if self._confirming is not None or not self._queued:
            return ()
        nodes, self._queued = tuple(self._queued), []
        self._confirm_nodes = nodes
        self._confirming = self._pool.submit(self._confirmer.confirm, nodes)
        return nodes

    def wait_confirmations(self, timeout_s: float) -> bool:
        """For tests and drills: wait (bounded) for the confirmations in flight."""
        if self._confirming is None:
            return True
        try:
            self._confirming.result(timeout=timeout_s)
        except TimeoutError:
            return False
        return True
