"""``b300ctl checkpoints restore`` of real torch.distributed.checkpoint checkpoints, copied
offsite by the daemon's replication to a local path, a real sshd and moto's S3 server;
torch's own ``dcp.load`` is the judge of what came back."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import Written, run_lib
from restore_fixtures import RUN, ctl, leftovers, replicated_run, target_options, write_config

from b300.checkpoints.manifest import verify


def _dcp_run(tmp_path: Path, written: Written, targets: dict[str, tuple[str, dict[str, object]]],
             copies: dict[str, list[int]]) -> tuple[Path, Path]:
    root = tmp_path / "ckpt"
    for name in ("step_10", "step_20"):
        written.copy("dcp", name, root)
    cfg = write_config(tmp_path, targets)
    replicated_run(tmp_path, root, "dcp", cfg, copies)
    return cfg, root


@pytest.mark.parametrize("kind", ["filesystem", "sftp", "s3"])
def test_restore_from_each_kind_of_target_loads_in_torch(
        kind: str, tmp_path: Path, written: Written, request: pytest.FixtureRequest) -> None:
    sshd = request.getfixturevalue("sshd") if kind == "sftp" else None
    s3 = request.getfixturevalue("s3_server") if kind == "s3" else None
    options = target_options(kind, tmp_path, sshd=sshd, s3=s3)
    cfg, root = _dcp_run(tmp_path, written, {"offsite": (kind, options)}, {"offsite": [10, 20]})
    shutil.rmtree(root)  # the local checkpoints are lost: only the offsite copies remain
    out = tmp_path / "restored"
    newest = ctl(cfg, "--json", "checkpoints", "restore", RUN, "--to", str(out / "step_20"), "--verbose")
    assert newest.returncode == 0, newest.stderr
    report = json.loads(newest.stdout)
    chosen = (report["run"], report["target"], report["step"], report["replica"])
    assert chosen == (RUN, "offsite", 20, "step_20")
    names = sorted(f["path"] for f in report["file_list"])
    assert names == [".metadata", "__0_0.distcp", "__1_0.distcp"] and report["files"] == 3
    assert report["bytes"] == sum(f["size_bytes"] for f in report["file_list"]) > 0
    assert report["verified"] is True and report["seconds"] > 0
    older = ctl(cfg, "checkpoints", "restore", RUN, "--step", "10", "--target", "offsite", "--to",
                str(out / "step_10"))
    assert older.returncode == 0, older.stderr
    assert older.stdout.startswith(f"restored run {RUN} step 10 (step_10) from offsite into {out / 'step_10'}: "
                                   "3 files, ") and "MB/s" in older.stdout, older.stdout
    assert leftovers(out) == []
    for step in (10, 20):
        assert verify(str(out / f"step_{step}")).ok  # the manifest came back with the files
    assert run_lib("load", "dcp", out, [out / "step_20", out / "step_10"]) == {
        str(out / "step_20"): "", str(out / "step_10"): ""}


def test_a_corrupted_byte_on_the_target_is_refused_and_dir_untouched(tmp_path: Path, written: Written) -> None:
    options = target_options("filesystem", tmp_path)
    cfg, _root = _dcp_run(tmp_path, written, {"lustre": ("filesystem", options)}, {"lustre": [10, 20]})
    victim = tmp_path / "offsite" / RUN / "step_20" / "__1_0.distcp"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x01  # same size: only the sha256 can tell
    victim.write_bytes(bytes(data))
    dest = tmp_path / "restore" / "here"
    dest.mkdir(parents=True)
    proc = ctl(cfg, "checkpoints", "restore", RUN, "--to", str(dest))
    assert proc.returncode == 6, proc.stderr
    assert proc.stderr.count("\n") == 1 and "'__1_0.distcp' of step_20 on lustre does not match its sha256" \
        in proc.stderr, proc.stderr
    assert dest.is_dir() and list(dest.iterdir()) == [] and leftovers(dest.parent) == []
    # The intact older copy still restores.
    ok = ctl(cfg, "checkpoints", "restore", RUN, "--step", "10", "--to", str(dest))
    assert ok.returncode == 0, ok.stderr
    assert verify(str(dest)).ok

    victim.write_bytes(bytes(data[:-7]))  # shorter than recorded
    proc = ctl(cfg, "checkpoints", "restore", RUN, "--to", str(tmp_path / "short"))
    assert proc.returncode == 6 and "'__1_0.distcp' of step_20 on lustre" in proc.stderr, proc.stderr
    assert "bytes arrived, the manifest says" in proc.stderr and not (tmp_path / "short").exists()
    victim.unlink()
    proc = ctl(cfg, "checkpoints", "restore", RUN, "--to", str(tmp_path / "gone"))
    assert proc.returncode == 6 and "'__1_0.distcp' of step_20 on lustre is missing" in proc.stderr, proc.stderr
    assert leftovers(tmp_path) == []


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, written: Written) -> None:
    options = target_options("filesystem", tmp_path)
    cfg, _root = _dcp_run(tmp_path, written, {"lustre": ("filesystem", options)}, {"lustre": [20]})
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    cases = {
        ("--step", "10"): "step 10 of run ck-1 has no verified replica on any target (lustre)",
        ("--step", "99"): "run ck-1 has no checkpoint at step 99 (known steps, newest first: 20, 10)",
        ("--target", "tape"): "unknown target 'tape' (configured: lustre)",
        ("--to-full",): "is not empty",
    }
    for extra, message in cases.items():
        to = full if extra == ("--to-full",) else tmp_path / "out"
        argv = [a for a in extra if a != "--to-full"]
        proc = ctl(cfg, "checkpoints", "restore", RUN, *argv, "--to", str(to))
        assert proc.returncode == 2, (extra, proc.stderr)
        assert proc.stderr.count("\n") == 1 and message in proc.stderr, (extra, proc.stderr)
        assert not (tmp_path / "out").exists()
    assert (full / "keep.txt").read_text() == "mine" and leftovers(tmp_path) == []
    proc = ctl(cfg, "checkpoints", "restore", "nope", "--to", str(tmp_path / "out"))
    assert proc.returncode == 2 and proc.stderr == "b300ctl: unknown run 'nope'\n"
    proc = ctl(cfg, "checkpoints", "restore", RUN)
    assert proc.returncode == 2 and "required: --to" in proc.stderr


def test_unreadable_credentials_and_an_unreachable_target(tmp_path: Path, written: Written,
                                                        sshd: object) -> None:
    from ckpt_fixtures import SshServer, free_port

    assert isinstance(sshd, SshServer)
    s3_like = {"bucket": "b", "prefix": "{run}/", "endpoint_url": "http://127.0.0.1:9",
               "region_name": "us-east-1", "aws_access_key_id": "test",
               "aws_secret_access_key_file": str(tmp_path / "no-such-secret")}
    down = {**target_options("sftp", tmp_path, sshd=sshd), "port": free_port(sshd.port + 1), "timeout": 5}
    fs = target_options("filesystem", tmp_path)
    cfg, _root = _dcp_run(tmp_path, written, {"fs": ("filesystem", fs), "vault": ("s3", s3_like),
                                              "dr-site": ("sftp", down)}, {"fs": [10, 20]})
    from b300.store import open_store

    with open_store(f"sqlite:///{tmp_path / 'state.db'}") as store:  # copies made before the outage
        for c in store.checkpoints.checkpoints(RUN):
            for name in ("vault", "dr-site"):
                store.checkpoints.record_replica(RUN, c.info.path, name, True, c.info.mtime)
    proc = ctl(cfg, "checkpoints", "restore", RUN, "--target", "vault", "--to", str(tmp_path / "a"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "checkpoint target 'vault': aws_secret_access_key_file" in proc.stderr
    assert "no-such-secret" in proc.stderr
    proc = ctl(cfg, "checkpoints", "restore", RUN, "--target", "dr-site", "--to", str(tmp_path / "b"))
    assert proc.returncode == 6 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("b300ctl: target dr-site is unreachable: "), proc.stderr
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists() and leftovers(tmp_path) == []
    # The first configured target that holds a copy is the default; the others are never contacted.
    proc = ctl(cfg, "--json", "checkpoints", "restore", RUN, "--to", str(tmp_path / "c"))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["target"] == "fs" and os.path.isfile(tmp_path / "c" / ".metadata")


def test_a_megatron_legacy_checkpoint_restored_into_a_new_root_loads(tmp_path: Path, written: Written) -> None:
    """Megatron-LM loads a legacy checkpoint only through its root's tracker, which is not part of the
    iteration folder: restored as ROOT/iter_N into a new ROOT, the tracker is written naming it."""
    root = tmp_path / "ckpt"
    for name in ("iter_0000010", "iter_0000020"):
        written.copy("megatron-legacy", name, root)
    shutil.copy(written.root("megatron-legacy") / "latest_checkpointed_iteration.txt", root)
    cfg = write_config(tmp_path, {"lustre": ("filesystem", target_options("filesystem", tmp_path))})
    replicated_run(tmp_path, root, "megatron", cfg, {"lustre": [10, 20]})
    shutil.rmtree(root)
    fresh = tmp_path / "fresh"
    proc = ctl(cfg, "checkpoints", "restore", RUN, "--step", "10", "--to", str(fresh / "iter_0000010"))
    assert proc.returncode == 0, proc.stderr
    assert (fresh / "latest_checkpointed_iteration.txt").read_text() == "10"
    restored = fresh / "iter_0000010"
    assert run_lib("load", "megatron-legacy", fresh, [restored]) == {str(restored): ""}
    other = tmp_path / "elsewhere"  # a folder of another name: no tracker guessed for it
    assert ctl(cfg, "checkpoints", "restore", RUN, "--to", str(other / "latest")).returncode == 0
    assert not (other / "latest_checkpointed_iteration.txt").exists()
