"""Offsite and back: a real library's checkpoint is replicated to each target (filesystem,
SFTP to a real sshd, S3 to moto's server), restored into a new folder, judged complete by
its layout there (new file times and all), and the library resumes from the restored copy.

Lightning is not here: its checkpoints are single ``.ckpt`` files, and manifests and
replication work on checkpoint folders (see the formats table in docs/design/checkpoints.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from ckpt_fixtures import S3Server, SshServer
from conftest import Written, run_lib

from b300.checkpoints.layouts import load_layout
from b300.checkpoints.manifest import ensure_manifest, verify
from b300.checkpoints.replicate import load_target, replicate, restore
from b300.interfaces import ReplicationTarget

NOW = datetime(2026, 12, 1, 12, tzinfo=UTC)
TARGETS = ("filesystem", "sftp", "s3")


@pytest.fixture
def targets(request: pytest.FixtureRequest, tmp_path: Path, sshd: SshServer,
            s3_server: S3Server) -> Iterator[dict[str, ReplicationTarget]]:
    name = request.node.name.replace("[", "_").replace("]", "")
    made = {
        "filesystem": load_target("filesystem", {"path": str(tmp_path / "offsite")}),
        "sftp": load_target("sftp", {"host": "127.0.0.1", "port": sshd.port, "username": sshd.username,
                                     "key_filename": sshd.key_filename, "known_hosts": sshd.known_hosts,
                                     "path": str(sshd.base / name)}),
        "s3": load_target("s3", {"bucket": s3_server.bucket, "prefix": f"{name}/",
                                 "endpoint_url": s3_server.endpoint_url, "region_name": "us-east-1",
                                 "aws_access_key_id": "test", "aws_secret_access_key": "test",
                                 "part_size": 5 << 20, "max_concurrency": 1}),
    }
    yield made
    for t in made.values():
        t.close()


@pytest.mark.parametrize(("kind", "layout", "name"), [
    ("dcp", "dcp", "step_20"),
    ("mcore", "megatron", "iter_0000020"),
    ("megatron-legacy", "megatron", "iter_0000020"),
    ("deepspeed", "deepspeed", "global_step2"),
    ("hf", "hf", "checkpoint-2"),
])
def test_replicate_restore_and_the_library_resumes(written: Written, targets: dict[str, ReplicationTarget],
                                                   tmp_path: Path, kind: str, layout: str, name: str) -> None:
    src_root = tmp_path / "src"
    written.copy(kind, name, src_root)
    if kind == "megatron-legacy":
        (src_root / "latest_checkpointed_iteration.txt").write_text("20")
    (ckpt,) = [c for c in load_layout(layout).list_checkpoints(str(src_root)) if c.path.endswith(name)]
    assert ckpt.complete, ckpt.why_incomplete
    manifest = ensure_manifest(ckpt.path, NOW)
    restored = []
    for kind_name, target in targets.items():
        result = replicate(ckpt, manifest, target, concurrency=2)
        assert result.ok, (kind_name, result.problems)
        dest_root = tmp_path / "restored" / kind_name
        back = restore(name, target, str(dest_root))
        assert back.files == len(manifest.files)
        assert verify(back.path).ok
        (listed,) = load_layout(layout).list_checkpoints(str(dest_root))
        assert listed.complete, (kind_name, listed.why_incomplete)
        restored.append(Path(back.path))
    loaded = run_lib("load", kind, tmp_path / "restored", restored)
    assert loaded == {str(p): "" for p in restored}
