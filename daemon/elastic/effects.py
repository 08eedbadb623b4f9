"""Carrying out :func:`b300.elastic.members.decide` for one dead node: the events first (a
crash after them is finished when the node is reported again: the plan is rewritten from
them), then the job's ``elastic.json``; the job's host starts the agent."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

import structlog

from ..events import Kind
from ..interfaces import NewEvent, Store
from ..model import Attempt, NodeRecord
from ..payloads import AttemptStateChange
from ..spec import JobSpec
from . import host
from .members import JOINED, FallBack, MemberLeft, Nothing, StartAgent, decide

log = structlog.get_logger(__name__)


def first_allocation(store: Store, attempt: Attempt) -> list[str]:
    """The attempt's nodes as Slurm first listed them (its first ``attempt.state`` with
    nodes; Slurm drops a DOWN node from a ``--no-kill`` job's list), else its nodes now."""
    for e in store.events(run_id=attempt.run_id, kinds=[Kind.ATTEMPT_STATE]):
        nodes = AttemptStateChange.of(e).nodes
        if e.attempt_id == attempt.id and nodes:
            return list(nodes)
    return list(attempt.nodes)


def on_dead(store: Store, attempt: Attempt, spec: JobSpec, node: str, now: datetime, *,
            folder: str, cause: str = "dead", nodes_now: Mapping[str, NodeRecord] | None = None) -> str:
    """Decide and act; the outcome in one word for the caller: ``fallback`` (cancel the job,
    recovery resubmits), ``kept`` (the job goes on) or ``nothing``. ``cause``: ``dead``
    (the daemon's liveness checks) or ``slurm`` (Slurm reports the node down); ``nodes_now``:
    the cycle's node view (else the store's nodes)."""
    assert attempt.slurm_job_id is not None
    job_id = attempt.slurm_job_id
    history = [(str(e.kind), e.data)
               for e in store.events(run_id=attempt.run_id,
                                     kinds=[Kind.ELASTIC_MEMBER_LEFT, Kind.ELASTIC_MEMBER_JOINED])
               if e.attempt_id == attempt.id]
    status = host.read_status(folder) or {}
    known = nodes_now.values() if nodes_now is not None else store.list_nodes()
    unusable = [n.name for n in known if any(s in n.state.upper() for s in ("DOWN", "DRAIN", "FAIL"))]
    allocation = first_allocation(store, attempt)
    batch_host = str(status.get("batch_host") or (allocation[0] if allocation else ""))
    actions = decide(spec, node=node, allocation=allocation, batch_host=batch_host,
                     history=history, unusable=unusable)
    events: list[NewEvent] = []
    outcome = "nothing"
    e = spec.elastic
    assert e is not None
    for a in actions:
        if isinstance(a, MemberLeft):
            events.append(NewEvent(Kind.ELASTIC_MEMBER_LEFT, run_id=attempt.run_id,
                                   attempt_id=attempt.id, node=a.node, data={
                                       "job_id": job_id, "node": a.node, "cause": cause,
                                       "members": list(a.members), "restarts_used": a.restarts_used,
                                       "max_restarts": e.max_restarts, "then": a.then}))
            events.append(NewEvent(Kind.NODE_FAILED, run_id=attempt.run_id, attempt_id=attempt.id,
                                   node=a.node, data={"job_id": job_id, "outcome": "INFRA"}))
            outcome = "kept"
        elif isinstance(a, StartAgent):
            events.append(NewEvent(Kind.ELASTIC_MEMBER_JOINED, run_id=attempt.run_id,
                                   attempt_id=attempt.id, node=a.node, data={
                                       "job_id": job_id, "node": a.node, "generation": a.generation,
                                       "replaces": a.replaces, "members": list(a.members),
                                       "spares_left": a.spares_left}))
        elif isinstance(a, FallBack):
            outcome = "fallback"
            log.warning("elastic.fallback", node=node, why=a.why)
        elif isinstance(a, Nothing):
            log.info("elastic.nothing", node=node, why=a.why)
    if events:
        store.append_events(events, now)
    # The plan: every agent the daemon added to this job, from the record (so a crash
    # between the events and the file is finished when the node is reported again).
    added = sorted({str(d.get("node")) for k, d in history if k == JOINED}
                   | {a.node for a in actions if isinstance(a, StartAgent)})
    if added:
        generation = len(added)
        try:
            host.write_plan(folder, job_id, generation, added)
        except OSError as exc:
            log.warning("elastic.plan_not_written", error=str(exc))
    return outcome
