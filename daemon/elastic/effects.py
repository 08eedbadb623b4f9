"""Carrying out :func:`b300.elastic.members.decide` for one dead node: the events first (a
crash after them is finished when the node is reported again: the plan is rewritten from
them), then the job's ``elastic.json``; the job's host starts the agent."""

from __future__ import annotations

from datetime import datetime

import structlog

from ..events import Kind
from ..interfaces import NewEvent, Store
from ..model import Attempt
from ..spec import JobSpec
from . import host
from .members import JOINED, FallBack, MemberLeft, Nothing, StartAgent, decide

log = structlog.get_logger(__name__)


def on_dead(store: Store, attempt: Attempt, spec: JobSpec, node: str, now: datetime, *,
            folder: str) -> str:
    """Decide and act; the outcome in one word for the caller: ``fallback`` (cancel the job,
    recovery resubmits), ``kept`` (the job goes on) or ``nothing``."""
    assert attempt.slurm_job_id is not None
    job_id = attempt.slurm_job_id
    history = [(str(e.kind), e.data)
               for e in store.events(run_id=attempt.run_id,
                                     kinds=[Kind.ELASTIC_MEMBER_LEFT, Kind.ELASTIC_MEMBER_JOINED])
               if e.attempt_id == attempt.id]
    status = host.read_status(folder) or {}
    batch_host = str(status.get("batch_host") or (attempt.nodes[0] if attempt.nodes else ""))
    unusable = [n.name for n in store.list_nodes()
                if any(s in n.state.upper() for s in ("DOWN", "DRAIN", "FAIL"))]
    actions = decide(spec, node=node, allocation=list(attempt.nodes), batch_host=batch_host,
                     history=history, unusable=unusable)
    events: list[NewEvent] = []
    outcome = "nothing"
    e = spec.elastic
    assert e is not None
    for a in actions:
        if isinstance(a, MemberLeft):
            events.append(NewEvent(Kind.ELASTIC_MEMBER_LEFT, run_id=attempt.run_id,
                                   attempt_id=attempt.id, node=a.node, data={
                                       "job_id": job_id, "node": a.node, "cause": "dead",
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
