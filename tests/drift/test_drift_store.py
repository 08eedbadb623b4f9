"""DriftStore on SQLite and PostgreSQL: findings, drains, the matrix and their events."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from b300.drift.scan_records import Finding, FindingKind, Policy
from b300.store import SqlStore
from store_fixtures import (  # noqa: F401  (fixtures: store, store_url, pg_database)
    pg_database_fixture,
    store_fixture,
    store_url_fixture,
)

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def test_findings_drains_and_scans_with_their_events(store: SqlStore) -> None:
    drift = store.drift
    assert drift.last_scan() is None and drift.open_findings() == [] and drift.open_drift_nodes() == set()
    nccl = Finding("gpu03", "nccl", FindingKind.DRIFT, "2.23.4", "2.21.5", Policy.DRAIN)
    kernel = Finding("gpu02", "kernel", FindingKind.DRIFT, "6.1.0", "6.1.1", Policy.WARN)
    drift.record_scan(T0, T0, 4, {"gpu03": {"status": "ok"}}, [nccl, kernel], [])
    opened = drift.open_findings()
    assert [o.finding for o in opened] == [kernel, nccl] and opened[0].opened_at == T0
    assert drift.open_drift_nodes() == {"gpu03"}  # warn-only findings do not keep runs away
    drift.mark_drained("gpu03", "drift: nccl 2.21.5 != 2.23.4", T0)
    assert drift.drained_nodes() == {"gpu03": "drift: nccl 2.21.5 != 2.23.4"}

    later = T0 + timedelta(hours=1)
    drift.record_scan(later, later, 1, {"gpu03": {"status": "ok", "values": {}}},
                      [], [o for o in opened if o.finding == nccl], actor="alice")
    drift.release("gpu03", later, resumed=True, actor="alice")
    assert [o.finding for o in drift.open_findings()] == [kernel]
    assert drift.open_drift_nodes() == set() and drift.drained_nodes() == {}
    last = drift.last_scan()
    assert last is not None and last[1] == later and last[2] == {"gpu03": {"status": "ok", "values": {}}}
    events = [(e.kind, e.node, e.actor) for e in store.events()]
    assert events == [("drift.finding", "gpu03", "daemon"), ("drift.finding", "gpu02", "daemon"),
                      ("drift.drained", "gpu03", "daemon"), ("drift.cleared", "gpu03", "alice"),
                      ("drift.cleared", "gpu03", "alice")]
    assert store.events()[3].data["probe"] == "nccl" and store.events()[4].data["resumed"] is True
