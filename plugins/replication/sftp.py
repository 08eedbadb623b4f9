"""The ``sftp`` replication target: replicas under a path on an SSH server.

The transport is OpenSSH's own ``ssh`` client (``ssh -s HOST sftp``, argv only,
never a shell), one process per sending thread, with this module speaking SFTP
over its pipes (:mod:`.sftp_wire`). Measured on the 2-core test machine (docs/benchmarks.md,
"Performance"), OpenSSH moves the same bytes for about half the CPU paramiko
needs, and its processes run on other cores than the daemon's Python.

Host keys: ``StrictHostKeyChecking=yes`` against ``known_hosts`` only (an
unknown or changed key is refused, never learnt), ``BatchMode``, the key file
only (no agent, no passwords), no user or system ssh_config. Each file is
hashed while it is sent; as soon as it has landed (renamed into place) the
server hashes it (:mod:`.sftp_hash`) while the next file is being sent, and
those digests are what verification compares with the manifest
(:class:`b300.interfaces.SentDigests`). A server that stops answering raises
after ``timeout`` s (ssh's ServerAlive probes and our own reply deadline).
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import posixpath
import re
import shutil
import stat
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence

import structlog

from b300.interfaces import RemoteFile

from .common import PART, RECORD, check_name
from .sftp_codec import O_CREAT, O_TRUNC, O_WRITE
from .sftp_hash import ServerHasher, hasher_command
from .sftp_wire import SftpChannel

log = structlog.get_logger(__name__)

_HOST = re.compile(r"[A-Za-z0-9_.:\[\]%-]{1,253}")
_USER = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.@-]{0,63}")
# AES-GCM first: with AES-NI it is the cheapest cipher+MAC OpenSSH offers (docs/benchmarks.md).
_CIPHERS = "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,aes128-ctr,aes256-ctr"
_HASH_WAIT_S = 3600.0  # a RemoteHasher call for files of unknown size


class SftpTarget:
    """Replicas under ``path`` on an SSH server, one ``ssh`` session per sending thread.

    Raises ConnectionError at construction when the server cannot be reached,
    its host key is not the one in ``known_hosts`` ("Host key verification
    failed.") or the key is refused; ValueError for a host or user name that
    is not one; FileNotFoundError when ``ssh_command`` is not installed.
    """

    def __init__(self, *, host: str, path: str, username: str, key_filename: str, known_hosts: str,
                 port: int = 22, name: str = "sftp", timeout: float = 30.0, remote_hash: bool = True,
                 ciphers: str = _CIPHERS, ssh_command: str = "ssh") -> None:
        if not _HOST.fullmatch(host) or host.startswith("-"):
            raise ValueError(f"sftp target {name}: {host!r} is not a host name")
        if not _USER.fullmatch(username):
            raise ValueError(f"sftp target {name}: {username!r} is not a user name")
        if not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"sftp target {name}: port {port!r} is not a TCP port")
        program = shutil.which(ssh_command)
        if program is None:
            raise FileNotFoundError(f"sftp target {name}: {ssh_command!r} (OpenSSH's client) is not installed")
        self.name = name
        self._base = path.rstrip("/") or "/"
        self._timeout = float(timeout)
        alive = max(1, math.ceil(self._timeout / 3))
        self._ssh = [
            program, "-F", "none", "-x", "-T", "-p", str(port), "-l", username,
            "-i", key_filename, "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
            "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "UpdateHostKeys=no", "-o", "CheckHostIP=no", "-o", "PasswordAuthentication=no",
            "-o", "KbdInteractiveAuthentication=no", "-o", "GSSAPIAuthentication=no",
            "-o", "ClearAllForwardings=yes", "-o", "Compression=no", "-o", "LogLevel=ERROR",
            "-o", f"ConnectTimeout={max(1, math.ceil(self._timeout))}",
            "-o", f"ServerAliveInterval={alive}", "-o", "ServerAliveCountMax=3",
            "-o", f"Ciphers={ciphers}",
        ]
        self._host = host
        self._lock = threading.Lock()
        self._idle: list[SftpChannel] = []
        self._made: set[str] = set()  # remote directories known to exist
        self._local: dict[tuple[str, str], str] = {}  # sha256 of what put_file sent
        self._hasher = (ServerHasher(self._spawn_hasher, timeout=self._timeout) if remote_hash else None)
        self._idle.append(self._open_channel())  # proves host key and login now

    # -- sessions -------------------------------------------------------------

    def _open_channel(self) -> SftpChannel:
        return SftpChannel([*self._ssh, "-s", "--", self._host, "sftp"], timeout=self._timeout)

    def _spawn_hasher(self) -> subprocess.Popen[bytes]:
        return subprocess.Popen([*self._ssh, "--", self._host, hasher_command(self._base)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                start_new_session=True)

    @contextlib.contextmanager
    def _channel(self) -> Iterator[SftpChannel]:
        """An idle session of the pool, else a new one (one ssh process each)."""
        with self._lock:
            channel = self._idle.pop() if self._idle else None
        if channel is None:
            channel = self._open_channel()
        try:
            yield channel
        except (OSError, ValueError, EOFError) as exc:
            if not isinstance(exc, FileNotFoundError | PermissionError):
                channel.close()  # its state (a half-done request) is unknown
                raise
            self._release(channel)
            raise
        except BaseException:
            channel.close()
            raise
        self._release(channel)

    def _release(self, channel: SftpChannel) -> None:
        with self._lock:
            self._idle.append(channel)

    def _dir(self, replica: str) -> str:
        check_name(replica)
        return posixpath.join(self._base, replica)

    def _makedirs(self, channel: SftpChannel, path: str) -> None:
        if path in self._made:
            return
        current = ""
        for part in path.strip("/").split("/"):
            current += "/" + part
            if current in self._made:
                continue
            try:
                channel.stat(current)
            except FileNotFoundError:
                with contextlib.suppress(OSError):  # another thread may have made it
                    channel.mkdir(current)
            with self._lock:
                self._made.add(current)

    # -- ReplicationTarget ------------------------------------------------------

    def stat_files(self, replica: str) -> dict[str, RemoteFile]:
        found: dict[str, RemoteFile] = {}
        stack = [("", self._dir(replica))]
        with self._channel() as channel:
            while stack:
                prefix, path = stack.pop()
                try:
                    entries = channel.listdir(path)
                except FileNotFoundError:
                    continue
                for entry, attrs in entries:
                    rel = prefix + entry
                    if stat.S_ISDIR(attrs.mode or 0):
                        stack.append((rel + "/", path + "/" + entry))
                    elif rel.endswith(PART):
                        key = rel[: -len(PART)]
                        found[key] = RemoteFile(found.get(key, RemoteFile()).size, attrs.size or 0)
                    elif rel != RECORD:
                        found[rel] = RemoteFile(attrs.size or 0, found.get(rel, RemoteFile()).partial)
        return found

    def put_file(self, local_path: str, replica: str, rel: str, size: int, offset: int,
                 on_chunk: Callable[[int], None]) -> int:
        check_name(replica, rel)
        final = posixpath.join(self._dir(replica), rel)
        part = final + PART
        digest = hashlib.sha256()
        fd = os.open(local_path, os.O_RDONLY)
        try:
            left = offset
            while left > 0 and (block := os.read(fd, min(4 << 20, left))):  # the part already there
                digest.update(block)
                left -= len(block)
            with self._channel() as channel:
                self._makedirs(channel, posixpath.dirname(final))
                handle = channel.open(part, O_WRITE | O_CREAT | (0 if offset else O_TRUNC))
                try:
                    if offset:
                        channel.truncate(handle, offset, part)
                    sent = channel.write_from(handle, fd, offset, part, on_chunk, digest.update)
                finally:
                    channel.close_handle(handle, part)
                channel.rename(part, final)
        finally:
            os.close(fd)
        with self._lock:
            self._local[(replica, rel)] = digest.hexdigest()
        if self._hasher is not None:
            self._hasher.submit(f"{replica}/{rel}", offset + sent)
        return sent

    def sent_sha256(self, replica: str, rels: Sequence[str]) -> dict[str, str]:
        """The server's digests of files this process sent (hashed there as each landed)."""
        with self._lock:
            local = {r: d for r in rels if (d := self._local.pop((replica, r), None)) is not None}
        if self._hasher is None or not local:
            return {}
        found = self._hasher.results([f"{replica}/{r}" for r in local], _HASH_WAIT_S)
        digests = {r: d for r in local if (d := found.get(f"{replica}/{r}")) is not None}
        for r, d in digests.items():
            if d != local[r]:
                log.warning("replication.landed_differs", target=self.name, replica=replica, rel=r)
        return digests

    def sha256_files(self, replica: str, rels: Sequence[str]) -> dict[str, str]:
        """Hash the replica's files on the server (``remote_hash``; needs a shell there)."""
        if self._hasher is None:
            return {}
        for r in rels:
            check_name(replica, r)
            self._hasher.submit(f"{replica}/{r}", None)
        found = self._hasher.results([f"{replica}/{r}" for r in rels], _HASH_WAIT_S)
        return {r: d for r in rels if (d := found.get(f"{replica}/{r}")) is not None}

    def read_file(self, replica: str, rel: str) -> Iterator[bytes]:
        check_name(replica, rel)
        with self._channel() as channel:
            yield from channel.read_iter(posixpath.join(self._dir(replica), rel))

    def put_record(self, replica: str, data: bytes) -> None:
        target = posixpath.join(self._dir(replica), RECORD)
        with self._channel() as channel:
            self._makedirs(channel, self._dir(replica))
            channel.put_bytes(target + ".tmp", data)
            channel.rename(target + ".tmp", target)

    def get_record(self, replica: str) -> bytes | None:
        with self._channel() as channel:
            try:
                return channel.get_bytes(posixpath.join(self._dir(replica), RECORD))
            except FileNotFoundError:
                return None

    def delete_record(self, replica: str) -> None:
        with self._channel() as channel, contextlib.suppress(FileNotFoundError):
            channel.remove(posixpath.join(self._dir(replica), RECORD))

    def list_replicas(self) -> list[str]:
        out = []
        with self._channel() as channel:
            try:
                entries = channel.listdir(self._base)
            except FileNotFoundError:
                return []
            for entry, _attrs in entries:
                try:
                    channel.stat(posixpath.join(self._base, entry, RECORD))
                except (FileNotFoundError, NotADirectoryError):
                    continue
                out.append(entry)
        return sorted(out)

    def list_all(self) -> list[str]:
        with self._channel() as channel:
            try:
                entries = channel.listdir(self._base)
            except FileNotFoundError:
                return []
        return sorted(e for e, attrs in entries if stat.S_ISDIR(attrs.mode or 0))

    def delete_replica(self, replica: str) -> None:
        self.delete_record(replica)
        base = self._dir(replica)
        dirs = [base]
        stack = [base]
        with self._channel() as channel:
            while stack:
                path = stack.pop()
                try:
                    entries = channel.listdir(path)
                except FileNotFoundError:
                    continue
                for entry, attrs in entries:
                    child = path + "/" + entry
                    if stat.S_ISDIR(attrs.mode or 0):
                        dirs.append(child)
                        stack.append(child)
                    else:
                        channel.remove(child)
            for d in reversed(dirs):
                with contextlib.suppress(OSError):
                    channel.rmdir(d)
        with self._lock:
            self._made = {d for d in self._made if d != base and not d.startswith(base + "/")}
            self._local = {k: v for k, v in self._local.items() if k[0] != replica}

    def close(self) -> None:
        if self._hasher is not None:
            self._hasher.close()
        with self._lock:
            idle, self._idle = self._idle, []
        for channel in idle:
            channel.close()
