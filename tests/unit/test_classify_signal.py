"""An attempt that ended within signal_grace of the daemon's checkpoint signal is the daemon's
doing (SIGNALLED, resubmitted), never the job's error; later ends are judged as before."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from b300.model import Attempt, AttemptState, NodeRecord
from b300.recovery.classify import INFRA_BUDGET, Outcome, SignalSent, classify_end, retries_used
from b300.spec import parse_spec

NOW = datetime(2026, 12, 1, 10, tzinfo=UTC)
SPEC = parse_spec("name = 'x'\n[job]\ncommand = 'a'\nnodes = 1\n[checkpoint]\ndir = '/c'\nsignal = 'USR1'\n")


def _ended(state: AttemptState, end: datetime, nodes: tuple[str, ...] = ("gpu01",)) -> Attempt:
    # What sacct shows for a batch shell killed by USR1: FAILED, exit 0:10.
    return Attempt(1, "r", 1, "b300-r-a1", state, NOW, NOW, slurm_job_id=7, nodes=nodes,
                   exit_code=0, signal=10, start=NOW - timedelta(hours=1), end=end)


def _classify(attempt: Attempt, sent: SignalSent | None, nodes: dict[str, NodeRecord] | None = None) -> Outcome:
    return classify_end(attempt, SPEC, nodes or {}, [], cancel_requested=False, hang_detected=False,
                        now=NOW + timedelta(minutes=10), settle_s=60, signal_sent=sent).outcome


def test_an_end_right_after_the_signal_is_signalled_and_resubmitted() -> None:
    sent = SignalSent(NOW, "USR1", 300.0)
    v = classify_end(_ended(AttemptState.FAILED, NOW + timedelta(seconds=0.4)), SPEC, {}, [],
                     cancel_requested=False, hang_detected=False, now=NOW, settle_s=60, signal_sent=sent)
    assert v.outcome is Outcome.SIGNALLED and v.resubmit
    assert "after b300d sent USR1" in v.reasons[-1] and "the daemon's doing" in v.reasons[-1]
    # Slurm's end time has whole seconds: an end stamped in the second before the signal counts too.
    assert _classify(_ended(AttemptState.FAILED, NOW - timedelta(seconds=0.5)), sent) is Outcome.SIGNALLED
    # SIGNALLED does not spend the infrastructure budget (the watcher stops signalling that run instead).
    assert Outcome.SIGNALLED not in INFRA_BUDGET


def test_without_a_signal_or_after_the_grace_it_is_the_jobs_error() -> None:
    assert _classify(_ended(AttemptState.FAILED, NOW), None) is Outcome.JOB_ERROR
    late = _ended(AttemptState.FAILED, NOW + timedelta(seconds=301))
    assert _classify(late, SignalSent(NOW, "USR1", 300.0)) is Outcome.JOB_ERROR
    before = _ended(AttemptState.FAILED, NOW - timedelta(seconds=5))
    assert _classify(before, SignalSent(NOW, "USR1", 300.0)) is Outcome.JOB_ERROR


def test_a_node_that_failed_at_the_same_time_is_still_infra() -> None:
    down = {"gpu01": NodeRecord("gpu01", "DOWN", "Not responding", NOW)}
    attempt = _ended(AttemptState.FAILED, NOW + timedelta(seconds=1))
    assert _classify(attempt, SignalSent(NOW, "USR1", 300.0), down) is Outcome.INFRA
    assert _classify(_ended(AttemptState.COMPLETED, NOW), SignalSent(NOW, "USR1", 300.0)) is Outcome.COMPLETED
    assert retries_used([attempt]) == (0, 0)
