#!/usr/bin/env python3
"""Benchmark: checkpoint replication, manifests, verification and prune planning.

    python tests/bench/bench_checkpoints.py [--large-mib 512] [--large 3] [--small 2000] [--small-kib 256]
        [--runs 3] [--only filesystem,sftp]

1. Writes one checkpoint under /var/tmp (default ~2 GiB: 3 x 512 MiB files plus
   2,000 x 256 KiB shards) and times its sha256 manifest.
2. Copies it, ``--runs`` times each, interleaved, with b300's ``replicate`` (end to end:
   copy + verification against the manifest) and the obvious alternatives on the same
   data: to a local path vs ``rsync -a``, ``cp -r`` and ``cp -r && sync -f``; over SSH to
   an sshd of its own on 127.0.0.1 vs ``rsync -a -e ssh`` and ``scp -r``. Prints medians
   and b300's throughput as a ratio of each. The source is in the page cache for every
   tool alike; ``sync`` runs (untimed) before each copy.
3. Builds 1,000 checkpoints of 100 files (100,000 files), and times listing them
   (generic layout), verifying every manifest, and planning a prune over them.
Removes everything it made (also on Ctrl-C). The last line of output is JSON.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from b300.checkpoints.layouts import load_layout
from b300.checkpoints.manifest import ensure_manifest, verify
from b300.checkpoints.replicate import load_target, replicate
from b300.checkpoints.retention import CheckpointState, RetentionPolicy, plan_prune

MIB = 1 << 20


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _free_port(start: int) -> int:
    for port in range(start, start + 100):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise SystemExit("no free port for sshd")


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


def _start_sshd(work: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    for key in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(work / key)], check=True)
    (work / "authorized_keys").write_text((work / "client_key.pub").read_text())
    port = _free_port(22151)
    kind, blob = (work / "host_key.pub").read_text().split()[:2]
    (work / "known_hosts").write_text(f"[127.0.0.1]:{port} {kind} {blob}\n")
    (work / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {work / 'host_key'}\n"
        f"AuthorizedKeysFile {work / 'authorized_keys'}\nPidFile {work / 'sshd.pid'}\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
        "StrictModes no\nUsePAM no\nSubsystem sftp internal-sftp\nLogLevel ERROR\n")
    os.makedirs("/run/sshd", exist_ok=True)
    proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(work / "sshd_config")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    opts = {"host": "127.0.0.1", "port": port, "username": getpass.getuser(),
            "key_filename": str(work / "client_key"), "known_hosts": str(work / "known_hosts")}
    return proc, opts


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--large", type=int, default=3)
    ap.add_argument("--large-mib", type=int, default=512)
    ap.add_argument("--small", type=int, default=2000)
    ap.add_argument("--small-kib", type=int, default=256)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3, help="runs of each copy (medians)")
    ap.add_argument("--only", default="", help="comma-separated targets to time (filesystem,sftp)")
    ap.add_argument("--many", type=int, default=1000, help="checkpoints of 100 files for the planning figures")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="b300-bench-ckpt-", dir="/var/tmp"))
    sshd: subprocess.Popen[bytes] | None = None
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

        t, manifest = _timed(lambda: ensure_manifest(str(ckpt_dir), datetime.now(UTC)))
        figures["manifest_s"] = t
        (ck,) = load_layout("generic").list_checkpoints(str(src_root))

        sshd, ssh = _start_sshd(work)
        dest = f"{ssh['username']}@127.0.0.1"
        ssh_opts = ["-i", ssh["key_filename"], "-o", f"UserKnownHostsFile={ssh['known_hosts']}",
                    "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"]
        counter = iter(range(1_000_000))

        def b300(kind: str, opts: Callable[[Path], dict[str, Any]]) -> Callable[[Path], None]:
            def run(out: Path) -> None:
                target = load_target(kind, opts(out))
                try:
                    r = replicate(ck, manifest, target, concurrency=args.concurrency)
                    assert r.ok and r.files_sent == files, r
                finally:
                    target.close()
            return run

        def tool(argv: Callable[[Path], list[str]], *, mkdir: bool = True) -> Callable[[Path], None]:
            def run(out: Path) -> None:
                if mkdir:
                    out.mkdir()
                subprocess.run(argv(out), check=True, stdout=subprocess.DEVNULL)
            return run

        def sync_after(run: Callable[[Path], None]) -> Callable[[Path], None]:
            def both(out: Path) -> None:
                run(out)
                subprocess.run(["sync", "-f", str(out)], check=True)
            return both

        contenders: dict[str, list[tuple[str, Callable[[Path], None]]]] = {
            "filesystem": [
                ("b300 replicate (copy + verify)", b300("filesystem", lambda out: {"path": str(out)})),
                ("rsync -a", tool(lambda out: ["rsync", "-a", f"{ckpt_dir}/", str(out)])),
                ("cp -r", tool(lambda out: ["cp", "-r", str(ckpt_dir), str(out)], mkdir=False)),
                # b300 makes the copy durable (one syncfs) before recording it; this is cp doing the same.
                ("cp -r && sync -f (durable)", sync_after(
                    tool(lambda out: ["cp", "-r", str(ckpt_dir), str(out)], mkdir=False))),
            ],
            "sftp": [
                ("b300 replicate (copy + verify)", b300("sftp", lambda out: {**ssh, "path": str(out)})),
                ("rsync -a -e ssh", tool(lambda out: [
                    "rsync", "-a", "-e", " ".join(["ssh", "-p", str(ssh["port"]), *ssh_opts]),
                    f"{ckpt_dir}/", f"{dest}:{out}/"])),
                ("scp -r", tool(lambda out: ["scp", "-q", "-r", "-P", str(ssh["port"]), *ssh_opts,
                                            str(ckpt_dir), f"{dest}:{out}/"])),
            ],
        }
        results: dict[str, dict[str, list[float]]] = {}
        for kind, entries in contenders.items():
            if args.only and kind not in args.only.split(","):
                continue
            for _ in range(args.runs):
                for label, run in entries:  # interleaved: load changes hit every tool alike
                    out = work / f"out-{next(counter)}"
                    os.sync()  # untimed: nobody pays for the previous run's writeback
                    t, _ = _timed(lambda run=run, out=out: run(out))  # type: ignore[misc]
                    results.setdefault(kind, {}).setdefault(label, []).append(t)
                    shutil.rmtree(out, ignore_errors=True)

        print(f"\nreplicating one checkpoint: {gib:.2f} GiB in {files} files "
              f"(concurrency {args.concurrency}, {args.runs} runs each, interleaved, medians); "
              f"manifest (sha256) {figures['manifest_s']:.1f} s "
              f"= {gib * 1024 / figures['manifest_s']:.0f} MiB/s; load average {os.getloadavg()[0]:.1f}")
        figures["replication"] = {}
        for kind, by_tool in results.items():
            ours = statistics.median(next(iter(by_tool.values())))
            for label, times in by_tool.items():
                med = statistics.median(times)
                ratio = "" if med == ours else f"  b300 = {med / ours:.2f}x its throughput"
                print(f"  {kind:<10} {label:<32} {med:7.2f} s  {gib * 1024 / med:7.0f} MiB/s"
                      f"  (runs: {', '.join(f'{x:.1f}' for x in times)}){ratio}")
                figures["replication"][f"{kind}: {label}"] = {"median_s": med, "runs_s": times}
        shutil.rmtree(work / "src", ignore_errors=True)

        many = work / "many"
        many.mkdir()
        print(f"\nwriting {args.many} checkpoints x 100 files ...", flush=True)
        _many(many, args.many, 100)
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
        figures["many"] = {"checkpoints": len(found), "files": nfiles, "list_s": t_list, "manifest_s": t_man,
                           "verify_s": t_ver, "plan_s": t_plan, "kept": len(plan.keep),
                           "deleted": len(plan.delete)}
        print(json.dumps(figures))
        return 0
    finally:
        if sshd is not None:
            sshd.terminate()
            sshd.wait(10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
