"""The requeue reconcile's pure part: what a recorded Slurm requeue still needs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from b300.cycle.requeues import requeue_todo
from b300.model import Attempt, AttemptState, Event, NodeRecord

T0 = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)


def _req(suspects: list[str], *, job_id: int = 7, eid: int = 10) -> Event:
    return Event(eid, T0, "attempt.requeued", run_id="r", attempt_id=1,
                 data={"job_id": job_id, "nodes": ["gpu01", "gpu02"], "suspects": suspects})


def _attempt(state: AttemptState = AttemptState.PENDING, job_id: int = 7) -> Attempt:
    return Attempt(id=1, run_id="r", number=1, tag="b300-r-a1", state=state, created_at=T0, updated_at=T0,
                   slurm_job_id=job_id,
                   nodes=("gpu01", "gpu02"))


def _node(name: str, state: str = "IDLE", reason: str = "") -> NodeRecord:
    return NodeRecord(name=name, state=state, reason=reason, updated_at=T0)


IDLE = {"gpu01": _node("gpu01"), "gpu02": _node("gpu02", "DOWN", "not responding")}


def test_a_fresh_requeue_needs_its_drain_and_its_exclusion() -> None:
    todo = requeue_todo(_req(["gpu02"]), _attempt(), struck={"gpu02"}, drained=(), excluded_after=(),
                        nodes_now=IDLE, now=T0 + timedelta(seconds=1), settle_s=60)
    assert todo.drain == ("gpu02",) and todo.exclude and todo.strike == () and not todo.done


def test_what_is_recorded_done_is_not_decided_again() -> None:
    later = T0 + timedelta(seconds=120)  # settled: no late suspect can come
    todo = requeue_todo(_req(["gpu02"]), _attempt(), struck={"gpu02"}, drained={"gpu02"}, excluded_after=(11,),
                        nodes_now=IDLE, now=later, settle_s=60)
    assert todo.done
    # Drained by the daemon in Slurm (a crash before the event was written) counts as done.
    drained_now = {**IDLE, "gpu02": _node("gpu02", "DRAINED", "b300: run r job 7 requeued by Slurm")}
    todo = requeue_todo(_req(["gpu02"]), _attempt(AttemptState.RUNNING), struck={"gpu02"}, drained=(),
                        excluded_after=(), nodes_now=drained_now, now=later, settle_s=60)
    assert todo.done  # and a job running again is not moved


def test_an_exclusion_before_the_requeue_does_not_count() -> None:
    todo = requeue_todo(_req(["gpu02"], eid=10), _attempt(), struck={"gpu02"}, drained={"gpu02"},
                        excluded_after=(4,), nodes_now=IDLE, now=T0 + timedelta(seconds=120), settle_s=60)
    assert todo.exclude and todo.drain == ()


def test_a_node_shown_bad_after_the_requeue_is_a_late_suspect_only_while_settling() -> None:
    todo = requeue_todo(_req([]), _attempt(), struck=(), drained=(), excluded_after=(), nodes_now=IDLE,
                        now=T0 + timedelta(seconds=5), settle_s=60)
    assert todo.strike == ("gpu02",) and todo.drain == ("gpu02",) and todo.exclude
    todo = requeue_todo(_req([]), _attempt(), struck=(), drained=(), excluded_after=(), nodes_now=IDLE,
                        now=T0 + timedelta(seconds=61), settle_s=60)
    assert todo.done


def test_nothing_bad_nothing_to_do_once_settled() -> None:
    healthy = {"gpu01": _node("gpu01"), "gpu02": _node("gpu02")}
    todo = requeue_todo(_req([]), _attempt(), struck=(), drained=(), excluded_after=(), nodes_now=healthy,
                        now=T0 + timedelta(seconds=5), settle_s=60)
    assert todo.settling and not (todo.strike or todo.drain or todo.exclude)
    assert requeue_todo(_req([]), _attempt(), struck=(), drained=(), excluded_after=(), nodes_now=healthy,
                        now=T0 + timedelta(seconds=90), settle_s=60).done


def test_another_job_id_or_a_gone_attempt_is_not_excluded() -> None:
    for attempt in (_attempt(job_id=8), None):
        todo = requeue_todo(_req(["gpu02"]), attempt, struck={"gpu02"}, drained=(), excluded_after=(),
                            nodes_now=IDLE, now=T0, settle_s=60)
        assert not todo.exclude and todo.drain == ("gpu02",)
