"""A run whose checkpoints were copied offsite by the daemon's own replication, for the
``b300ctl checkpoints restore`` tests: a real store, a real config with real targets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ckpt_fixtures import S3Server, SshServer

from b300.checkpoints.layouts import load_layout
from b300.checkpoints.manifest import ensure_manifest
from b300.checkpoints.replicate import load_target, replicate
from b300.config import load_config
from b300.store import open_store

NOW = datetime.now(UTC)
RUN = "ck-1"


def target_options(kind: str, base: Path, *, sshd: SshServer | None = None,
                   s3: S3Server | None = None) -> dict[str, Any]:
    """``[[checkpoints.targets]]`` options of one kind, ``{run}`` in the path or prefix."""
    if kind == "filesystem":
        return {"path": str(base / "offsite" / "{run}")}
    if kind == "sftp":
        assert sshd is not None
        return {"host": "127.0.0.1", "port": sshd.port, "username": sshd.username,
                "key_filename": sshd.key_filename, "known_hosts": sshd.known_hosts,
                "path": str(sshd.base / base.name / "{run}")}
    assert kind == "s3" and s3 is not None
    secret = base / "s3-secret"
    secret.write_text("test\n")
    os.chmod(secret, 0o600)
    return {"bucket": s3.bucket, "prefix": f"{base.name}/{{run}}/", "endpoint_url": s3.endpoint_url,
            "region_name": "us-east-1", "aws_access_key_id": "test",
            "aws_secret_access_key_file": str(secret)}


def write_config(base: Path, targets: Mapping[str, tuple[str, Mapping[str, Any]]]) -> Path:
    """A b300.toml with the store under ``base`` and one ``[[checkpoints.targets]]`` per entry."""
    url = f"sqlite:///{base / 'state.db'}"
    lines = [f"[daemon]\nstate_dir = {json.dumps(str(base))}\ndatabase_url = {json.dumps(url)}\n"]
    for name, (kind, options) in targets.items():
        lines.append(f"[[checkpoints.targets]]\nname = {json.dumps(name)}\nkind = {json.dumps(kind)}\n")
        lines += [f"{k} = {json.dumps(v)}\n" for k, v in options.items()]
    cfg = base / "b300.toml"
    cfg.write_text("".join(lines))
    return cfg


def replicated_run(base: Path, ckpt_root: Path, layout: str, cfg: Path,
                   copies: Mapping[str, Sequence[int]]) -> None:
    """Record run ck-1 with the checkpoints under ``ckpt_root`` (manifests made, verified), and
    copy the steps in ``copies[target]`` to each target with the daemon's own replicate(),
    recording each copy in the store as the daemon's upkeep does."""
    spec = (f'name = "ck"\n[job]\ncommand = "true"\nnodes = 1\ngpus_per_node = 0\n'
            f'[checkpoint]\ndir = {json.dumps(str(ckpt_root))}\nlayout = "{layout}"\ninterval = "1h"\n')
    found = load_layout(layout).list_checkpoints(str(ckpt_root))
    assert found and all(c.complete for c in found), found
    manifests = {c.path: ensure_manifest(c.path, NOW) for c in found}
    targets = {t.name: t for t in load_config(str(cfg)).checkpoints.targets}
    with open_store(f"sqlite:///{base / 'state.db'}") as store:
        store.create_run(RUN, "ck", spec, NOW)
        store.checkpoints.record_listing(RUN, found, NOW)
        for c in found:
            store.checkpoints.record_verification(RUN, c.path, True, NOW)
        for name, steps in copies.items():
            t = targets[name]
            target = load_target(t.kind, t.options_for(RUN))
            try:
                for c in found:
                    if c.step in steps:
                        assert replicate(c, manifests[c.path], target).ok
                        store.checkpoints.record_replica(RUN, c.path, name, True, NOW)
            finally:
                target.close()


def ctl(cfg: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``b300ctl --config CFG ARGS`` as a real process."""
    return subprocess.run([sys.executable, "-m", "b300.cli", "--config", str(cfg), *args],
                          capture_output=True, text=True, timeout=timeout, check=False)


def leftovers(parent: Path) -> list[str]:
    """Temporary restore folders left beside the destination (there must be none)."""
    return sorted(p.name for p in parent.iterdir() if ".b300-restore-" in p.name) if parent.exists() else []
