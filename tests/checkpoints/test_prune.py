"""Pruning real directories and a real replica target: dry run, anchor re-verified, never outside the root."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from ckpt_fixtures import generic

from b300.checkpoints.layouts import load_layout
from b300.checkpoints.manifest import ensure_manifest, verify
from b300.checkpoints.prune import plan_remote_prune, prune_local, prune_remote
from b300.checkpoints.replicate import load_target, replicate
from b300.checkpoints.retention import CheckpointState, RetentionPolicy, plan_prune

NOW = datetime(2026, 11, 29, 12, tzinfo=UTC)


def _states(root: Path) -> list[CheckpointState]:
    cks = load_layout("generic").list_checkpoints(str(root))
    return [CheckpointState(c, verified=c.complete and verify(c.path).ok) for c in cks]


def _history(root: Path, steps: range) -> None:
    for s in steps:
        d = generic(root, s, t=1_700_000_000.0 + s * 3600)
        ensure_manifest(str(d), NOW)


def test_dry_run_lists_and_keeps_everything(tmp_path: Path) -> None:
    _history(tmp_path, range(1, 6))
    plan = plan_prune(_states(tmp_path), RetentionPolicy(keep_last=2), NOW)
    result = prune_local(plan, str(tmp_path), dry_run=True, verify=lambda p: verify(p).ok)
    assert result.dry_run and [os.path.basename(p) for p in result.deleted] == ["step_1", "step_2", "step_3"]
    assert len(list(tmp_path.iterdir())) == 5


def test_prune_deletes_only_after_the_anchor_verifies(tmp_path: Path) -> None:
    _history(tmp_path, range(1, 6))
    plan = plan_prune(_states(tmp_path), RetentionPolicy(keep_last=2), NOW)
    (tmp_path / "step_5" / "model.pt").write_bytes(b"corrupted since the plan")
    refused = prune_local(plan, str(tmp_path), dry_run=False, verify=lambda p: verify(p).ok)
    assert refused.deleted == () and "does not verify" in refused.refused
    assert len(list(tmp_path.iterdir())) == 5
    # Re-planned, step_5 no longer verifies: step_4 is the anchor and 1..3 go.
    plan = plan_prune(_states(tmp_path), RetentionPolicy(keep_last=2), NOW)
    done = prune_local(plan, str(tmp_path), dry_run=False, verify=lambda p: verify(p).ok)
    assert sorted(os.path.basename(p) for p in done.deleted) == ["step_1", "step_2", "step_3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_4", "step_5"]


def test_a_symlinked_checkpoint_loses_only_its_link(tmp_path: Path) -> None:
    root, elsewhere = tmp_path / "root", tmp_path / "root" / "archive"
    _history(root, range(2, 5))
    generic(elsewhere, 1)
    os.symlink(elsewhere / "step_1", root / "step_1")
    plan = plan_prune(_states(root), RetentionPolicy(keep_last=1), NOW)
    prune_local(plan, str(root), dry_run=False, verify=lambda p: verify(p).ok)
    assert not (root / "step_1").exists() and (elsewhere / "step_1" / "model.pt").exists()


def test_remote_prune_follows_the_same_rules(tmp_path: Path) -> None:
    target = load_target("filesystem", {"path": str(tmp_path / "offsite")})
    _history(tmp_path / "src", range(1, 5))
    for c in load_layout("generic").list_checkpoints(str(tmp_path / "src")):
        assert replicate(c, ensure_manifest(c.path, NOW), target).ok
    plan = plan_remote_prune(target, RetentionPolicy(keep_last=2), NOW, pending_resume={"step_1"})
    assert [c.path for c in plan.delete] == ["step_2"]
    assert prune_remote(target, plan, dry_run=True).deleted == ("step_2",)
    assert target.list_replicas() == ["step_1", "step_2", "step_3", "step_4"]
    assert prune_remote(target, plan, dry_run=False).deleted == ("step_2",)
    assert target.list_replicas() == ["step_1", "step_3", "step_4"]


def test_deleting_outside_the_root_is_refused(tmp_path: Path) -> None:
    from b300.checkpoints.retention import PrunePlan
    from b300.model import CheckpointInfo

    outside = generic(tmp_path / "other", 1)
    _history(tmp_path / "root", range(1, 2))
    anchor = str(tmp_path / "root" / "step_1")
    plan = PrunePlan(keep={anchor: ("newest verified",)},
                     delete=(CheckpointInfo(str(outside), 1, NOW - timedelta(1), True),))
    with pytest.raises(ValueError, match="refusing"):
        prune_local(plan, str(tmp_path / "root"), dry_run=False, verify=lambda p: True)
    assert outside.exists()
