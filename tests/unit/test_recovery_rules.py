"""Recovery's pure rules: exclusions with a cause and an end, whom a failure is
blamed on, and the black-hole count."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from b300.model import Attempt, AttemptState, Event, NodeRecord
from b300.recovery.classify import (
    BlackHolePolicy,
    Outcome,
    black_holes,
    classify_end,
    first_task_end,
    last_returns,
    own_exception_lines,
)
from b300.recovery.exclusions import Exclusion, exclusions_of, plan_exclusions
from b300.slurm.parse import parse_default_partition, parse_partition_nodes
from b300.spec import parse_spec

T0 = datetime(2026, 1, 1, tzinfo=UTC)
NODES = [f"gpu0{i}" for i in range(1, 5)]


def _node(name: str, state: str = "IDLE", reason: str = "") -> NodeRecord:
    return NodeRecord(name, state, reason, T0)


def _healthy(**bad: str) -> dict[str, NodeRecord]:
    return {n: _node(n, bad.get(n, "IDLE")) for n in NODES}


def test_an_exclusion_ends_with_its_cause() -> None:
    cands = [Exclusion("gpu01", "failed"), Exclusion("gpu02", "failed"),
             Exclusion("gpu03", "drift"), Exclusion("gpu04", "operator")]
    plan = plan_exclusions(cands, nodes_now=_healthy(gpu01="DRAINED"), drift=set(),
                           black_holes=set(), partition_nodes=None, needed=1)
    assert plan.nodes == ["gpu01", "gpu04"]
    assert {e.node for e, _ in plan.dropped} == {"gpu02", "gpu03"} and not plan.trimmed
    # The run's own failure on a node still weighs while it is in the black-hole window.
    plan = plan_exclusions(cands[1:2], nodes_now=_healthy(), drift=set(),
                           black_holes={"gpu02"}, partition_nodes=None, needed=1)
    assert plan.nodes == ["gpu02"]


def test_exclusions_never_make_a_run_unschedulable() -> None:
    cands = [Exclusion(n, "failed") for n in ("gpu01", "gpu02", "gpu03")]
    nodes = _healthy(gpu01="DOWN", gpu02="DRAINED", gpu03="DRAINED")
    # Needs 2 of 4: excluding three would be refused by Slurm; bad nodes are skipped anyway.
    plan = plan_exclusions(cands, nodes_now=nodes, drift=set(), black_holes=set(),
                           partition_nodes=NODES, needed=2)
    assert plan.nodes == [] and plan.trimmed
    # An operator's exclusion of a healthy node goes only when nothing else helps.
    plan = plan_exclusions([Exclusion("gpu04", "operator"), cands[0]], nodes_now=nodes,
                           drift=set(), black_holes=set(), partition_nodes=NODES, needed=3)
    assert plan.nodes == ["gpu04"] and plan.trimmed
    plan = plan_exclusions([Exclusion("gpu04", "operator")], nodes_now=nodes, drift=set(),
                           black_holes=set(), partition_nodes=NODES, needed=4)
    assert plan.nodes == [] and plan.trimmed
    # Enough room: everything whose cause holds is kept.
    plan = plan_exclusions(cands, nodes_now=nodes, drift=set(), black_holes=set(),
                           partition_nodes=NODES, needed=1)
    assert plan.nodes == ["gpu01", "gpu02", "gpu03"] and not plan.trimmed


def test_exclusions_read_back_from_the_intent() -> None:
    data = {"exclusions": [{"node": "gpu02", "cause": "operator", "detail": "by root"},
                           {"node": "gpu09", "cause": "drift"}]}
    got = exclusions_of(data, ["gpu02", "gpu03"])
    assert got == [Exclusion("gpu02", "operator", "by root"),
                   Exclusion("gpu03", "failed", "excluded before causes were recorded")]


def test_partition_nodes_from_sinfo() -> None:
    out = "gpu01|batch*\ngpu01|small\ngpu02|batch*\ngpu03|small\n\n"
    assert parse_partition_nodes(out, None) == ["gpu01", "gpu02"]
    assert parse_partition_nodes(out, "small") == ["gpu01", "gpu03"]
    assert parse_partition_nodes(out, "nope") == []
    assert parse_default_partition("small\nbatch*\n") == "batch"
    assert parse_default_partition("small\n*\n\n") is None


SPEC = parse_spec('name = "x"\n[job]\ncommand = "true"\nnodes = 2\n', where="spec")
CODE_CRASH = [
    "Traceback (most recent call last):",
    '  File "/x/train.py", line 99, in main',
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
    "Connection closed by peer [127.0.0.1]:2155",
    "[rank1]: Traceback (most recent call last):",
    '[rank1]:   File "/x/train.py", line 88, in main',
    "[rank1]: RuntimeError: bad hyperparameters at step 6",
    "srun: error: gpu02: task 1: Exited with exit code 1",
    "srun: error: gpu01: task 0: Exited with exit code 1",
]
NODE_DEATH = [
    "Traceback (most recent call last):",
    "RuntimeError: [pair.cc:534] Connection closed by peer [127.0.0.1]:2155",
    "srun: error: gpu01: task 0: Exited with exit code 1",
]


def _failed(nodes: tuple[str, ...] = ("gpu01", "gpu02")) -> Attempt:
    return Attempt(id=1, run_id="r", number=1, tag="b300-r-a1", state=AttemptState.FAILED,
                   created_at=T0, updated_at=T0, slurm_job_id=7, nodes=nodes, exit_code=1,
                   end=T0)


def test_a_ranks_own_exception_beats_its_peers_connection_errors() -> None:
    assert own_exception_lines(CODE_CRASH) == ("[rank1]: RuntimeError: bad hyperparameters at step 6",)
    assert first_task_end(CODE_CRASH) == "Exited with exit code 1"
    v = classify_end(_failed(), SPEC, _healthy(), CODE_CRASH, cancel_requested=False,
                     hang_detected=False, now=T0, settle_s=60)
    assert v.outcome is Outcome.JOB_ERROR and not v.resubmit and not v.wait
    assert not v.suspects and not v.implicated
    # Only peers' connection errors: wait for Slurm to name the node, as before.
    assert own_exception_lines(NODE_DEATH) == ()
    v = classify_end(_failed(), SPEC, _healthy(), NODE_DEATH, cancel_requested=False,
                     hang_detected=False, now=T0, settle_s=60)
    assert v.outcome is Outcome.INFRA and v.wait
    # A node Slurm shows bad still wins over a traceback.
    v = classify_end(_failed(), SPEC, _healthy(gpu02="DOWN"), CODE_CRASH,
                     cancel_requested=False, hang_detected=False, now=T0, settle_s=60)
    assert v.outcome is Outcome.INFRA and v.suspects == ("gpu02",)
    # The first task to end was killed (its node went): not the code's doing.
    killed = [*CODE_CRASH[:6], "srun: error: gpu02: task 1: Killed", *CODE_CRASH[6:]]
    v = classify_end(_failed(), SPEC, _healthy(), killed, cancel_requested=False,
                     hang_detected=False, now=T0, settle_s=60)
    assert v.outcome is Outcome.INFRA


def _ev(i: int, kind: str, node: str, ts: datetime, run: str | None = None,
        **data: object) -> Event:
    return Event(id=i, ts=ts, kind=kind, run_id=run, node=node, data=dict(data))


def test_black_hole_counts_infra_failures_since_the_node_last_came_back() -> None:
    policy = BlackHolePolicy(failures=2, window_s=3600)
    strikes = [
        _ev(1, "node.failed", "gpu01", T0, "a", outcome="INFRA"),
        _ev(2, "node.failed", "gpu01", T0 + timedelta(minutes=1), "b", outcome="INFRA"),
        _ev(3, "node.suspect", "gpu02", T0, "a", outcome="HANG"),
        _ev(4, "node.suspect", "gpu02", T0, "b", outcome="HANG"),
    ]
    now = T0 + timedelta(minutes=5)
    assert [h.node for h in black_holes(strikes, policy, now)] == ["gpu01"]
    # Returned with scontrol (seen in sinfo) after the first strike: the count starts again.
    back = last_returns([_ev(9, "node.state", "gpu01", T0 + timedelta(seconds=30),
                             old_state="DRAINED", old_reason="b300: x", state="IDLE", reason="")])
    assert black_holes(strikes, policy, now, back) == []
    back = last_returns([_ev(9, "node.resumed", "gpu01", T0 + timedelta(minutes=2))])
    assert black_holes(strikes, policy, now, back) == []
    # A change between two healthy states is no return.
    assert last_returns([_ev(9, "node.state", "gpu01", T0, old_state="IDLE", old_reason="",
                             state="MIXED", reason="")]) == {}
