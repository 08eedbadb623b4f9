"""Replication to a local path, a real sshd over SFTP and moto's S3 server: copy, resume, verify, prune."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from ckpt_fixtures import S3Server, SshServer, write_file

from b300.checkpoints.layouts import load_layout
from b300.checkpoints.manifest import Manifest, ensure_manifest
from b300.checkpoints.replicate import (
    Throttle,
    load_target,
    replica_records,
    replicate,
    verify_replica,
)
from b300.errors import UsageError
from b300.interfaces import ReplicationTarget
from b300.model import CheckpointInfo

NOW = datetime(2026, 11, 29, 12, tzinfo=UTC)


def _checkpoint(root: Path, step: int, big: int = 3 << 20) -> tuple[CheckpointInfo, Manifest]:
    d = root / f"step_{step}"
    write_file(d / "big.bin", os.urandom(big))
    for i in range(5):
        write_file(d / "shards" / f"__{i}_0.distcp", os.urandom(1000 + i))
    write_file(d / "odd name $(x) ;'.pt", b"odd")
    write_file(d / "DONE", b"")
    (ck,) = [c for c in load_layout("generic").list_checkpoints(str(root)) if c.step == step]
    return ck, ensure_manifest(ck.path, NOW)


@pytest.fixture(params=["filesystem", "sftp", "s3"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ReplicationTarget]:
    kind = request.param
    if kind == "filesystem":
        t = load_target("filesystem", {"path": str(tmp_path / "offsite")})
    elif kind == "sftp":
        ssh: SshServer = request.getfixturevalue("sshd")
        remote = ssh.base / request.node.name.replace("[", "_").replace("]", "")
        t = load_target("sftp", {"host": "127.0.0.1", "port": ssh.port, "username": ssh.username,
                                 "key_filename": ssh.key_filename, "known_hosts": ssh.known_hosts,
                                 "path": str(remote)})
    else:
        s3: S3Server = request.getfixturevalue("s3_server")
        t = load_target("s3", {"bucket": s3.bucket, "prefix": f"{request.node.name}/",
                               "endpoint_url": s3.endpoint_url, "region_name": "us-east-1",
                               "aws_access_key_id": "test", "aws_secret_access_key": "test",
                               "part_size": 5 << 20, "max_concurrency": 1})
    yield t
    t.close()


def test_copy_is_verified_and_a_second_run_sends_nothing(tmp_path: Path, target: ReplicationTarget) -> None:
    ck, manifest = _checkpoint(tmp_path / "src", 100, big=11 << 20)  # 3 parts on S3
    result = replicate(ck, manifest, target, concurrency=3)
    assert result.ok and result.files_sent == 8 and result.bytes_sent >= 11 << 20
    assert verify_replica("step_100", target) == ()
    assert [r.step for r in replica_records(target)] == [100]
    again = replicate(ck, manifest, target)
    assert again.ok and again.bytes_sent == 0 and again.files_sent == 0


class _CutAfter:
    """The bandwidth limiter's hook, used to cut a transfer the way a dropped link would."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.seen = 0

    def __call__(self, n: int) -> None:
        self.seen += n
        if self.seen > self.limit:
            raise ConnectionResetError("link dropped")


def test_an_interrupted_copy_resumes_and_ends_verified(tmp_path: Path, target: ReplicationTarget) -> None:
    ck, manifest = _checkpoint(tmp_path / "src", 7, big=12 << 20)  # S3: 3 parts of 5 MiB at most
    cut = Throttle(None)
    cut.consume = _CutAfter(7 << 20)  # type: ignore[method-assign]
    with pytest.raises(ConnectionResetError):
        replicate(ck, manifest, target, concurrency=1, throttle=cut)
    assert target.list_replicas() == []  # no record: not a replica yet
    resumed = replicate(ck, manifest, target, concurrency=2)
    assert resumed.ok
    # File targets continue the partial file, S3 the open multipart upload's parts.
    assert resumed.bytes_sent < manifest.size_bytes
    assert verify_replica("step_7", target) == ()


def test_a_corrupted_replica_fails_verification_and_is_repaired(tmp_path: Path) -> None:
    t = load_target("filesystem", {"path": str(tmp_path / "offsite")})
    ck, manifest = _checkpoint(tmp_path / "src", 3)
    assert replicate(ck, manifest, t).ok
    victim = tmp_path / "offsite" / "step_3" / "big.bin"
    data = bytearray(victim.read_bytes())
    data[5] ^= 1
    victim.write_bytes(bytes(data))
    assert verify_replica("step_3", t) == ("'big.bin' differs on filesystem",)
    t.delete_record("step_3")  # what the daemon does when a replica fails verification
    assert replicate(ck, manifest, t).ok
    assert verify_replica("step_3", t) == ()


def test_unknown_host_key_is_refused(tmp_path: Path, sshd: SshServer) -> None:
    other = tmp_path / "known_hosts"
    other.write_text(f"[127.0.0.1]:{sshd.port} ssh-ed25519 "
                     "AAAAC3NzaC1lZDI1NTE5AAAAIGxkZXZpY2UtdGVzdC1rZXktbm90LXRoZS1ob3N0LWtleQ==\n")
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    for known in (other, empty):  # OpenSSH's own refusal, one line, at construction
        with pytest.raises(ConnectionError, match="Host key verification failed"):
            load_target("sftp", {"host": "127.0.0.1", "port": sshd.port, "username": sshd.username,
                                 "key_filename": sshd.key_filename, "known_hosts": str(known),
                                 "path": str(sshd.base / "never")})


def test_bandwidth_limit_paces_the_sender() -> None:
    clock = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        clock[0] += s

    throttle = Throttle(1000.0, clock=lambda: clock[0], sleep=sleep)
    for _ in range(10):
        throttle.consume(500)
    # 5000 bytes at 1000 B/s with a 1000-byte burst: 4 s of waiting.
    assert sum(slept) == pytest.approx(4.0)


def test_remote_prune_deletes_the_replica(tmp_path: Path, target: ReplicationTarget) -> None:
    ck, manifest = _checkpoint(tmp_path / "src", 1, big=1000)
    assert replicate(ck, manifest, target).ok
    target.delete_replica("step_1")
    assert target.list_replicas() == []
    assert target.stat_files("step_1") == {}


def test_unknown_target_kind_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        load_target("carrier-pigeon", {})
    with pytest.raises(UsageError):
        load_target("filesystem", {"nope": 1})



@pytest.mark.parametrize("remote_hash", [True, False])
def test_sftp_verifies_on_the_server_or_by_reading_back(
    tmp_path: Path, sshd: SshServer, remote_hash: bool
) -> None:
    remote = sshd.base / f"hash-{remote_hash}"
    t = load_target("sftp", {"host": "127.0.0.1", "port": sshd.port, "username": sshd.username,
                             "key_filename": sshd.key_filename, "known_hosts": sshd.known_hosts,
                             "path": str(remote), "remote_hash": remote_hash})
    try:
        ck, manifest = _checkpoint(tmp_path / "src", 5, big=1 << 20)
        assert replicate(ck, manifest, t).ok
        hashed = t.sha256_files("step_5", [e.rel for e in manifest.files])  # type: ignore[attr-defined]
        if remote_hash:  # every name, shell metacharacters included, hashed where it is stored
            assert hashed == {e.rel: e.sha256 for e in manifest.files}
        else:
            assert hashed == {}
        victim = remote / "step_5" / "odd name $(x) ;'.pt"
        victim.write_bytes(b"ODD")
        assert verify_replica("step_5", t) == ("\"odd name $(x) ;'.pt\" differs on sftp",)
    finally:
        t.close()


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def test_sftp_server_that_stops_answering_times_out(tmp_path: Path, sshd: SshServer) -> None:
    """The server's session process is frozen (SIGSTOP) mid-use: the target raises after
    its timeout instead of hanging the daemon's upkeep; a new connection works again."""
    import signal

    opts = {"host": "127.0.0.1", "port": sshd.port, "username": sshd.username,
            "key_filename": sshd.key_filename, "known_hosts": sshd.known_hosts,
            "path": str(sshd.base / "frozen"), "timeout": 2.0}
    listener = int((Path(sshd.key_filename).parent / "sshd.pid").read_text())
    before = set(_descendants(listener))
    t = load_target("sftp", opts)
    try:
        assert t.stat_files("step_1") == {}
        frozen = [p for p in _descendants(listener) if p not in before]
        assert frozen, "no sshd session process found"
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises((TimeoutError, OSError, EOFError)):
                t.stat_files("step_1")
            assert time.monotonic() - started < 30
        finally:
            for pid in frozen:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
    finally:
        with contextlib.suppress(Exception):
            t.close()
    again = load_target("sftp", opts)
    try:
        assert again.stat_files("step_1") == {}
    finally:
        again.close()


def test_filesystem_target_hashes_what_it_wrote_while_copying(tmp_path: Path) -> None:
    ck, manifest = _checkpoint(tmp_path / "src", 11, big=9 << 20)  # several copy blocks
    want = {e.rel: e.sha256 for e in manifest.files}
    t = load_target("filesystem", {"path": str(tmp_path / "offsite")})
    size = 9 << 20
    assert t.put_file(f"{ck.path}/big.bin", "step_11", "big.bin", size, 0, lambda n: None) == size
    assert t.sent_sha256("step_11", ["big.bin"]) == {"big.bin": want["big.bin"]}  # type: ignore[attr-defined]
    assert t.sent_sha256("step_11", ["big.bin"]) == {}  # type: ignore[attr-defined]  # taken once
    # A partial copy is continued; the digest still covers the whole file.
    part = tmp_path / "offsite" / "step_11" / "big.bin.b300part"
    part.write_bytes((Path(ck.path) / "big.bin").read_bytes()[: (5 << 20) + 1])
    assert t.put_file(f"{ck.path}/big.bin", "step_11", "big.bin", size, (5 << 20) + 1,
                      lambda n: None) == size - (5 << 20) - 1
    assert t.sent_sha256("step_11", ["big.bin"]) == {"big.bin": want["big.bin"]}  # type: ignore[attr-defined]
    # A file changed after its copy is not vouched for (it gets read back instead).
    t.put_file(f"{ck.path}/big.bin", "step_11", "big.bin", size, 0, lambda n: None)
    copy = tmp_path / "offsite" / "step_11" / "big.bin"
    copy.write_bytes(b"\0" * size)
    assert t.sent_sha256("step_11", ["big.bin"]) == {}  # type: ignore[attr-defined]


def test_files_a_crashed_process_copied_are_read_back_not_trusted(tmp_path: Path) -> None:
    ck, manifest = _checkpoint(tmp_path / "src", 12)
    first = load_target("filesystem", {"path": str(tmp_path / "offsite")})
    for e in manifest.files:  # an earlier process copied everything, then died before verifying
        first.put_file(f"{ck.path}/{e.rel}", "step_12", e.rel, e.size, 0, lambda n: None)
    shard = tmp_path / "offsite" / "step_12" / "shards" / "__2_0.distcp"
    shard.write_bytes(b"\0" * shard.stat().st_size)  # torn by the crash: right size, wrong bytes
    after = load_target("filesystem", {"path": str(tmp_path / "offsite")})
    result = replicate(ck, manifest, after)
    assert result.ok and result.files_sent == 0 and result.bytes_sent == shard.stat().st_size
    assert verify_replica("step_12", after) == ()


def _no_read_back(target: ReplicationTarget) -> list[str]:
    """Record every read_file call (a copy verified by the server's digests makes none)."""
    calls: list[str] = []
    original = target.read_file

    def read_file(replica: str, rel: str) -> Iterator[bytes]:
        calls.append(rel)
        return original(replica, rel)

    target.read_file = read_file  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize("remote_hash", [True, False])
def test_sftp_copies_are_verified_by_digests_the_server_took_as_each_landed(
    tmp_path: Path, sshd: SshServer, remote_hash: bool
) -> None:
    t = load_target("sftp", {"host": "127.0.0.1", "port": sshd.port, "username": sshd.username,
                             "key_filename": sshd.key_filename, "known_hosts": sshd.known_hosts,
                             "path": str(sshd.base / f"landed-{remote_hash}"), "remote_hash": remote_hash})
    try:
        ck, manifest = _checkpoint(tmp_path / "src", 21, big=6 << 20)
        reads = _no_read_back(t)
        assert replicate(ck, manifest, t, concurrency=3).ok
        # With a shell on the server nothing is read back; without one, everything is.
        assert sorted(reads) == ([] if remote_hash else sorted(e.rel for e in manifest.files))
    finally:
        t.close()


@pytest.mark.parametrize("verify", ["checksum", "read"])
def test_s3_copies_are_verified_by_the_checksum_the_server_reports(
    tmp_path: Path, s3_server: S3Server, verify: str
) -> None:
    t = load_target("s3", {"bucket": s3_server.bucket, "prefix": f"verify-{verify}/",
                           "endpoint_url": s3_server.endpoint_url, "region_name": "us-east-1",
                           "aws_access_key_id": "test", "aws_secret_access_key": "test",
                           "part_size": 5 << 20, "max_concurrency": 2, "verify": verify})
    try:
        ck, manifest = _checkpoint(tmp_path / "src", 22, big=11 << 20)  # 3 parts: a composite checksum
        reads = _no_read_back(t)
        assert replicate(ck, manifest, t, concurrency=2).ok
        assert sorted(reads) == ([] if verify == "checksum" else sorted(e.rel for e in manifest.files))
        assert verify_replica("step_22", t) == ()
    finally:
        t.close()


def test_bad_target_options_are_refused_in_one_line(sshd: SshServer, s3_server: S3Server) -> None:
    base = {"port": sshd.port, "username": sshd.username, "key_filename": sshd.key_filename,
            "known_hosts": sshd.known_hosts, "path": "/tmp/x"}
    with pytest.raises(ValueError, match="is not a host name"):
        load_target("sftp", {**base, "host": "-oProxyCommand=sh"})
    with pytest.raises(ValueError, match="is not a user name"):
        load_target("sftp", {**base, "host": "127.0.0.1", "username": "-l root"})
    with pytest.raises(ValueError, match="verify must be"):
        load_target("s3", {"bucket": s3_server.bucket, "endpoint_url": s3_server.endpoint_url,
                           "verify": "trust"})
