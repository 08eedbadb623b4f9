#!/usr/bin/env python3
"""Benchmark: ``b300ctl checkpoints restore`` of a ~200 MB checkpoint from each kind of target,
against the obvious tool for that target, timed by ``farm-bench --vs`` (whole processes, A/B pairs).

    python tests/bench/bench_restore.py [--mib 200] [--files 8] [--runs 5] [--only filesystem,sftp,s3]
        [--verify-too] [--concurrency N]

Writes one real ``torch.distributed.checkpoint`` checkpoint (``--files`` storage files
through ``FileSystemWriter(thread_count=...)``, ``--mib`` MiB in all) under /var/tmp,
records it in a SQLite store, copies it with the daemon's own ``replicate()`` to a
local folder, an sshd of its own on 127.0.0.1 and moto's S3 server (a process of its
own), then times, each as A against B:

- filesystem: ``b300ctl checkpoints restore`` vs ``cp -r`` of the replica folder;
- sftp: ``b300ctl checkpoints restore`` vs ``sftp -r`` and ``scp -r`` against the same sshd;
- s3: ``b300ctl checkpoints restore`` vs ``aws s3 cp --recursive`` (skipped when awscli is
  missing: ``pip install -e '.[bench]'``).

Each timed command first removes its destination (both sides alike), so every run
restores into a folder that does not exist. b300ctl checks every file's size and sha256
against the manifest; the alternatives check nothing (``--verify-too`` adds, for the
filesystem, ``cp -r`` followed by ``sha256sum`` of every file). Everything is on this
machine's disk and in its page cache: the figures compare the tools' own overhead, not
a network. Removes what it made (also on Ctrl-C). Prints farm-bench's reports.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from replication_servers import MotoServer, ssh_options, start_sshd

from b300.checkpoints.layouts import load_layout
from b300.checkpoints.manifest import ensure_manifest
from b300.checkpoints.replicate import load_target, replicate
from b300.config import load_config
from b300.store import open_store

MIB = 1 << 20
BUCKET = "b300-restore-bench"
RUN = "bench-1"
NOW = datetime.now(UTC)


def write_dcp(root: Path, mib: int, files: int) -> Path:
    """One DCP checkpoint (single process, no process group), ``files`` storage files."""
    import torch
    import torch.distributed.checkpoint as dcp

    path = root / "step_100"
    per = mib * MIB // 4 // files  # float32 elements per tensor: one tensor per storage file
    g = torch.Generator().manual_seed(100)
    state = {f"layer{i}": torch.randn(per, generator=g) for i in range(files)}
    dcp.save(state, storage_writer=dcp.FileSystemWriter(str(path), thread_count=files))
    return path


def config_text(work: Path, ssh: dict[str, Any], moto: MotoServer | None) -> str:
    secret = work / "s3-secret"
    secret.write_text("test\n")
    os.chmod(secret, 0o600)
    out = [f'[daemon]\nstate_dir = {json.dumps(str(work))}\n'
           f'database_url = {json.dumps("sqlite:///" + str(work / "state.db"))}\n'
           f'[[checkpoints.targets]]\nname = "fs"\nkind = "filesystem"\n'
           f'path = {json.dumps(str(work / "offsite" / "{run}"))}\n']
    if ssh:
        out.append('[[checkpoints.targets]]\nname = "ssh"\nkind = "sftp"\n'
                   + "".join(f"{k} = {json.dumps(v)}\n" for k, v in ssh.items())
                   + f'path = {json.dumps(str(work / "sftp-remote" / "{run}"))}\n')
    if moto is not None:
        out.append(f'[[checkpoints.targets]]\nname = "s3"\nkind = "s3"\nbucket = "{BUCKET}"\n'
                   'prefix = "{run}/"\n'
                   f'endpoint_url = "{moto.url}"\nregion_name = "us-east-1"\naws_access_key_id = "test"\n'
                   f'aws_secret_access_key_file = {json.dumps(str(secret))}\n')
    return "".join(out)


def prepare(work: Path, ckpt: Path, cfg: Path) -> None:
    spec = (f'name = "bench"\n[job]\ncommand = "true"\nnodes = 1\ngpus_per_node = 0\n'
            f'[checkpoint]\ndir = {json.dumps(str(ckpt.parent))}\nlayout = "dcp"\ninterval = "1h"\n')
    (found,) = load_layout("dcp").list_checkpoints(str(ckpt.parent))
    manifest = ensure_manifest(found.path, NOW)
    with open_store(f"sqlite:///{work / 'state.db'}") as store:
        store.create_run(RUN, "bench", spec, NOW)
        store.checkpoints.record_listing(RUN, [found], NOW)
        store.checkpoints.record_verification(RUN, found.path, True, NOW)
        for t in load_config(str(cfg)).checkpoints.targets:
            target = load_target(t.kind, t.options_for(RUN))
            try:
                result = replicate(found, manifest, target)
                assert result.ok, result.problems
            finally:
                target.close()
            store.checkpoints.record_replica(RUN, found.path, t.name, True, NOW)


def farm_bench(a: str, b: str, runs: int) -> str:
    argv = ["farm-bench", "-n", str(runs), "--warmup", "1", "--timeout", "900", "--vs", b, "--",
            *shlex.split(a)]
    print(f"$ {shlex.join(argv)}", flush=True)
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1000, check=False)
    print(proc.stdout + proc.stderr, flush=True)
    return proc.stdout


def own_figure(ctl: str, target: str, out: Path) -> None:
    """b300ctl's own report of one restore: the fetch and verification alone, without start-up."""
    shutil.rmtree(out, ignore_errors=True)
    proc = subprocess.run([*shlex.split(ctl), "--target", target, "--to", str(out), "--json"],
                          capture_output=True, text=True, timeout=900, check=True)
    r = json.loads(proc.stdout)
    print(f"b300ctl's own figure ({target}): {r['files']} files, {r['bytes'] / 1e6:.1f} MB fetched and "
          f"verified in {r['seconds']:.2f} s = {r['mb_per_s']} MB/s (start-up excluded)\n", flush=True)
    shutil.rmtree(out, ignore_errors=True)


def sh(script: str) -> str:
    return f"sh -c {shlex.quote(script)}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=200)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--only", default="filesystem,sftp,s3")
    ap.add_argument("--verify-too", action="store_true")
    ap.add_argument("--concurrency", type=int, default=None,
                    help="b300ctl restore --concurrency (default: the config's, 4)")
    args = ap.parse_args()
    kinds = set(args.only.split(","))
    if shutil.which("farm-bench") is None:
        raise SystemExit("farm-bench is not installed")
    work = Path(tempfile.mkdtemp(prefix="b300-restore-bench-", dir="/var/tmp"))
    sshd: subprocess.Popen[bytes] | None = None
    moto: MotoServer | None = None
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(130))
    try:
        ckpt = write_dcp(work / "ckpt", args.mib, args.files)
        ssh: dict[str, Any] = {}
        if "sftp" in kinds:
            (work / "sshd").mkdir()
            sshd, ssh = start_sshd(work / "sshd", int(os.environ.get("B300_SSHD_PORT_BASE", "22151")))
        aws = shutil.which("aws")
        if "s3" in kinds:
            moto = MotoServer(int(os.environ.get("B300_PORT_BASE", "5105")) + 60)
            moto.restart(BUCKET)
        cfg = work / "b300.toml"
        cfg.write_text(config_text(work, ssh, moto))
        prepare(work, ckpt, cfg)
        size = sum(p.stat().st_size for p in ckpt.rglob("*") if p.is_file())
        print(f"checkpoint: {ckpt} ({size / 1e6:.1f} MB, {len(list(ckpt.iterdir()))} files)", flush=True)
        ctl = (f"{shlex.quote(sys.executable)} -m b300.cli --config {shlex.quote(str(cfg))} "
               f"checkpoints restore {RUN}")
        if args.concurrency:
            ctl += f" --concurrency {args.concurrency}"
        out = work / "out"
        out.mkdir()
        if "filesystem" in kinds:
            replica = work / "offsite" / RUN / "step_100"
            a = sh(f"rm -rf {out}/a && exec {ctl} --target fs --to {out}/a")
            own_figure(ctl, "fs", out / "a")
            farm_bench(a, sh(f"rm -rf {out}/b && exec cp -r {replica} {out}/b"), args.runs)
            if args.verify_too:
                farm_bench(a, sh(f"rm -rf {out}/b && cp -r {replica} {out}/b && "
                                 f"find {out}/b -type f -exec sha256sum -b {{}} + >/dev/null"), args.runs)
        if "sftp" in kinds:
            opts = shlex.join([*ssh_options(ssh), "-P", str(ssh["port"])])
            remote = shlex.quote(f"{ssh['username']}@127.0.0.1:{work / 'sftp-remote' / RUN / 'step_100'}")
            a = sh(f"rm -rf {out}/a && exec {ctl} --target ssh --to {out}/a")
            own_figure(ctl, "ssh", out / "a")
            farm_bench(a, sh(f"rm -rf {out}/b && exec sftp -q -r {opts} {remote} {out}/b"), args.runs)
            farm_bench(a, sh(f"rm -rf {out}/b && exec scp -q -r {opts} {remote} {out}/b"), args.runs)
        if "s3" in kinds and moto is not None:
            if aws is None:
                print("s3: awscli is not installed; no alternative timed (pip install -e '.[bench]')")
            else:
                env = f"AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_DEFAULT_REGION=us-east-1 {aws}"
                a = sh(f"rm -rf {out}/a && exec {ctl} --target s3 --to {out}/a")
                own_figure(ctl, "s3", out / "a")
                farm_bench(a, sh(f"rm -rf {out}/b && exec env {env} s3 cp --quiet --recursive "
                                 f"--endpoint-url {moto.url} s3://{BUCKET}/{RUN}/step_100/ {out}/b"), args.runs)
    finally:
        if moto is not None:
            moto.stop()
        if sshd is not None:
            sshd.terminate()
            sshd.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
