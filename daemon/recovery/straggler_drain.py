"""``[training] straggler_action = "drain"``: drain a confirmed straggler node in Slurm.

A straggler (:mod:`b300.training.stragglers`) slows the whole run down but does not break
it. Under the drain policy the daemon does what an admin does with a degraded node:
``scontrol update state=drain`` with the evidence as the reason. DRAIN lets the job on
the node run on (Slurm only stops placing new jobs there), so the run keeps training at
its current speed until its next restart (a failure, a preemption, an operator's
resubmit), and that next attempt is not placed on the node while it stays drained; an
operator's ``scontrol update state=resume`` makes it usable again. The run is never
cancelled for it: a restart costs the steps since the last checkpoint, the queue wait and
the start-up, certainly, while a straggler costs a fraction of the speed.

The decision (:func:`drain_refusal`, pure) refuses when:

- the host the job reported is not one of the attempt's Slurm nodes (a job's own host
  name is not trusted as a node name);
- the node is drained or down already (by someone else: its reason is kept);
- the run had a straggler drain within ``straggler_drain_every`` (one per run per window:
  one slow run cannot drain a cluster), this cycle's included (remembered in memory: their
  events are written after the cycle's findings);
- the run's partition is unknown, or would be left with fewer usable nodes (not bad, not
  excluded by the attempt, not drained this cycle, not this one) than the run asks for (``nodes`` +
  ``spare_nodes``): the drain must not make the run's next attempt unschedulable.

Recorded once, crash-safe: the watch appends the finding and the decision (``node.drained``
with ``straggler``, or ``training.straggler_kept`` with ``why``) in one transaction after
the drain. A daemon that died between the drain and that write re-reads the same records
(its state file is saved after the write), finds the straggler again and, finding the node
drained with this run's straggler reason, records the drain without a second one.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from datetime import datetime, timedelta

import structlog

from ..cycle.node_actions import NodeActions
from ..errors import SlurmError
from ..events import Kind
from ..interfaces import NewEvent, SlurmClient, Store
from ..model import Attempt, NodeObservation, NodeRecord
from ..spec import spec_of
from .classify import node_is_bad

log = structlog.get_logger(__name__)

#: Slurm keeps a reason of any length, but ``sinfo -R`` shows the first ~50 characters.
MAX_REASON = 200
#: Node states (as b300 records them) that only say "drained", nothing failed.
DRAIN_ONLY = frozenset({"DRAIN", "DRAINED", "DRAINING"})


def straggler_reason(run_id: str, job_id: int | None, evidence: str) -> str:
    """The drain reason: whose straggler it was and why (``sinfo -R`` shows it)."""
    return f"b300: straggler in run {run_id} job {job_id}: {evidence}"[:MAX_REASON]


def ours(rec: NodeRecord | NodeObservation | None, run_id: str) -> bool:
    """``rec`` is drained with a straggler reason of ``run_id`` (a drain done before a crash)."""
    return rec is not None and "DRAIN" in rec.state.upper() and \
        rec.reason.startswith(f"b300: straggler in run {run_id} ")


def responding(obs: NodeObservation | None) -> bool:
    """``obs`` (sinfo now, with its flags) shows a node that is drained and nothing else.

    Slurm prints a node that is DOWN and DRAIN as ``drained`` (the drain wins in its state
    string), with ``*`` while it does not respond, and keeps the reason it had (ours): the
    flag is the only sign that a straggler-drained node died since."""
    return obs is not None and "*" not in obs.flags and obs.state.upper() in DRAIN_ONLY \
        and "NOT RESPONDING" not in obs.reason.upper()


def straggler_drained(nodes: Sequence[str], observed: Mapping[str, NodeObservation], run_id: str) -> set[str]:
    """Of ``nodes``, those drained as ``run_id``'s straggler and bad for no other reason,
    as ``observed`` live (sinfo's observations, flags kept; a stored record has none):
    responding, not down. The attempt did not fail there, so recovery does not blame them
    (unless a liveness check or the job's log does: :func:`b300.recovery.classify.classify_end`)."""
    return {n for n in nodes if ours(observed.get(n), run_id) and responding(observed.get(n))}


def drain_refusal(*, host: str, run_id: str, attempt_nodes: Sequence[str],
                  nodes_now: Mapping[str, NodeRecord], last_drain: datetime | None,
                  every_s: float, now: datetime, partition: Sequence[str] | None,
                  excluded: Collection[str], needed: int,
                  drained_now: Collection[str] = ()) -> str | None:
    """Why the straggler ``host`` of ``run_id`` must not be drained now (one phrase), or
    None: drain it. ``last_drain``: the run's newest straggler drain. ``drained_now``: the
    nodes drained by this cycle already (``nodes_now`` predates them): not usable."""
    if host not in attempt_nodes:
        return f"{host} is not a Slurm node of the attempt ({', '.join(attempt_nodes[:4]) or 'none'})"
    if host in drained_now:
        return f"{host} was drained by b300d in this cycle already"
    rec = nodes_now.get(host)
    if node_is_bad(rec) and not ours(rec, run_id):
        assert rec is not None
        return f"{host} is {rec.state.lower()} already" + (f" ({rec.reason[:80]})" if rec.reason else "")
    if last_drain is not None and now - last_drain < timedelta(seconds=every_s):
        return (f"the run had a straggler drain at {last_drain.isoformat(timespec='seconds')}; at most "
                f"one per {every_s / 3600:g} h (straggler_drain_every)")
    if partition is None:
        return "the run's partition nodes are unknown"
    usable = ({n for n in partition if not node_is_bad(nodes_now.get(n))}
              - set(excluded) - set(drained_now) - {host})
    if len(usable) < needed:
        return (f"draining it would leave {len(usable)} usable node(s) in the run's partition; "
                f"the run needs {needed}")
    return None


class StragglerDrainer:
    """Acts on a straggler finding under the drain policy (the cycle holds the action lock;
    ``slurm`` is the fenced client)."""

    def __init__(self, store: Store, slurm: SlurmClient, clock: Callable[[], datetime]) -> None:
        self._store = store
        self._slurm = slurm
        self._nodes = NodeActions(store, slurm, clock)
        self._clock = clock
        # The drains of the current cycle (the ``now`` decide() is called with): their
        # events are written after the cycle's findings, and the cycle's node records
        # predate them, so the store shows neither yet.
        self._cycle: datetime | None = None
        self._drained_runs: dict[str, datetime] = {}
        self._drained_hosts: set[str] = set()

    def decide(self, attempt: Attempt, host: str, evidence: str, step: int | None,
               every_s: float, now: datetime) -> NewEvent:
        """Drain ``host`` if :func:`drain_refusal` allows it; the event recording what was done
        (``node.drained`` or ``training.straggler_kept``), for the caller to append with the
        finding."""
        if self._cycle != now:
            self._cycle, self._drained_runs, self._drained_hosts = now, {}, set()
        run = self._store.get_run(attempt.run_id)
        spec = spec_of(run)
        nodes_now = {n.name: n for n in self._store.list_nodes()}
        last_drain = self._drained_runs.get(run.id)  # this cycle's first: not in the store yet
        if last_drain is None:
            drains = [e for e in self._store.events(run_id=run.id, kinds=[Kind.NODE_DRAINED],
                                                    since=now - timedelta(seconds=every_s))
                      if "straggler" in e.data]
            last_drain = drains[-1].ts if drains else None
        partition: list[str] | None = None
        why: str | None = None
        if host in attempt.nodes:
            try:
                partition = self._slurm.partition_nodes(spec.partition)
            except SlurmError as exc:
                why = f"the run's partition nodes are unknown: {str(exc)[:120]}"
        why = why or drain_refusal(
            host=host, run_id=run.id, attempt_nodes=attempt.nodes, nodes_now=nodes_now,
            last_drain=last_drain, every_s=every_s, now=now,
            partition=partition, excluded=attempt.excluded_nodes,
            needed=spec.nodes + spec.spare_nodes, drained_now=self._drained_hosts)
        data: dict[str, object] = {"step": step} if step is not None else {}
        if why is None:
            reason = straggler_reason(run.id, attempt.slurm_job_id, evidence)
            try:
                # nodes_now={}: sent even over an earlier drain of ours (the reason names the run);
                # the caller records the event returned here.
                self._nodes.drain(host, reason, nodes_now={}, record=False)
            except SlurmError as exc:
                why = f"the drain failed: {str(exc)[:160]}"
            else:
                self._drained_runs[run.id] = now
                self._drained_hosts.add(host)
                return NewEvent(Kind.NODE_DRAINED, run_id=run.id, attempt_id=attempt.id, node=host,
                                data={"reason": reason, "straggler": evidence[:500], **data})
        log.info("training.straggler_kept", node=host, why=why)
        return NewEvent(Kind.TRAINING_STRAGGLER_KEPT, run_id=run.id, attempt_id=attempt.id, node=host,
                        data={"why": why, **data})
