"""The daemon-held spare pool ([spares], issue 15's fallback): its config, and the pure
decisions of refilling a pool and placing a resubmitted job in it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from b300.config import load_config
from b300.errors import ConfigError
from b300.events import Kind
from b300.model import AttemptState, NodeObservation, RunState
from b300.spares.pool import (
    NO_HOLD,
    Reservation,
    Waiting,
    healthy_idle,
    keep_surplus,
    lacks_no_hold,
    node_states,
    parse_reservations,
    place,
    pooled_reservation,
    promised,
    refill,
)


def _config(tmp_path: Path, text: str):  # type: ignore[no-untyped-def]
    p = tmp_path / "b300.toml"
    p.write_text(text)
    return load_config(str(p))


def test_spares_are_off_by_default(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "[daemon]\nstate_dir = '/srv/b300'\n")
    assert cfg.spares.pools == () and cfg.spares.pool_for("gpu") is None


def test_a_pool_per_partition(tmp_path: Path) -> None:
    cfg = _config(tmp_path, "[spares]\nenabled = true\n[[spares.pool]]\npartition = 'gpu'\nnodes = 2\n"
                            "[[spares.pool]]\npartition = 'h100'\nnodes = 1\n")
    pool = cfg.spares.pool_for("gpu")
    assert pool is not None and pool.nodes == 2 and pool.reservation == "b300-spares-gpu"
    assert [p.partition for p in cfg.spares.pools] == ["gpu", "h100"]
    assert cfg.spares.pool_for(None) is None
    # Written but not enabled: no pool in force.
    off = _config(tmp_path, "[[spares.pool]]\npartition = 'gpu'\nnodes = 2\n")
    assert off.spares.pools == ()


@pytest.mark.parametrize(("text", "message"), [
    ("[spares]\nenabled = true\n", "needs at least one [[spares.pool]]"),
    ("[spares]\nenabled = 'yes'\n", "[spares] enabled must be true or false"),
    ("[[spares.pool]]\npartition = 'gpu'\nnodes = 0\n", "[spares] pool[0].nodes must be >= 1, got 0"),
    ("[[spares.pool]]\npartition = 'gpu'\nnodes = '2'\n", "nodes must be an integer"),
    ("[[spares.pool]]\npartition = 'g pu'\nnodes = 1\n", "must be a partition name"),
    ("[[spares.pool]]\nnodes = 1\n", "[spares] pool[0].partition is missing"),
    ("[[spares.pool]]\npartition = 'gpu'\nnodes = 1\nsize = 3\n", "unknown key 'size'"),
    ("[[spares.pool]]\npartition = 'gpu'\nnodes = 1\n[[spares.pool]]\npartition = 'gpu'\nnodes = 2\n",
     "partition 'gpu' has two pools"),
    ("[spares]\nrefill_interval_s = 0.1\n", "refill_interval_s must be >= 1"),
    ("[spares]\nuser = 'a b'\n", "user must be a user name"),
])
def test_bad_spares_configs(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        _config(tmp_path, text)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_reservations_are_parsed() -> None:
    out = ("ReservationName=b300-spares-gpu StartTime=2026-12-02T09:35:37 EndTime=2027-12-02T09:35:37 "
           "Duration=365-00:00:00 Nodes=gpu[05-06] NodeCnt=2 CoreCnt=4 Features=(null) "
           "PartitionName=gpu Flags=SPEC_NODES TRES=cpu=4 Users=root Groups=(null) State=ACTIVE\n"
           "ReservationName=other Nodes=(null) Users=bob\n")
    spares, other = parse_reservations(out)
    assert spares == Reservation("b300-spares-gpu", ("gpu05", "gpu06"), "root", "gpu", "SPEC_NODES", "ACTIVE")
    assert other.name == "other" and other.nodes == ()
    assert parse_reservations("No reservations in the system\n") == []


def test_healthy_idle_is_free_and_well() -> None:
    states = node_states([NodeObservation("a", "IDLE"), NodeObservation("b", "IDLE", flags=("*",)),
                          NodeObservation("c", "DRAINED"), NodeObservation("d", "MIXED"),
                          NodeObservation("e", "RESERVED"), NodeObservation("f", "IDLE", flags=("~",)),
                          NodeObservation("g", "DOWN", flags=("*",))])
    assert [n for n, s in states.items() if healthy_idle(s)] == ["a", "e"]
    assert not healthy_idle(None)


NODES = [f"gpu{i:02d}" for i in range(1, 7)]


def _states(**by_node: str) -> dict[str, str]:
    return {n: by_node.get(n, "IDLE") for n in NODES}


def test_refill_creates_the_pool_from_healthy_idle_nodes_only() -> None:
    states = _states(gpu01="ALLOCATED", gpu02="MIXED", gpu03="DRAINED", gpu04="IDLE*")
    plan = refill(wanted=2, current=(), partition_nodes=NODES, nodes_now=states, avoid=set(),
                  other_reserved=set(), keep_surplus=False)
    assert plan.nodes == ("gpu05", "gpu06") and plan.added == ("gpu05", "gpu06") and plan.short == 0


def test_refill_never_takes_a_busy_drifted_or_otherwise_reserved_node() -> None:
    states = _states(gpu01="ALLOCATED", gpu02="ALLOCATED")
    plan = refill(wanted=3, current=(), partition_nodes=NODES, nodes_now=states, avoid={"gpu03"},
                  other_reserved={"gpu04"}, keep_surplus=False)
    assert plan.nodes == ("gpu05", "gpu06") and plan.short == 1


def test_refill_replaces_a_node_taken_by_a_job_and_keeps_the_job_s_nodes_reserved() -> None:
    # The resubmitted job runs on gpu05, gpu06 (inside the pool): two idle ones are added.
    states = _states(gpu01="ALLOCATED", gpu02="ALLOCATED", gpu05="ALLOCATED", gpu06="ALLOCATED")
    plan = refill(wanted=2, current=("gpu05", "gpu06"), partition_nodes=NODES, nodes_now=states,
                  avoid=set(), other_reserved=set(), keep_surplus=False)
    assert plan.nodes == ("gpu05", "gpu06", "gpu03", "gpu04")
    assert plan.held == ("gpu05", "gpu06") and plan.idle == ("gpu03", "gpu04") and plan.removed == ()


def test_refill_drops_drained_and_drifted_nodes_and_surplus_unless_a_run_waits() -> None:
    states = _states(gpu03="DRAINED")
    current = ("gpu03", "gpu04", "gpu05", "gpu06")
    plan = refill(wanted=1, current=current, partition_nodes=NODES, nodes_now=states, avoid={"gpu04"},
                  other_reserved=set(), keep_surplus=False)
    assert plan.nodes == ("gpu05",) and set(plan.removed) == {"gpu03", "gpu04", "gpu06"}
    kept = refill(wanted=1, current=current, partition_nodes=NODES, nodes_now=states, avoid={"gpu04"},
                  other_reserved=set(), keep_surplus=True)
    assert kept.nodes == ("gpu05", "gpu06") and kept.idle == ("gpu05", "gpu06")


def test_refill_leaves_a_full_pool_alone() -> None:
    plan = refill(wanted=2, current=("gpu05", "gpu06"), partition_nodes=NODES, nodes_now=_states(),
                  avoid=set(), other_reserved=set(), keep_surplus=False)
    assert plan.nodes is None and plan.idle == ("gpu05", "gpu06")


def test_placement_needs_every_node_of_the_job_in_the_pool() -> None:
    pool = Reservation("b300-spares-gpu", ("gpu04", "gpu05", "gpu06"))
    states = _states(gpu04="DOWN")
    found = place(reservation=pool, partition="gpu", needed=2, nodes_now=states, excluded=set(), avoid=set())
    assert found is not None and found.usable == ("gpu05", "gpu06") and found.reservation == pool.name
    # An excluded or drifted node does not count: too few left, the plain resubmission.
    assert place(reservation=pool, partition="gpu", needed=2, nodes_now=states, excluded={"gpu05"},
                 avoid=set()) is None
    assert place(reservation=pool, partition="gpu", needed=2, nodes_now=states, excluded=set(),
                 avoid={"gpu06"}) is None
    assert place(reservation=None, partition="gpu", needed=1, nodes_now=states, excluded=set(),
                 avoid=set()) is None
    assert place(reservation=pool, partition="gpu", needed=3, nodes_now=_states(), excluded=set(),
                 avoid=set()) is not None


def test_the_pool_is_a_metric_and_a_b300ctl_nodes_table(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from b300.cli.nodes import spare_pools
    from b300.events import Kind
    from b300.interfaces import NewEvent
    from b300.ops.health import CycleSnapshot
    from b300.ops.metrics import collect_metrics, render_metrics
    from b300.store import open_store

    store = open_store(f"sqlite:///{tmp_path}/state.db")
    try:
        now = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
        for idle in (["gpu05", "gpu06"], ["gpu06"]):   # the latest record of a pool wins
            store.append_events([NewEvent(Kind.SPARES_POOL, actor="spares", data={
                "partition": "gpu", "reservation": "b300-spares-gpu", "wanted": 2,
                "nodes": ["gpu05", "gpu06"], "idle": idle, "held": ["gpu05"][:2 - len(idle)]})], now)
        m = collect_metrics(store, CycleSnapshot(1, 0, 0.1, None, None), now)
        assert m.spare_pool_nodes == {"gpu": 1}
        assert 'b300_spare_pool_nodes{partition="gpu"} 1.0' in render_metrics(m)
        [pool] = spare_pools(store.events(kinds=[Kind.SPARES_POOL]))
        assert (pool["reservation"], pool["wanted"], pool["idle"], pool["held"]) == (
            "b300-spares-gpu", 2, ["gpu06"], ["gpu05"])
    finally:
        store.close()
    # No pool configured: no such metric at all.
    empty = open_store(f"sqlite:///{tmp_path}/empty.db")
    try:
        none = collect_metrics(empty, CycleSnapshot(1, 0, 0.1, None, None), now)
    finally:
        empty.close()
    assert none.spare_pool_nodes == {} and "b300_spare_pool_nodes" not in render_metrics(none)


# -- the reviewer's defects (pending pooled jobs, surplus, the user) ---------------------

def test_a_pool_made_without_no_hold_jobs_after_end_gets_it() -> None:
    line = ("ReservationName=b300-spares-gpu Nodes=gpu06 PartitionName=gpu Flags={} Users=root "
            "State=ACTIVE\n")
    [old] = parse_reservations(line.format("SPEC_NODES"))
    [new] = parse_reservations(line.format("SPEC_NODES,NO_HOLD_JOBS_AFTER_END"))
    assert lacks_no_hold(old) and not lacks_no_hold(new) and NO_HOLD == "NO_HOLD_JOBS_AFTER_END"


def test_the_pool_is_never_deleted_under_a_job_pending_in_it() -> None:
    # Its one node drained, no free node to replace it: with nothing promised the pool
    # goes (an empty list: deleted); with a job placed there and not started, it stays.
    states = _states(gpu01="ALLOCATED", gpu02="ALLOCATED", gpu03="ALLOCATED", gpu04="ALLOCATED",
                     gpu05="ALLOCATED", gpu06="DRAINED")
    gone = refill(wanted=1, current=("gpu06",), partition_nodes=NODES, nodes_now=states, avoid=set(),
                  other_reserved=set(), keep_surplus=False)
    assert gone.nodes == ()
    kept = refill(wanted=1, current=("gpu06",), partition_nodes=NODES, nodes_now=states, avoid=set(),
                  other_reserved=set(), keep_surplus=True, promised=1)
    assert kept.nodes is None and kept.short == 2


def _waiting(run: RunState, attempt: AttemptState | None, resv: str | None, needed: int = 2,
             attempt_id: int = 1, partition: str = "gpu") -> Waiting:
    return Waiting(run, attempt, partition, resv, needed, attempt_id)


def test_nodes_promised_to_a_pending_pooled_job_are_not_placed_twice() -> None:
    pool = Reservation("b300-spares-gpu", ("gpu05", "gpu06"))
    # The first run recovered this cycle went into the pool: its job is pending there,
    # gpu05 and gpu06 still idle. The second run of the same cycle must not get them.
    runs = [_waiting(RunState.PENDING, AttemptState.PENDING, pool.name, attempt_id=7),
            _waiting(RunState.PENDING, AttemptState.PENDING, None, needed=4, attempt_id=8),
            _waiting(RunState.RUNNING, AttemptState.RUNNING, pool.name, attempt_id=9)]
    owed = promised(runs, pool.name)
    assert owed == 2
    assert place(reservation=pool, partition="gpu", needed=2, nodes_now=_states(), excluded=set(),
                 avoid=set(), promised=owed) is None
    # The attempt asking again for its own place (a deferred sbatch) does not count itself.
    assert promised(runs, pool.name, ignore=(7,)) == 0
    assert place(reservation=pool, partition="gpu", needed=2, nodes_now=_states(), excluded=set(),
                 avoid=set(), promised=promised(runs, pool.name, ignore=(7,))) is not None
    # Refill aims at K plus what is promised: two more idle nodes for K = 2.
    plan = refill(wanted=2, current=pool.nodes, partition_nodes=NODES, nodes_now=_states(),
                  avoid=set(), other_reserved=set(), keep_surplus=True, promised=owed)
    assert plan.added == ("gpu01", "gpu02") and len(plan.idle) == 4 and plan.short == 0


def test_the_pool_an_attempt_is_placed_in_comes_from_its_events() -> None:
    intent = (Kind.ATTEMPT_INTENT, {"resubmit": True, "reservation": "b300-spares-gpu"})
    assert pooled_reservation([intent]) == "b300-spares-gpu"
    assert pooled_reservation([(Kind.ATTEMPT_INTENT, {"resubmit": True})]) is None
    assert pooled_reservation([intent, (Kind.SPARES_USED, {"reservation": "b300-spares-gpu",
                                                          "refused": True})]) is None
    assert pooled_reservation([intent, (Kind.SPARES_USED, {"reservation": "b300-spares-gpu",
                                                          "dropped": True})]) is None
    assert pooled_reservation([intent, (Kind.SPARES_USED, {"reservation": "b300-spares-gpu",
                                                          "job_id": 12})]) == "b300-spares-gpu"


def test_surplus_is_kept_only_for_recovering_runs_and_jobs_waiting_in_the_pool() -> None:
    resv = "b300-spares-gpu"
    queued = [_waiting(RunState.PENDING, AttemptState.PENDING, None),
              _waiting(RunState.SUBMITTING, AttemptState.SUBMITTING, None),
              _waiting(RunState.RECOVERING, None, None, partition="h100"),
              _waiting(RunState.RUNNING, AttemptState.RUNNING, resv)]
    assert not keep_surplus(queued, "gpu", resv)
    assert keep_surplus([*queued, _waiting(RunState.RECOVERING, AttemptState.FAILED, None)], "gpu", resv)
    assert keep_surplus([*queued, _waiting(RunState.PENDING, AttemptState.PENDING, resv)], "gpu", resv)


def test_a_uid_without_a_passwd_entry_is_a_one_line_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import pwd

    from b300.spares.pool_config import load_spares_config
    from b300.spares.pools import pool_user

    uid = next(u for u in range(2_000_000_000, 2_000_000_100) if not _has_passwd(pwd, u))
    monkeypatch.setattr("os.geteuid", lambda: uid)
    cfg = load_spares_config({"enabled": True, "pool": [{"partition": "gpu", "nodes": 1}]})
    with pytest.raises(ConfigError) as err:
        pool_user(cfg)
    assert f"uid {uid} has no passwd entry" in str(err.value) and "\n" not in str(err.value)
    assert err.value.exit_code == 2
    named = load_spares_config({"enabled": True, "user": "trainer",
                                "pool": [{"partition": "gpu", "nodes": 1}]})
    assert pool_user(named) == "trainer"


def _has_passwd(pwd: Any, uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return False
    return True
