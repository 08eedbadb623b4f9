#!/usr/bin/env python3
"""Benchmark: checkpoint replication, manifests, verification and prune planning.

    python tests/bench/bench_checkpoints.py [--large-mib 512] [--large 3] [--small 1000] [--small-kib 512]
        [--runs 3] [--only filesystem,sftp,s3] [--concurrency 4]

1. Writes one checkpoint under /var/tmp (default 2 GiB: 3 x 512 MiB files plus
   1,000 x 512 KiB shards) and times its sha256 manifest, and sha256 itself (hashlib,
   ``sha256sum``, ``openssl dgst``) on this CPU: it bounds what a verified copy can reach.
2. Copies it, ``--runs`` times each, interleaved, with b300's ``replicate`` (end to end:
   copy + verification against the manifest + the replica record) and the obvious
   alternatives on the same data: to a local path vs ``rsync -a``, ``cp -r``, ``cp -r &&
   sync -f``; over SSH to an sshd of its own on 127.0.0.1 vs ``rsync -a -e ssh``, ``scp
   -r`` and paramiko SFTP (the previous transport, copy only); to moto's S3 server (a
   process of its own, restarted untimed before each S3 run) vs ``aws s3 cp
   --recursive`` (``pip install -e '.[bench]'``). The alternatives verify nothing, so
   each group also times a like-for-like one: the copy plus ``sha256sum`` of every
   copied file (on the server for SSH). Prints medians, the load average around each
   run, and b300's throughput as a ratio of each. The source is in the page cache for
   every tool alike; ``sync`` runs (untimed) before each copy.
3. Builds 1,000 checkpoints of 100 files (100,000 files), and times listing them
   (generic layout), verifying every manifest, and planning a prune over them.
Removes everything it made (also on Ctrl-C). The last line of output is JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from replication_servers import (
    MotoServer,
    paramiko_copy,
    sha256sum_local,
    sha256sum_remote,
    ssh_options,
    start_sshd,
)

from b300.checkpoints.layouts import load_layout
from b300.checkpoints.manifest import ensure_manifest, verify
from b300.checkpoints.replicate import load_target, replicate
from b300.checkpoints.retention import CheckpointState, RetentionPolicy, plan_prune

MIB = 1 << 20
BUCKET = "b300-bench"


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _hash_rates(sample: Path) -> dict[str, float]:
    """sha256 throughput on this CPU (MiB/s of one core, CPU time): what bounds a verified copy."""
    data = sample.read_bytes()
    rates: dict[str, float] = {}
    c0 = time.process_time()
    hashlib.sha256(data).hexdigest()
    rates["hashlib"] = len(data) / MIB / (time.process_time() - c0)
    for label, argv in (("sha256sum", ["sha256sum", "-b", str(sample)]),
                        ("openssl dgst", ["openssl", "dgst", "-sha256", "-r", str(sample)])):
        before = os.times()
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
        after = os.times()
        cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
        rates[label] = len(data) / MIB / max(cpu, 1e-3)
    return rates


def _write_checkpoint(d: Path, large: int, large_mib: int, small: int, small_kib: int) -> int:
    block = os.urandom(8 * MIB)
    total = 0
    for i in range(large):
        with open(d / f"__{i}_0.distcp", "wb") as fh:
            for j in range(large_mib // 8):
                fh.write(j.to_bytes(8, "little") + block[8:])  # no two blocks alike
                total += 8 * MIB
    shards = d / "shards"
    shards.mkdir()
    for i in range(small):
        data = os.urandom(small_kib * 1024)
        (shards / f"__{i}_1.distcp").write_bytes(data)
        total += len(data)
    (d / ".metadata").write_bytes(os.urandom(4096))
    (d / "DONE").write_bytes(b"")
    return total


def _many(root: Path, checkpoints: int, files: int) -> None:
    now = datetime.now(UTC)
    for c in range(checkpoints):
        d = root / f"step_{c}"
        d.mkdir()
        for f in range(files - 1):
            (d / f"__{f}_0.distcp").write_bytes(b"%d-%d" % (c, f) * 16)
        (d / "DONE").write_bytes(b"")
        t = (now - timedelta(hours=checkpoints - c)).timestamp()
        for p in d.iterdir():
            os.utime(p, (t, t))


Run = Callable[[Path], None]


def _contenders(args: argparse.Namespace, work: Path, ckpt_dir: Path, ck: Any, manifest: Any, files: int,
                ssh: dict[str, Any], moto: MotoServer) -> dict[str, list[tuple[str, Run]]]:
    """Per target, (label, run(out)) pairs; b300 first (the ratios are against it)."""
    dest = f"{ssh['username']}@127.0.0.1"
    ssh_opts = ssh_options(ssh)
    ssh_argv = ["ssh", "-p", str(ssh["port"]), *ssh_opts]
    rels = [p.relative_to(ckpt_dir).as_posix() for p in sorted(ckpt_dir.rglob("*")) if p.is_file()]
    s3_env = {**os.environ, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
              "AWS_DEFAULT_REGION": "us-east-1"}
    s3_opts = {"bucket": BUCKET, "endpoint_url": moto.url, "region_name": "us-east-1",
               "aws_access_key_id": "test", "aws_secret_access_key": "test"}

    def b300(kind: str, opts: Callable[[Path], dict[str, Any]]) -> Run:
        def run(out: Path) -> None:
            target = load_target(kind, opts(out))
            try:
                r = replicate(ck, manifest, target, concurrency=args.concurrency)
                assert r.ok and r.files_sent == files, r
            finally:
                target.close()
        return run

    def tool(argv: Callable[[Path], list[str]], *, mkdir: bool = True,
             env: dict[str, str] | None = None) -> Run:
        def run(out: Path) -> None:
            if mkdir:
                out.mkdir()
            subprocess.run(argv(out), check=True, stdout=subprocess.DEVNULL, env=env)
        return run

    def then(first: Run, second: Run) -> Run:
        def both(out: Path) -> None:
            first(out)
            second(out)
        return both

    def paramiko_run(out: Path) -> None:
        out.mkdir()
        paramiko_copy(ssh, ckpt_dir, str(out), args.concurrency)

    cp = tool(lambda out: ["cp", "-r", str(ckpt_dir), str(out)], mkdir=False)
    rsync = tool(lambda out: ["rsync", "-a", f"{ckpt_dir}/", str(out)])
    scp = tool(lambda out: ["scp", "-q", "-r", "-P", str(ssh["port"]), *ssh_opts, str(ckpt_dir),
                            f"{dest}:{out}/"])
    return {
        "filesystem": [
            ("b300 replicate (copy + verify)", b300("filesystem", lambda out: {"path": str(out)})),
            ("rsync -a", rsync),
            ("cp -r", cp),
            # b300 makes the copy durable (one syncfs) before recording it; this is cp doing the same.
            ("cp -r && sync -f (durable)", then(cp, lambda out: subprocess.run(["sync", "-f", str(out)],
                                                                               check=True))),
            ("cp -r && sha256sum (verified)", then(cp, sha256sum_local)),
        ],
        "sftp": [
            ("b300 replicate (copy + verify)", b300("sftp", lambda out: {**ssh, "path": str(out)})),
            ("rsync -a -e ssh", tool(lambda out: [
                "rsync", "-a", "-e", " ".join(ssh_argv), f"{ckpt_dir}/", f"{dest}:{out}/"])),
            ("scp -r", scp),
            ("scp -r && sha256sum on server", then(scp, lambda out: sha256sum_remote(
                ssh_argv, dest, out / ckpt_dir.name, rels))),
            ("paramiko SFTP (old transport, copy only)", paramiko_run),
        ],
        "s3": [
            ("b300 replicate (copy + verify)", b300("s3", lambda out: {**s3_opts, "prefix": f"{out.name}/"})),
            ("aws s3 cp --recursive", tool(lambda out: [
                "aws", "--endpoint-url", moto.url, "s3", "cp", "--quiet", "--recursive", str(ckpt_dir),
                f"s3://{BUCKET}/{out.name}/"], mkdir=False, env=s3_env)),
        ],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--large", type=int, default=3)
    ap.add_argument("--large-mib", type=int, default=512)
    ap.add_argument("--small", type=int, default=1000)
    ap.add_argument("--small-kib", type=int, default=512)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3, help="runs of each copy (medians)")
    ap.add_argument("--only", default="", help="comma-separated targets to time (filesystem,sftp,s3)")
    ap.add_argument("--many", type=int, default=1000, help="checkpoints of 100 files for the planning figures")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="b300-bench-ckpt-", dir="/var/tmp"))
    sshd: subprocess.Popen[bytes] | None = None
    moto = MotoServer()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    figures: dict[str, Any] = {}
    try:
        src_root = work / "src"
        ckpt_dir = src_root / "step_1000"
        ckpt_dir.mkdir(parents=True)
        print(f"writing the checkpoint under {work} ...", flush=True)
        total = _write_checkpoint(ckpt_dir, args.large, args.large_mib, args.small, args.small_kib)
        files = args.large + args.small + 2
        gib = total / (1 << 30)
        figures.update(bytes=total, files=files)
        figures["sha256_mib_s_per_core"] = _hash_rates(ckpt_dir / "__0_0.distcp")

        t, manifest = _timed(lambda: ensure_manifest(str(ckpt_dir), datetime.now(UTC)))
        figures["manifest_s"] = t
        (ck,) = load_layout("generic").list_checkpoints(str(src_root))
        (work / "sshd").mkdir()
        sshd, ssh = start_sshd(work / "sshd")
        contenders = _contenders(args, work, ckpt_dir, ck, manifest, files, ssh, moto)
        results: dict[str, dict[str, list[tuple[float, float]]]] = {}
        counter = iter(range(1_000_000))
        kinds = [k for k in contenders if not args.only or k in args.only.split(",")]
        for run_no in range(args.runs):
            for kind in kinds:
                for label, run in contenders[kind]:  # interleaved: load changes hit every tool alike
                    out = work / f"out-{next(counter)}"
                    if kind == "s3":
                        moto.restart(BUCKET)  # untimed: every S3 run meets an empty server
                    os.sync()  # untimed: nobody pays for the previous run's writeback
                    load = os.getloadavg()[0]
                    t, _ = _timed(lambda run=run, out=out: run(out))  # type: ignore[misc]
                    load = max(load, os.getloadavg()[0])
                    results.setdefault(kind, {}).setdefault(label, []).append((t, load))
                    print(f"  run {run_no + 1} {kind:<10} {label:<42} {t:7.2f} s  load {load:.1f}", flush=True)
                    shutil.rmtree(out, ignore_errors=True)
        moto.stop()

        rates = figures["sha256_mib_s_per_core"]
        print(f"\nreplicating one checkpoint: {gib:.2f} GiB in {files} files "
              f"(concurrency {args.concurrency}, {args.runs} runs each, interleaved, medians); "
              f"manifest (sha256) {figures['manifest_s']:.1f} s "
              f"= {gib * 1024 / figures['manifest_s']:.0f} MiB/s; sha256 per core: "
              f"hashlib {rates['hashlib']:.0f}, sha256sum {rates['sha256sum']:.0f}, "
              f"openssl {rates['openssl dgst']:.0f} MiB/s")
        figures["replication"] = {}
        for kind, by_tool in results.items():
            ours = statistics.median(t for t, _ in next(iter(by_tool.values())))
            for label, runs in by_tool.items():
                times = [t for t, _ in runs]
                loads = [x for _, x in runs]
                med = statistics.median(times)
                ratio = "" if label.startswith("b300") else f"  b300 = {med / ours:.2f}x its throughput"
                print(f"  {kind:<10} {label:<42} {med:7.2f} s  {gib * 1024 / med:6.0f} MiB/s"
                      f"  (runs: {', '.join(f'{x:.1f}' for x in times)}; "
                      f"load {min(loads):.1f}-{max(loads):.1f})"
                      f"{ratio}")
                figures["replication"][f"{kind}: {label}"] = {"median_s": med, "runs_s": times, "load": loads}
        shutil.rmtree(work / "src", ignore_errors=True)

        if args.many:
            figures["many"] = _planning(work, args.many)
        print(json.dumps(figures))
        return 0
    finally:
        moto.stop()
        if sshd is not None:
            sshd.terminate()
            sshd.wait(10)
        shutil.rmtree(work, ignore_errors=True)


def _planning(work: Path, count: int) -> dict[str, Any]:
    many = work / "many"
    many.mkdir()
    print(f"\nwriting {count} checkpoints x 100 files ...", flush=True)
    _many(many, count, 100)
    layout = load_layout("generic")
    t_list, found = _timed(lambda: layout.list_checkpoints(str(many)))
    t_man, _ = _timed(lambda: [ensure_manifest(c.path, datetime.now(UTC)) for c in found])
    t_ver, oks = _timed(lambda: [verify(c.path).ok for c in found])
    assert all(oks)
    states = [CheckpointState(c, verified=True, replicated_to=frozenset({"s3"})) for c in found]
    policy = RetentionPolicy(keep_last=5, hourly_for=timedelta(hours=48), daily_for=timedelta(days=30))
    t_plan, plan = _timed(lambda: plan_prune(states, policy, datetime.now(UTC), replication_targets={"s3"}))
    nfiles = sum(c.files for c in found)
    print(f"{len(found)} checkpoints, {nfiles} files: list (one scandir walk) {t_list:.2f} s, "
          f"manifests {t_man:.2f} s, verify all {t_ver:.2f} s, plan prune {t_plan * 1000:.1f} ms "
          f"(keeps {len(plan.keep)}, deletes {len(plan.delete)})")
    return {"checkpoints": len(found), "files": nfiles, "list_s": t_list, "manifest_s": t_man,
            "verify_s": t_ver, "plan_s": t_plan, "kept": len(plan.keep), "deleted": len(plan.delete)}


if __name__ == "__main__":
    sys.exit(main())
