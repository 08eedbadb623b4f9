"""The node executor: the only code that changes a node in Slurm (drain, down, resume, reboot).

Every feature that takes a node out or puts it back (recovery, the black-hole rule,
liveness, straggler drains, version drift, drills, operators through the control
socket) asks this executor. It keeps three promises in one place:

- **fenced**: the Slurm client it is given is the daemon's fenced one
  (:class:`b300.ha.fence.FencedSlurm`), so a standby that lost its lease changes nothing;
- **once**: a drain of a node Slurm already shows drained by the daemon (a reason that
  starts with ``b300``) is not sent again, nor a reboot of a node Slurm shows rebooting,
  so an action re-decided after a crash (the spine is level-triggered: what is not
  recorded as done is decided again) reaches
  Slurm at most once more, and a drain is idempotent in Slurm anyway;
- **recorded**: each change that reached Slurm is written to the event log with the
  events the caller names (``node.drained`` by default), in the caller's words.

A failure of Slurm raises :class:`~b300.errors.SlurmError` to the caller, which decides
whether to defer (the next cycle decides again) or fall back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime

import structlog

from ..events import Kind
from ..interfaces import NewEvent, SlurmClient, Store
from ..model import NodeObservation, NodeRecord

log = structlog.get_logger(__name__)
Clock = Callable[[], datetime]


def drained_by_us(rec: NodeRecord | None) -> bool:
    """Slurm shows ``rec`` drained (or draining) with one of the daemon's reasons."""
    return rec is not None and "DRAIN" in rec.state.upper() and rec.reason.startswith("b300")


def rebooting(n: NodeObservation | None) -> bool:
    """Slurm shows a reboot of ``n`` requested or under way: sinfo's REBOOT state (``reboot``,
    ``reboot^`` issued) or the ``@`` (pending) / ``^`` (issued) suffix."""
    return n is not None and ("REBOOT" in n.state.upper() or any(f in ("@", "^") for f in n.flags))


class NodeActions:
    """Drain, down and resume nodes; fenced (through the client), at most once, recorded."""

    def __init__(self, store: Store | None, slurm: SlurmClient, clock: Clock) -> None:
        # store None: a caller that keeps its own record (version drift's table) and
        # always passes ``record=False`` and ``nodes_now``.
        self._store = store
        self._slurm = slurm
        self._clock = clock

    def drain(self, node: str, reason: str, *, run_id: str | None = None, attempt_id: int | None = None,
              data: Mapping[str, object] | None = None, nodes_now: Mapping[str, NodeRecord] | None = None,
              record: bool = True, actor: str = "daemon") -> bool:
        """Drain ``node`` with ``reason`` unless Slurm shows it drained by the daemon already
        (``nodes_now``: this cycle's view; read from the store when not given). True when the
        drain was sent now. ``record=False``: the caller records its own event (drift keeps
        its drain in its own table)."""
        rec = (nodes_now if nodes_now is not None else self._nodes()).get(node)
        if drained_by_us(rec):
            return False
        self._slurm.drain_node(node, reason)
        log.warning("node.drained", node=node, reason=reason)
        if record:
            self._recorder().append_events([NewEvent(
                Kind.NODE_DRAINED, node=node, run_id=run_id, attempt_id=attempt_id, actor=actor,
                data={"reason": reason, **(data or {})})], self._clock())
        return True

    def down(self, node: str, reason: str) -> None:
        """Mark ``node`` DOWN: Slurm ends the jobs on it now (the event that explains it,
        ``attempt.node_lost`` or ``drill.injected``, is the caller's)."""
        self._slurm.down_node(node, reason)
        log.warning("node.down", node=node, reason=reason)

    def resume(self, node: str, *, actor: str = "daemon", record: bool = True) -> None:
        """Return ``node`` to service (``node.resumed`` unless ``record=False``)."""
        self._slurm.resume_node(node)
        log.info("node.resumed", node=node, actor=actor)
        if record:
            self._recorder().append_events([NewEvent(Kind.NODE_RESUMED, node=node, actor=actor)], self._clock())

    def reboot(self, node: str, reason: str, *, now: NodeObservation | None) -> bool:
        """Reboot ``node`` (drained until then, DOWN after it: see
        :meth:`b300.interfaces.SlurmClient.reboot_node`) unless Slurm shows a reboot of it
        requested or under way (``now``: the node as Slurm showed it this round). True when
        the reboot was sent now. The event that explains it (``triage.reboot``, recorded
        before, as the intent) is the caller's."""
        if rebooting(now):
            return False
        self._slurm.reboot_node(node, reason)
        log.warning("node.reboot", node=node, reason=reason)
        return True

    def drained_for(self, run_id: str, attempt_id: int) -> set[str]:
        """The nodes recorded drained for ``attempt_id`` of ``run_id`` (done before a crash)."""
        return {e.node for e in self._recorder().events(run_id=run_id, kinds=[Kind.NODE_DRAINED])
                if e.attempt_id == attempt_id and e.node is not None}

    def _nodes(self) -> dict[str, NodeRecord]:
        return {n.name: n for n in self._recorder().list_nodes()}

    def _recorder(self) -> Store:
        if self._store is None:
            raise ValueError("NodeActions without a store records nothing: pass record=False and nodes_now")
        return self._store
