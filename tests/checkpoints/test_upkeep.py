"""The daemon's checkpoint upkeep on real files, a real store and real targets:
copy offsite (local path, SFTP to a real sshd, S3 to moto's server), then prune
both sides by the retention rules, never deleting what must stay."""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from ckpt_fixtures import S3Server, SshServer, generic

from b300.checkpoints.layouts import load_layout
from b300.checkpoints.manifest import ensure_manifest
from b300.checkpoints.policy import CheckpointsConfig, TargetConfig
from b300.checkpoints.prune import TRASH_PREFIX
from b300.checkpoints.replicate import load_target, replica_records, verify_replica
from b300.checkpoints.retention import RetentionPolicy
from b300.checkpoints.upkeep import CheckpointUpkeep
from b300.config.tables.checkpoints import parse_checkpoints_config
from b300.errors import ConfigError
from b300.interfaces import CheckpointRepository
from b300.plugin_registry import PluginRegistry
from b300.store import SqlStore, open_store

NOW = datetime.now(UTC)
RUN = "up-1"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    with open_store(f"sqlite:///{tmp_path / 'state.db'}") as s:
        yield s  # type: ignore[misc]


def _run(store: SqlStore, ckpt: Path, steps: list[int]) -> CheckpointRepository:
    """A run whose generic-layout checkpoints all have manifests (as the watch pass makes them)."""
    for i, step in enumerate(steps):
        d = generic(ckpt, step, t=(NOW - timedelta(hours=len(steps) - i)).timestamp())
        ensure_manifest(str(d), NOW)
    spec = (f'name = "up"\n[job]\ncommand = "true"\nnodes = 1\ngpus_per_node = 0\n'
            f'[checkpoint]\ndir = {json.dumps(str(ckpt))}\nlayout = "generic"\ninterval = "1h"\n')
    store.create_run(RUN, "up", spec, NOW)
    cs = store.checkpoints
    found = load_layout("generic").list_checkpoints(str(ckpt))
    cs.record_listing(RUN, found, NOW)
    for c in found:
        cs.record_verification(RUN, c.path, True, NOW)
    return cs


def _target_options(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, Any]:
    if kind == "filesystem":
        return {"path": str(tmp_path / "offsite" / "{run}")}
    if kind == "sftp":
        ssh: SshServer = request.getfixturevalue("sshd")
        return {"host": "127.0.0.1", "port": ssh.port, "username": ssh.username,
                "key_filename": ssh.key_filename, "known_hosts": ssh.known_hosts,
                "path": str(ssh.base / request.node.name.replace("[", "_").replace("]", "") / "{run}")}
    s3: S3Server = request.getfixturevalue("s3_server")
    return {"bucket": s3.bucket, "prefix": f"{request.node.name}/{{run}}/", "endpoint_url": s3.endpoint_url,
            "region_name": "us-east-1", "aws_access_key_id": "test", "aws_secret_access_key": "test"}


def _config(targets: list[TargetConfig], **kw: Any) -> CheckpointsConfig:
    base = CheckpointsConfig(prune=True, retention=RetentionPolicy(keep_last=2), targets=tuple(targets),
                             replicas_per_pass=100)
    return replace(base, **kw)


def _upkeep(store: SqlStore, cfg: CheckpointsConfig) -> CheckpointUpkeep:
    return CheckpointUpkeep(store, store.checkpoints, cfg, lambda: datetime.now(UTC),
                            action_lock=threading.Lock(), plugins=PluginRegistry())


def _steps(ckpt: Path) -> list[int]:
    return [c.step for c in load_layout("generic").list_checkpoints(str(ckpt))]


@pytest.mark.parametrize("kind", ["filesystem", "sftp", "s3"])
def test_replicates_then_prunes_both_sides(tmp_path: Path, store: SqlStore, kind: str,
                                           request: pytest.FixtureRequest) -> None:
    ckpt = tmp_path / "ckpt"
    cs = _run(store, ckpt, [10, 20, 30, 40, 50])
    t = TargetConfig("off", kind, tuple(_target_options(kind, tmp_path, request).items()))
    _upkeep(store, _config([t])).run_once()

    assert _steps(ckpt) == [40, 50]
    target = load_target(kind, t.options_for(RUN))
    try:
        assert [r.step for r in replica_records(target)] == [40, 50]
        for name in ("step_40", "step_50"):
            assert verify_replica(name, target) == ()
    finally:
        target.close()
    rows = {c.info.step: c for c in cs.checkpoints(RUN, include_deleted=True)}
    assert all(rows[s].replicas == {"off": True} for s in rows)
    assert {s for s in rows if rows[s].deleted_at} == {10, 20, 30}
    assert {s for s in rows if rows[s].replicas_pruned} == {10, 20, 30}
    kinds = [e.kind for e in store.events(run_id=RUN)]
    assert kinds.count("checkpoint.replicated") == 5
    assert kinds.index("checkpoint.prune_started") < kinds.index("checkpoint.pruned")
    assert "checkpoint.replica_pruned" in kinds

    # A second pass copies and deletes nothing more.
    before = len(store.events(run_id=RUN))
    _upkeep(store, _config([t])).run_once()
    assert _steps(ckpt) == [40, 50] and len(store.events(run_id=RUN)) == before

    # What an interrupted remote prune leaves (files, record already gone) is removed;
    # a directory that is no checkpoint of this run is left alone.
    some = tmp_path / "some.bin"
    some.write_bytes(b"x" * 100)
    target = load_target(kind, t.options_for(RUN))
    try:
        for replica in ("step_10", "notes"):
            target.put_file(str(some), replica, "model.pt", 100, 0, lambda n: None)
        _upkeep(store, _config([t])).run_once()
        assert target.list_all() == ["notes", "step_40", "step_50"]  # type: ignore[attr-defined]
    finally:
        target.close()


def test_unreplicated_checkpoints_stay_until_copied(tmp_path: Path, store: SqlStore) -> None:
    ckpt = tmp_path / "ckpt"
    _run(store, ckpt, [1, 2, 3, 4])
    t = TargetConfig("nfs", "filesystem", (("path", str(tmp_path / "nfs" / "{run}")),))
    upkeep = _upkeep(store, _config([t], replicas_per_pass=1, prune_remote=False))
    upkeep.run_once()  # copies only the newest (step 4): 1-3 are not copied, so stay
    assert _steps(ckpt) == [1, 2, 3, 4]
    upkeep.run_once()  # step 3
    assert _steps(ckpt) == [1, 2, 3, 4]
    upkeep.run_once()
    upkeep.run_once()  # 2 and 1 copied: now 1 and 2 may go (keep_last 2)
    assert _steps(ckpt) == [3, 4]
    assert sorted(os.listdir(tmp_path / "nfs" / RUN)) == ["step_1", "step_2", "step_3", "step_4"]


def test_replica_deleted_by_hand_is_copied_again_not_trusted(tmp_path: Path, store: SqlStore) -> None:
    ckpt = tmp_path / "ckpt"
    cs = _run(store, ckpt, [1, 2, 3])
    t = TargetConfig("nfs", "filesystem", (("path", str(tmp_path / "nfs" / "{run}")),))
    _upkeep(store, _config([t], prune=False, prune_remote=False)).run_once()
    assert all(c.replicas == {"nfs": True} for c in cs.checkpoints(RUN))
    shutil.rmtree(tmp_path / "nfs" / RUN / "step_1")

    _upkeep(store, _config([t], prune_remote=False)).run_once()
    assert _steps(ckpt) == [1, 2, 3]  # step_1's copy is gone: not deleted
    assert {c.info.step: c.replicas["nfs"] for c in cs.checkpoints(RUN)} == {1: False, 2: True, 3: True}
    _upkeep(store, _config([t], prune_remote=False)).run_once()  # copied again, then pruned
    assert _steps(ckpt) == [2, 3]
    assert (tmp_path / "nfs" / RUN / "step_1" / "model.pt").is_file()


def test_target_down_means_nothing_deleted_and_one_event(tmp_path: Path, store: SqlStore) -> None:
    ckpt = tmp_path / "ckpt"
    _run(store, ckpt, [1, 2, 3])
    dead = TargetConfig("sftp", "sftp", (("host", "127.0.0.1"), ("port", 1), ("username", "x"),
                                         ("key_filename", "/nonexistent"), ("known_hosts", "/dev/null"),
                                         ("path", "/srv/{run}"), ("timeout", 2.0)))
    upkeep = _upkeep(store, _config([dead]))
    upkeep.run_once()
    upkeep.run_once()
    assert _steps(ckpt) == [1, 2, 3]
    assert [e.kind for e in store.events(run_id=RUN)].count("checkpoint.target_unavailable") == 1


def test_pending_resume_and_newest_verified_survive(tmp_path: Path, store: SqlStore) -> None:
    ckpt = tmp_path / "ckpt"
    cs = _run(store, ckpt, [1, 2, 3, 4, 5])
    store.begin_attempt(RUN, NOW, resume_from=str(ckpt / "step_1"))
    # step_5 fails verification: the newest verified is step_4, and keep_last is 1.
    cs.record_verification(RUN, str(ckpt / "step_5"), False, NOW)
    t = TargetConfig("nfs", "filesystem", (("path", str(tmp_path / "nfs" / "{run}")),))
    _upkeep(store, _config([t], retention=RetentionPolicy(keep_last=1))).run_once()
    assert _steps(ckpt) == [1, 4, 5]
    assert [r.step for r in replica_records(load_target("filesystem", t.options_for(RUN)))] == [1, 4]


def test_a_delete_cut_off_by_a_crash_is_finished(tmp_path: Path, store: SqlStore) -> None:
    ckpt = tmp_path / "ckpt"
    _run(store, ckpt, [1, 2])
    half = ckpt / f"{TRASH_PREFIX}step_0"
    (half / "opt").mkdir(parents=True)
    (half / "opt" / "state.pt").write_bytes(b"left")
    assert _steps(ckpt) == [1, 2]  # never listed as a checkpoint
    _upkeep(store, _config([], prune=False)).run_once()
    assert not half.exists()


def test_local_corruption_is_not_copied_and_marks_the_checkpoint(tmp_path: Path, store: SqlStore) -> None:
    ckpt = tmp_path / "ckpt"
    cs = _run(store, ckpt, [1, 2])
    model = ckpt / "step_2" / "model.pt"
    data = bytearray(model.read_bytes())
    data[0] ^= 0xFF
    st = model.stat()
    model.write_bytes(bytes(data))
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size and time: only the bytes differ
    t = TargetConfig("nfs", "filesystem", (("path", str(tmp_path / "nfs" / "{run}")),))
    _upkeep(store, _config([t], prune=False)).run_once()
    rows = {c.info.step: c for c in cs.checkpoints(RUN)}
    assert rows[2].verified is False and rows[2].replicas == {"nfs": False}
    assert rows[1].replicas == {"nfs": True}
    assert "checkpoint.corrupt" in [e.kind for e in store.events(run_id=RUN)]


# -- config ------------------------------------------------------------------


def test_config_targets_and_secrets(tmp_path: Path) -> None:
    secret = tmp_path / "s3.key"
    secret.write_text("s3cr3t\n")
    secret.chmod(0o600)
    cfg = parse_checkpoints_config({
        "prune": True, "keep_last": 5, "keep_hourly_for": "0", "bandwidth_limit": "1.5GiB/s",
        "targets": [{"name": "s3-b", "kind": "s3", "bucket": "ck", "prefix": "runs/{run}/",
                     "aws_secret_access_key_file": str(secret)}]}, "b300.toml")
    assert cfg.prune and cfg.retention.keep_last == 5 and cfg.retention.hourly_for == timedelta(0)
    assert cfg.bandwidth_limit == 1.5 * (1 << 30)
    opts = cfg.targets[0].options_for("run-7")
    assert opts == {"bucket": "ck", "prefix": "runs/run-7/", "aws_secret_access_key": "s3cr3t", "name": "s3-b"}
    secret.chmod(0o644)
    with pytest.raises(ConfigError, match="readable or writable by others"):
        cfg.targets[0].options_for("run-7")


@pytest.mark.parametrize(("table", "error"), [
    ({"targets": [{"name": "a", "kind": "filesystem", "path": "/mnt/x"}]}, "must contain {run}"),
    ({"targets": [{"name": "a", "kind": "s3", "bucket": "b", "prefix": "{run}/",
                   "aws_secret_access_key": "k"}]}, "must not be written in the config"),
    ({"targets": [{"kind": "filesystem", "path": "/x/{run}"}]}, r"targets\[0\]\.name is missing"),
    ({"targets": [{"name": "a", "path": "/x/{run}"}]},
     r"targets\[0\]\.kind is missing \(a b300.replication_targets"),
    ({"targets": [{"name": "a", "kind": "filesystem", "path": "/x/{run}"},
                  {"name": "a", "kind": "filesystem", "path": "/y/{run}"}]}, "two targets are named 'a'"),
    ({"targets": {"name": "a"}}, "array of tables"),
    ({"bandwidth_limit": "fast"}, "bandwidth_limit must be a rate"),
    ({"keep_last": 0}, "keep_last must be >= 1"),
    ({"prune": "yes"}, "prune must be true or false"),
    ({"keep_hourly_for": False}, "keep_hourly_for must be a duration"),  # not "off": False == 0
    ({"bandwidth_limit": False}, "bandwidth_limit must be a rate"),     # not "unlimited"
    # The old daemon-wide signal killed jobs that did not trap it: refused, saying where it went.
    ({"signal": "USR1"}, r'signal has moved to the job spec: .*\[checkpoint\] signal = "USR1"'),
    ({"signal": ""}, "signal has moved to the job spec"),
    ({"allow_signals": "no"}, "allow_signals must be true or false"),
    ({"signal_grace": "soon"}, "signal_grace must be a duration"),
    ({"targets": [{"name": "a", "kind": "filesystem", "path": "/x/{run}", "Bad-Key": 1}]},
     "not a valid option"),
])
def test_config_errors_are_one_line(table: dict[str, Any], error: str) -> None:
    with pytest.raises(ConfigError, match=error) as info:
        parse_checkpoints_config(table, "b300.toml")
    assert "\n" not in str(info.value) and str(info.value).startswith("b300.toml: [checkpoints] ")


def test_watch_pass_fingerprints_an_ended_run_and_verifies_unjudged_manifests(
        tmp_path: Path, store: SqlStore) -> None:
    """A run that ended still gets manifests (its last checkpoints must be copied); a
    checkpoint whose manifest exists but whose verdict the store lacks (the daemon
    stopped between the two) is verified against it, and a changed one fails."""
    from b300.checkpoints.checkpoint_pass import CheckpointPass
    from b300.model import RunState
    from b300.slurm.cli import CliSlurmClient

    ckpt = tmp_path / "ckpt"
    for step in (1, 2, 3):
        generic(ckpt, step, t=(NOW - timedelta(hours=4 - step)).timestamp())
    ensure_manifest(str(ckpt / "step_1"), NOW)
    ensure_manifest(str(ckpt / "step_2"), NOW)
    (ckpt / "step_2" / "model.pt").write_bytes(os.urandom(512))  # same size, other bytes
    os.utime(ckpt / "step_2" / "model.pt", (NOW.timestamp() - 7200,) * 2)
    spec = (f'name = "up"\n[job]\ncommand = "true"\nnodes = 1\ngpus_per_node = 0\n'
            f'[checkpoint]\ndir = {json.dumps(str(ckpt))}\nlayout = "generic"\ninterval = "1h"\n')
    store.create_run(RUN, "up", spec, NOW)
    store.set_run_state(RUN, RunState.COMPLETED, datetime.now(UTC))
    cs = store.checkpoints
    # No Slurm call happens: an ended run is not checked against its schedule.
    CheckpointPass(store, cs, CliSlurmClient(bin_dir=str(tmp_path / "none")), lambda: datetime.now(UTC),
                   plugins=PluginRegistry(), manifests_per_pass=10).run_once()
    verdicts = {c.info.step: c.verified for c in cs.checkpoints(RUN)}
    assert verdicts == {1: True, 2: False, 3: True}
    assert "checkpoint.corrupt" in [e.kind for e in store.events(run_id=RUN)]
