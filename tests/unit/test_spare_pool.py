"""The daemon-held spare pool ([spares], issue 15's fallback): its config, and the pure
decisions of refilling a pool and placing a resubmitted job in it."""

from __future__ import annotations

from pathlib import Path

import pytest

from b300.config import load_config
from b300.errors import ConfigError
from b300.model import NodeObservation
from b300.spares.pool import Reservation, healthy_idle, node_states, parse_reservations, place, refill


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
    from b300.health import CycleSnapshot
    from b300.interfaces import NewEvent
    from b300.metrics import collect_metrics, render_metrics
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
