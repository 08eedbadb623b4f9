"""CheckpointStore on SQLite and PostgreSQL: listings, verdicts, marks, replicas, prunes."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from b300.errors import NotFoundError
from b300.model import CheckpointInfo
from b300.store import SqlStore
from store_fixtures import pg_database_fixture, store_fixture, store_url_fixture  # noqa: F401

NOW = datetime(2026, 11, 29, 12, tzinfo=UTC)


def _ck(step: int, size: int = 100) -> CheckpointInfo:
    return CheckpointInfo(f"/ckpt/step_{step}", step, NOW - timedelta(hours=10 - step), True, size, 3)


def test_listing_verdicts_marks_replicas_and_prunes(store: SqlStore) -> None:
    store.create_run("r1", "r1", "spec", NOW)
    cs = store.checkpoints
    cs.record_listing("r1", [_ck(2), _ck(1)], NOW)
    assert [c.info.step for c in cs.checkpoints("r1")] == [1, 2]
    assert cs.checkpoints("r1")[0].verified is None

    cs.record_verification("r1", "/ckpt/step_1", True, NOW)
    cs.record_verification("r1", "/ckpt/step_2", False, NOW, ["'model.pt' does not match its sha256"])
    cs.set_marked("r1", "/ckpt/step_1", True, NOW, actor="alice")
    cs.record_replica("r1", "/ckpt/step_1", "s3", True, NOW, bytes_sent=100)
    cs.record_replica("r1", "/ckpt/step_1", "sftp", False, NOW, error="timeout")
    cs.record_replica("r1", "/ckpt/step_1", "sftp", True, NOW, bytes_sent=50)
    one, two = cs.checkpoints("r1")
    assert one.verified is True and one.marked and one.replicas == {"s3": True, "sftp": True}
    assert one.state().replicated_to == {"s3", "sftp"} and one.state().verified
    assert two.verified is False and two.replicas == {}
    kinds = [e.kind for e in store.events(run_id="r1")]
    assert kinds == ["checkpoint.corrupt", "checkpoint.marked", "checkpoint.replicated",
                     "checkpoint.replication_failed", "checkpoint.replicated"]

    # The same listing changes nothing; a resized checkpoint must be verified again.
    cs.record_listing("r1", [_ck(1), _ck(2)], NOW)
    assert cs.checkpoints("r1")[0].verified is True
    cs.record_listing("r1", [replace(_ck(1), size_bytes=5), _ck(2), _ck(3)], NOW)
    assert [c.verified for c in cs.checkpoints("r1")] == [None, False, None]

    cs.record_pruned("r1", ["/ckpt/step_2"], NOW)
    assert [c.info.step for c in cs.checkpoints("r1")] == [1, 3]
    assert len(cs.checkpoints("r1", include_deleted=True)) == 3
    cs.record_listing("r1", [_ck(3)], NOW)  # step_1 gone from disk
    assert [c.info.step for c in cs.checkpoints("r1")] == [3]


def test_checkpoints_of_many_runs_is_checkpoints_of_each(store: SqlStore) -> None:
    cs = store.checkpoints
    for run_id in ("r1", "r2", "r3"):
        store.create_run(run_id, run_id, "spec", NOW)
    cs.record_listing("r1", [_ck(2), _ck(1)], NOW)
    cs.record_listing("r2", [_ck(3)], NOW)
    cs.record_replica("r1", "/ckpt/step_2", "s3", True, NOW, bytes_sent=100)
    cs.record_pruned("r1", ["/ckpt/step_1"], NOW)  # deleted: left out, as checkpoints() does
    got = cs.checkpoints_of(["r2", "r1", "r3"])
    assert got == {"r2": cs.checkpoints("r2"), "r1": cs.checkpoints("r1"), "r3": []}
    assert [c.info.step for c in got["r1"]] == [2] and got["r1"][0].replicas == {"s3": True}


def test_save_time_is_kept_and_updated(store: SqlStore) -> None:
    store.create_run("r1", "r1", "spec", NOW)
    cs = store.checkpoints
    cs.record_listing("r1", [replace(_ck(1), save_s=12.5), _ck(2)], NOW)
    assert [c.info.save_s for c in cs.checkpoints("r1")] == [12.5, None]
    cs.record_listing("r1", [replace(_ck(1), save_s=12.5), replace(_ck(2), save_s=3.0)], NOW)
    assert [c.info.save_s for c in cs.checkpoints("r1")] == [12.5, 3.0]


def test_unknown_checkpoint_is_not_found(store: SqlStore) -> None:
    store.create_run("r2", "r2", "spec", NOW)
    with pytest.raises(NotFoundError):
        store.checkpoints.record_verification("r2", "/nope", True, NOW)
