"""A prune asked of the daemon (``b300ctl checkpoints RUN --prune --yes``, control op
``checkpoints_prune``): CheckpointUpkeep.prune_request on real files, a real store and a
real filesystem target, with the same re-checks as the upkeep pass and the asker as actor.
The request through a running b300d is in tests/ops/test_ctl_live.py."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from ckpt_fixtures import generic

from b300.checkpoints.layouts import load_layout
from b300.checkpoints.manifest import ensure_manifest
from b300.checkpoints.policy import CheckpointsConfig, TargetConfig
from b300.checkpoints.prune import TRASH_PREFIX
from b300.checkpoints.retention import RetentionPolicy
from b300.checkpoints.upkeep import CheckpointUpkeep
from b300.errors import NotFoundError, UsageError
from b300.plugin_registry import PluginRegistry
from b300.store import SqlStore, open_store

NOW = datetime.now(UTC)
RUN = "pr-1"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    with open_store(f"sqlite:///{tmp_path / 'state.db'}") as s:
        yield s  # type: ignore[misc]


def _run(store: SqlStore, ckpt: Path, steps: list[int]) -> None:
    for i, step in enumerate(steps):
        ensure_manifest(str(generic(ckpt, step, t=(NOW - timedelta(hours=len(steps) - i)).timestamp())), NOW)
    spec = (f'name = "pr"\n[job]\ncommand = "true"\nnodes = 1\ngpus_per_node = 0\n'
            f'[checkpoint]\ndir = {json.dumps(str(ckpt))}\nlayout = "generic"\ninterval = "1h"\n')
    store.create_run(RUN, "pr", spec, NOW)
    found = load_layout("generic").list_checkpoints(str(ckpt))
    store.checkpoints.record_listing(RUN, found, NOW)
    for c in found:
        store.checkpoints.record_verification(RUN, c.path, True, NOW)


def _upkeep(store: SqlStore, targets: tuple[TargetConfig, ...] = (), **kw: Any) -> CheckpointUpkeep:
    # prune = false, as by default: a person's request does not need it.
    cfg = CheckpointsConfig(prune=False, retention=RetentionPolicy(keep_last=4), targets=targets)
    return CheckpointUpkeep(store, store.checkpoints, cfg, lambda: datetime.now(UTC),
                            action_lock=threading.Lock(), plugins=PluginRegistry(), **kw)


def _steps(ckpt: Path) -> list[int]:
    return [c.step for c in load_layout("generic").list_checkpoints(str(ckpt))]


def _events(store: SqlStore) -> list[tuple[str, str]]:
    return [(e.kind, e.actor) for e in store.events(run_id=RUN) if e.kind.startswith("checkpoint.prune")]


def test_prunes_by_the_requested_rules_as_the_user(tmp_path: Path, store: SqlStore) -> None:
    ckpt = tmp_path / "ckpt"
    _run(store, ckpt, [10, 20, 30, 40, 50])
    half = ckpt / f"{TRASH_PREFIX}step_5"  # what an interrupted delete left: finished first
    half.mkdir()
    upkeep = _upkeep(store)
    answer = upkeep.prune_request(RUN, actor="alice", keep_last=2)
    assert sorted(Path(p).name for p in answer["deleted"]) == ["step_10", "step_20", "step_30"]
    assert sorted(Path(p).name for p in answer["kept"]) == ["step_40", "step_50"]
    assert answer["refused"] == "" and answer["unconfirmed"] == []
    assert _steps(ckpt) == [40, 50] and not half.exists()
    assert _events(store) == [("checkpoint.prune_started", "alice"), ("checkpoint.pruned", "alice")]
    rows = {c.info.step: c.deleted_at for c in store.checkpoints.checkpoints(RUN, include_deleted=True)}
    assert {s for s, gone in rows.items() if gone} == {10, 20, 30}

    # Without options: the configured rules (keep_last 4), which keep both; nothing happens.
    assert upkeep.prune_request(RUN, actor="alice")["deleted"] == []
    assert len(_events(store)) == 2


def test_a_replica_gone_from_its_target_is_kept_and_copied_again(tmp_path: Path, store: SqlStore) -> None:
    ckpt = tmp_path / "ckpt"
    _run(store, ckpt, [1, 2, 3])
    t = TargetConfig("nfs", "filesystem", (("path", str(tmp_path / "nfs" / "{run}")),))
    upkeep = _upkeep(store, (t,))
    upkeep.run_once()  # copies all three (prune is off: nothing deleted)
    assert _steps(ckpt) == [1, 2, 3]
    shutil.rmtree(tmp_path / "nfs" / RUN / "step_1")
    answer = upkeep.prune_request(RUN, actor="bob", keep_last=1)
    assert [Path(p).name for p in answer["deleted"]] == ["step_2"]
    assert [Path(p).name for p in answer["unconfirmed"]] == ["step_1"]
    assert _steps(ckpt) == [1, 3]
    assert {c.info.step: c.replicas["nfs"] for c in store.checkpoints.checkpoints(RUN)} == {1: False, 3: True}


def test_a_target_that_is_down_means_nothing_deleted(tmp_path: Path, store: SqlStore) -> None:
    ckpt = tmp_path / "ckpt"
    _run(store, ckpt, [1, 2, 3])
    t = TargetConfig("nfs", "filesystem", (("path", str(tmp_path / "nfs" / "{run}")),))
    _upkeep(store, (t,)).run_once()  # every checkpoint copied: the rules alone would delete two
    # The same target name, now a server that refuses connections.
    dead = TargetConfig("nfs", "sftp", (("host", "127.0.0.1"), ("port", 1), ("username", "x"),
                                        ("key_filename", "/nonexistent"), ("known_hosts", "/dev/null"),
                                        ("path", "/srv/{run}"), ("timeout", 2.0)))
    answer = _upkeep(store, (dead,)).prune_request(RUN, actor="carol", keep_last=1)
    assert answer["deleted"] == [] and "nfs unreachable" in answer["refused"]
    assert _steps(ckpt) == [1, 2, 3] and _events(store) == []


def test_a_pending_resume_and_the_newest_verified_are_kept(tmp_path: Path, store: SqlStore) -> None:
    ckpt = tmp_path / "ckpt"
    _run(store, ckpt, [1, 2, 3, 4])
    store.begin_attempt(RUN, NOW, resume_from=str(ckpt / "step_1"))
    store.checkpoints.record_verification(RUN, str(ckpt / "step_4"), False, NOW)
    answer = _upkeep(store).prune_request(RUN, actor="dave", keep_last=1)
    assert sorted(Path(p).name for p in answer["deleted"]) == ["step_2"]
    assert _steps(ckpt) == [1, 3, 4]


@pytest.mark.parametrize(("run_id", "options", "error", "match"), [
    ("nope", {}, NotFoundError, "nope"),
    (RUN, {"keep_last": 0}, UsageError, "--keep-last must be at least 1"),
    (RUN, {"keep_last": True}, UsageError, "--keep-last"),
    (RUN, {"keep_daily_for": "soon"}, UsageError, "--keep-daily-for"),
    (RUN, {"keep_hourly_for": 7}, UsageError, "--keep-hourly-for"),
])
def test_a_bad_request_is_refused_and_changes_nothing(tmp_path: Path, store: SqlStore, run_id: str,
                                                       options: dict[str, Any], error: type[Exception],
                                                       match: str) -> None:
    ckpt = tmp_path / "ckpt"
    _run(store, ckpt, [1, 2, 3])
    with pytest.raises(error, match=match):
        _upkeep(store).prune_request(run_id, actor="erin", **options)
    assert _steps(ckpt) == [1, 2, 3] and _events(store) == []


def test_a_run_without_a_checkpoint_dir_is_a_usage_error(store: SqlStore) -> None:
    store.create_run("bare", "bare", 'name = "bare"\n[job]\ncommand = "true"\nnodes = 1\n', NOW)
    with pytest.raises(UsageError, match="no checkpoint dir"):
        _upkeep(store).prune_request("bare", actor="frank")
