"""Servers and alternative tools for tests/bench/bench_checkpoints.py (a helper, not a test).

An sshd and a moto S3 server of the benchmark's own on 127.0.0.1, the paramiko
SFTP copy the ``sftp`` target used before issue 18, and ``sha256sum`` over a copy,
so each alternative can also be timed like-for-like (copy + verify).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MIB = 1 << 20


def free_port(start: int) -> int:
    for port in range(start, start + 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise SystemExit(f"no free port in {start}..{start + 199}")


def _wait_port(port: int, proc: subprocess.Popen[bytes], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise SystemExit(f"{what} did not listen on {port} within {timeout:.0f} s")


def start_sshd(work: Path, port_from: int = 22151) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """An OpenSSH server with its own host key and one authorized key; the sftp target's options."""
    for key in ("host_key", "client_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(work / key)], check=True)
    (work / "authorized_keys").write_text((work / "client_key.pub").read_text())
    port = free_port(port_from)
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
    _wait_port(port, proc, "sshd")
    opts = {"host": "127.0.0.1", "port": port, "username": getpass.getuser(),
            "key_filename": str(work / "client_key"), "known_hosts": str(work / "known_hosts")}
    return proc, opts


def ssh_options(opts: dict[str, Any]) -> list[str]:
    """The same host-key policy as the sftp target: known key only, no prompts."""
    return ["-i", opts["key_filename"], "-o", f"UserKnownHostsFile={opts['known_hosts']}",
            "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"]


class MotoServer:
    """moto's S3 server as a process of its own (so it does not share the client's GIL)."""

    def __init__(self, port_from: int = 5105) -> None:
        self.port = free_port(port_from)
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def restart(self, bucket: str) -> None:
        self.stop()
        argv = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_port(self.port, self.proc, "moto")
        import boto3

        client = boto3.client("s3", endpoint_url=self.url, region_name="us-east-1",
                              aws_access_key_id="test", aws_secret_access_key="test")  # noqa: S106 - moto
        client.create_bucket(Bucket=bucket)
        client.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


def files_under(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def sha256sum_local(root: Path) -> None:
    """coreutils ``sha256sum`` of every file under ``root`` (argv in batches, no shell)."""
    names = [str(p) for p in files_under(root)]
    for i in range(0, len(names), 500):
        subprocess.run(["sha256sum", "-b", "--", *names[i:i + 500]], check=True, stdout=subprocess.DEVNULL)


def sha256sum_remote(ssh: Sequence[str], dest: str, root: Path, rels: Sequence[str]) -> None:
    """``sha256sum`` of the copied files, run on the SSH server (names on stdin, not in a shell line)."""
    script = f"cd -- {shlex.quote(str(root))} && xargs -0 sha256sum -b -- >/dev/null"
    subprocess.run([*ssh, dest, script], input=b"\0".join(r.encode() for r in rels), check=True,
                   stdout=subprocess.DEVNULL)


def paramiko_copy(opts: dict[str, Any], src: Path, out: str, concurrency: int) -> None:
    """What the sftp target did before issue 18: paramiko, one connection, one SFTP session
    per thread, 1 MiB pipelined writes, 64 MiB window (copy only: no verification)."""
    import paramiko

    client = paramiko.SSHClient()
    client.load_host_keys(opts["known_hosts"])
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(opts["host"], port=opts["port"], username=opts["username"],
                   key_filename=opts["key_filename"], allow_agent=False, look_for_keys=False)
    try:
        transport = client.get_transport()
        assert transport is not None
        todo = sorted(files_under(src), key=lambda p: -p.stat().st_size)
        lock = threading.Lock()
        errors: list[BaseException] = []
        first = paramiko.SFTPClient.from_transport(transport)
        assert first is not None
        for d in sorted({f"{out}/{p.parent.relative_to(src).as_posix()}".rstrip("/.") for p in todo}):
            current = ""
            for part in d.strip("/").split("/"):
                current += "/" + part
                with contextlib.suppress(OSError):
                    first.mkdir(current)
        first.close()

        def worker() -> None:
            sftp = paramiko.SFTPClient.from_transport(transport, window_size=64 * MIB)
            assert sftp is not None
            try:
                while True:
                    with lock:
                        if not todo:
                            return
                        path = todo.pop(0)
                    remote = f"{out}/{path.relative_to(src).as_posix()}"
                    with open(path, "rb") as fh, sftp.open(remote, "w") as dst:
                        dst.set_pipelined(True)
                        while chunk := fh.read(MIB):
                            dst.write(chunk)
            except BaseException as exc:  # reported by the caller
                errors.append(exc)
            finally:
                sftp.close()

        threads = [threading.Thread(target=worker) for _ in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
    finally:
        client.close()
