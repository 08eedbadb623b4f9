"""Recovery with the daemon's own liveness checks (issue 14): a node they confirmed dead is
the suspect whatever Slurm says yet; peer/NCCL errors wait for the checks, not for Slurm."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from b300.model import Attempt, AttemptState
from b300.recovery.classify import Outcome, Verdict, classify_end
from b300.spec import parse_spec

NOW = datetime(2026, 12, 1, 10, tzinfo=UTC)
SPEC = parse_spec("name = 'x'\n[job]\ncommand = 'a'\nnodes = 2\n[checkpoint]\ndir = '/c'\n")
NODES = ("gpu01", "gpu02")
PEER_LOG = ["RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
            "Connection closed by peer [127.0.0.1]:2155"]


def _ended(state: AttemptState, ago_s: float) -> Attempt:
    end = NOW - timedelta(seconds=ago_s)
    return Attempt(1, "r", 1, "b300-r-a1", state, NOW, NOW, slurm_job_id=7, nodes=NODES,
                   exit_code=1, signal=0, start=NOW - timedelta(hours=1), end=end)


def _verdict(attempt: Attempt, *, lost: tuple[str, ...] = (), health: dict[str, str] | None = None,
             log: list[str] | None = None) -> Verdict:
    return classify_end(attempt, SPEC, {}, log if log is not None else PEER_LOG,
                        cancel_requested=False, hang_detected=False, now=NOW, settle_s=60,
                        lost=lost, node_health=health, detect_window_s=4.5)


def test_an_attempt_the_daemon_ended_for_a_dead_node_is_infra_with_that_suspect() -> None:
    for state in (AttemptState.CANCELLED, AttemptState.NODE_FAIL, AttemptState.FAILED):
        v = _verdict(_ended(state, 1), lost=("gpu02",), log=[])
        assert (v.outcome, v.resubmit, v.suspects, v.wait) == (Outcome.INFRA, True, ("gpu02",), False), state
        assert any("confirmed dead by b300d's checks: gpu02" in r for r in v.reasons)
    # A node not of this attempt is no evidence against it.
    assert _verdict(_ended(AttemptState.CANCELLED, 1), lost=("gpu09",), log=[]).outcome is Outcome.CANCELLED


def test_peer_errors_wait_for_the_checks_not_for_slurm() -> None:
    # The checks have a verdict: no wait.
    dead = _verdict(_ended(AttemptState.FAILED, 2), health={"gpu01": "alive", "gpu02": "dead"})
    assert (dead.outcome, dead.suspects, dead.wait) == (Outcome.INFRA, ("gpu02",), False)
    # A node still being checked: wait (bounded by settle)...
    assert _verdict(_ended(AttemptState.FAILED, 10), health={"gpu01": "alive", "gpu02": "undecided"}).wait
    # ...but no longer than settle.
    late = _verdict(_ended(AttemptState.FAILED, 61), health={"gpu01": "alive", "gpu02": "undecided"})
    assert not late.wait and late.implicated == NODES
    # Every node answered: once the checks had the time to see a node that died with the
    # job, it is an infrastructure failure with no node to blame; before that, wait.
    assert _verdict(_ended(AttemptState.FAILED, 2), health={"gpu01": "alive", "gpu02": "alive"}).wait
    alive = _verdict(_ended(AttemptState.FAILED, 5), health={"gpu01": "alive", "gpu02": "alive"})
    assert (alive.outcome, alive.suspects, alive.implicated, alive.wait) == (Outcome.INFRA, (), NODES, False)


def test_without_the_checks_the_settle_wait_is_as_before() -> None:
    for health in (None, {"gpu01": "alive", "gpu02": "unknown"}):
        assert _verdict(_ended(AttemptState.FAILED, 10), health=health).wait
        assert not _verdict(_ended(AttemptState.FAILED, 61), health=health).wait
