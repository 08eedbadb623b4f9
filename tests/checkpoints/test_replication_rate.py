"""The bandwidth limit holds on real transfers: GiBs to a local path, a real sshd and moto's S3 server.

Each target gets a checkpoint of real bytes (random 1 MiB blocks, each made unique
by a counter: no holes, nothing a file system or a cipher could skip) under a
limit below what the target reaches on this 2-core machine even when it is
loaded, and the end-to-end rate (copy + verification + record, over the bytes
sent) must land within 10% of the limit. Sizes give each copy ~20-30 s: 4 GiB
at 200 MiB/s to the file system, 1.28 GiB at 50 MiB/s over SSH; moto's S3 server
(pure Python) takes 17-30 MiB/s here, so S3 gets 256 MiB at 10 MiB/s. The local
copies share their bytes by hard links, so the source costs 4 GiB of writes once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from ckpt_fixtures import SshServer, free_port, wait_port

from b300.checkpoints.layouts import load_layout
from b300.checkpoints.manifest import ensure_manifest
from b300.checkpoints.replicate import Throttle, load_target, replicate
from b300.interfaces import ReplicationTarget
from b300.model import CheckpointInfo

pytestmark = pytest.mark.slow
MIB = 1 << 20
NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)


def _write_real_bytes(path: Path, mib: int, seed: int) -> None:
    block = bytearray(os.urandom(MIB))
    with open(path, "wb") as fh:
        for i in range(mib):
            block[:16] = seed.to_bytes(8, "little") + i.to_bytes(8, "little")  # no two blocks alike
            fh.write(block)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Three checkpoints (4 GiB, 1.28 GiB, 256 MiB), the smaller two mostly hard links into the first."""
    root = tmp_path_factory.mktemp("rate-src")
    big = root / "step_1"
    (big / "shards").mkdir(parents=True)
    for i in range(3):
        _write_real_bytes(big / f"__{i}_0.distcp", 1280, i)
    for i in range(64):
        _write_real_bytes(big / "shards" / f"__{i}_1.distcp", 4, 100 + i)
    (big / "DONE").write_bytes(b"")
    for step, files in ((2, ["__0_0.distcp"]), (3, [])):
        d = root / f"step_{step}"
        (d / "shards").mkdir(parents=True)
        for f in files:
            os.link(big / f, d / f)
        for i in range(8):
            os.link(big / "shards" / f"__{i}_1.distcp", d / "shards" / f"__{i}_1.distcp")
        (d / "DONE").write_bytes(b"")
    _write_real_bytes(root / "step_3" / "__0_0.distcp", 224, 7)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _checkpoint(root: Path, step: int) -> tuple[CheckpointInfo, object]:
    (ck,) = [c for c in load_layout("generic").list_checkpoints(str(root)) if c.step == step]
    return ck, ensure_manifest(ck.path, NOW)


def _rate(ck: CheckpointInfo, manifest: object, target: ReplicationTarget, limit: float) -> float:
    started = time.monotonic()
    result = replicate(ck, manifest, target, concurrency=4, throttle=Throttle(limit))  # type: ignore[arg-type]
    elapsed = time.monotonic() - started
    assert result.ok, result.problems
    assert result.bytes_sent == sum(e.size for e in manifest.files)  # type: ignore[attr-defined]
    rate = result.bytes_sent / elapsed
    print(f"{target.name}: {result.bytes_sent / MIB:.0f} MiB in {elapsed:.1f} s = {rate / MIB:.1f} MiB/s "
          f"(limit {limit / MIB:.0f} MiB/s, load {os.getloadavg()[0]:.1f})")
    return rate / limit


@pytest.fixture
def moto_process() -> Iterator[str]:
    """moto's S3 server in a process of its own (in this one it would share our GIL)."""
    pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    port = free_port(5155)
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port, proc, "moto", timeout=30)
        url = f"http://127.0.0.1:{port}"
        client = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                              aws_access_key_id="test", aws_secret_access_key="test")  # noqa: S106 - moto
        client.create_bucket(Bucket="rate")
        client.close()
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def test_filesystem_copy_of_4_gib_holds_200_mib_s(source: Path, tmp_path: Path) -> None:
    ck, manifest = _checkpoint(source, 1)
    out = tmp_path / "offsite"
    target = load_target("filesystem", {"path": str(out)})
    try:
        assert 0.9 <= _rate(ck, manifest, target, 200 * MIB) <= 1.1
    finally:
        target.close()
        shutil.rmtree(out, ignore_errors=True)


def test_sftp_copy_of_1_3_gib_holds_50_mib_s(source: Path, sshd: SshServer) -> None:
    ck, manifest = _checkpoint(source, 2)
    remote = sshd.base / "rate"
    target = load_target("sftp", {"host": "127.0.0.1", "port": sshd.port, "username": sshd.username,
                                  "key_filename": sshd.key_filename, "known_hosts": sshd.known_hosts,
                                  "path": str(remote)})
    try:
        assert 0.9 <= _rate(ck, manifest, target, 50 * MIB) <= 1.1
    finally:
        target.close()
        shutil.rmtree(remote, ignore_errors=True)


def test_s3_copy_of_256_mib_holds_10_mib_s(source: Path, moto_process: str) -> None:
    ck, manifest = _checkpoint(source, 3)
    target = load_target("s3", {"bucket": "rate", "endpoint_url": moto_process, "region_name": "us-east-1",
                                "aws_access_key_id": "test", "aws_secret_access_key": "test",
                                "part_size": 8 * MIB, "max_concurrency": 4})
    try:
        assert 0.9 <= _rate(ck, manifest, target, 10 * MIB) <= 1.1
    finally:
        target.close()
