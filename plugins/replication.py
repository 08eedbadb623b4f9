"""Built-in replication targets (entry-point group ``b300.replication_targets``).

``filesystem`` (another mount: NFS, Lustre...), ``sftp`` (paramiko, host key
checked against a known_hosts file, never trusted on first use) and ``s3``
(boto3, multipart uploads with SHA-256 checksums). Each implements
:class:`b300.interfaces.ReplicationTarget`. Partial copies are kept under
``<rel>.b300part`` on file-like targets so an interrupted copy continues where
it stopped; on S3 an interrupted multipart upload stays open and is continued
part by part.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import errno
import hashlib
import io
import os
import posixpath
import shlex
import shutil
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from b300.interfaces import RemoteFile

_CHUNK = 1 << 20
_BLOCK = 4 << 20  # filesystem target: bytes per copy_file_range call (and per hashing read)
_PART = ".b300part"
_RECORD = ".b300-replica.json"
_SFTP_WINDOW = 64 << 20
_HASH_BATCH = 200  # files per sha256sum command (bounded command line)
_HASH_TIMEOUT_S = 3600.0


def _check_name(replica: str, rel: str = "") -> None:
    """Names come from our own walks, but a target must never be steered outside its base."""
    parts = [replica, *(rel.split("/") if rel else [])]
    if "/" in replica or any(p in ("", ".", "..") or "\x00" in p for p in parts):
        raise ValueError(f"unsafe replica path {replica!r}/{rel!r}")


def _read_chunks(path: str, offset: int, on_chunk: Callable[[int], None]) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        fh.seek(offset)
        while True:
            on_chunk(_CHUNK)
            chunk = fh.read(_CHUNK)
            if not chunk:
                return
            yield chunk


def _syncfs(path: str) -> None:
    """Flush every dirty page of the file system holding ``path`` (one call, not one per file)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if _LIBC is None or _LIBC.syncfs(fd) != 0:
            os.sync()
    finally:
        os.close(fd)


def _load_libc() -> Any:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syncfs  # noqa: B018 - raises AttributeError where there is none
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _load_libc()
_COPY_FALLBACK = (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EBADF, errno.EPERM)


def _copy_hashing(src: int, dst: int, offset: int, digest: Any, on_chunk: Callable[[int], None]) -> int:
    """Copy ``src`` into ``dst`` from ``offset`` on, in large blocks, hashing ``dst`` as it fills.

    Each block goes by ``copy_file_range`` (in the kernel; a reflink where the file
    system offers one), else ``sendfile``, else read+write; the block is then hashed
    from ``dst`` (just written, so from the page cache): the digest is of the bytes
    the target holds, taken during the copy rather than by a second pass.
    """
    buf = bytearray(_BLOCK)
    view = memoryview(buf)
    size = os.fstat(src).st_size
    pos = offset
    mode = 0  # 0 copy_file_range, 1 sendfile, 2 read+write
    while True:
        want = min(_BLOCK, max(size - pos, 0)) or _BLOCK
        on_chunk(want if pos < size else 0)
        n = -1
        if mode == 0:
            try:
                n = os.copy_file_range(src, dst, want, pos, pos)
            except OSError as exc:
                if exc.errno not in _COPY_FALLBACK:
                    raise
                mode = 1
        if mode == 1:
            try:
                os.lseek(dst, pos, os.SEEK_SET)
                n = os.sendfile(dst, src, pos, want)
            except OSError as exc:
                if exc.errno not in _COPY_FALLBACK:
                    raise
                mode = 2
        if mode == 2:
            n = os.preadv(src, [view[:want]], pos)
            done = 0
            while done < n:
                done += os.pwrite(dst, view[done:n], pos + done)
            digest.update(view[:n])
        elif n > 0:
            got = os.preadv(dst, [view[:n]], pos)
            if got != n:
                raise OSError(errno.EIO, f"read back {got} of {n} bytes just copied")
            digest.update(view[:n])
        if n <= 0:
            return pos - offset
        pos += n


class FilesystemTarget:
    """Replicas as directories under ``path`` on a mounted file system.

    Files are copied in large blocks in the kernel (``copy_file_range``) and
    hashed from the target as they are written, so the verification after a
    copy reads nothing a second time (:class:`b300.interfaces.SentDigests`).
    Data reaches stable storage by one ``syncfs`` before the replica record is
    written, not one ``fsync`` per file: a crash before that leaves files the next
    pass does not know digests for, so it reads them back and resends what differs.
    """

    def __init__(self, *, path: str, name: str = "filesystem") -> None:
        self.name = name
        self._base = os.path.abspath(path)
        self._lock = threading.Lock()
        self._made: set[str] = set()
        # (replica, rel) -> (sha256, (size, mtime_ns, inode) of the finished file)
        self._digests: dict[tuple[str, str], tuple[str, tuple[int, int, int]]] = {}

    def _dir(self, replica: str) -> str:
        _check_name(replica)
        return os.path.join(self._base, replica)

    def stat_files(self, replica: str) -> dict[str, RemoteFile]:
        base = self._dir(replica)
        found: dict[str, RemoteFile] = {}
        for dirpath, _dirs, files in os.walk(base):
            for f in files:
                rel = os.path.relpath(os.path.join(dirpath, f), base).replace(os.sep, "/")
                size = os.lstat(os.path.join(dirpath, f)).st_size
                if rel.endswith(_PART):
                    key = rel[: -len(_PART)]
                    found[key] = RemoteFile(found.get(key, RemoteFile()).size, size)
                elif rel != _RECORD:
                    found[rel] = RemoteFile(size, found.get(rel, RemoteFile()).partial)
        return found

    def _makedirs(self, path: str) -> None:
        if path in self._made:
            return
        os.makedirs(path, exist_ok=True)
        with self._lock:
            self._made.add(path)

    def put_file(self, local_path: str, replica: str, rel: str, size: int, offset: int,
                 on_chunk: Callable[[int], None]) -> int:
        _check_name(replica, rel)
        final = os.path.join(self._dir(replica), *rel.split("/"))
        part = final + _PART
        self._makedirs(os.path.dirname(final))
        digest = hashlib.sha256()
        src = os.open(local_path, os.O_RDONLY)
        try:
            dst = os.open(part, os.O_RDWR | os.O_CREAT | (0 if offset else os.O_TRUNC), 0o644)
            try:
                if offset:
                    os.ftruncate(dst, offset)
                    os.lseek(dst, 0, os.SEEK_SET)
                    left = offset
                    while left and (chunk := os.read(dst, min(_BLOCK, left))):
                        digest.update(chunk)
                        left -= len(chunk)
                    if left:
                        raise OSError(errno.EIO, f"partial copy {part} shorter than {offset} bytes")
                sent = _copy_hashing(src, dst, offset, digest, on_chunk)
                st = os.fstat(dst)
            finally:
                os.close(dst)
        finally:
            os.close(src)
        os.replace(part, final)
        with self._lock:
            self._digests[(replica, rel)] = (digest.hexdigest(), (st.st_size, st.st_mtime_ns, st.st_ino))
        return sent

    def sent_sha256(self, replica: str, rels: Sequence[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        for rel in rels:
            with self._lock:
                known = self._digests.pop((replica, rel), None)
            if known is None:
                continue
            try:
                st = os.stat(os.path.join(self._dir(replica), *rel.split("/")))
            except FileNotFoundError:
                continue
            if (st.st_size, st.st_mtime_ns, st.st_ino) == known[1]:
                found[rel] = known[0]
        return found

    def read_file(self, replica: str, rel: str) -> Iterator[bytes]:
        _check_name(replica, rel)
        yield from _read_chunks(os.path.join(self._dir(replica), *rel.split("/")), 0, lambda n: None)

    def put_record(self, replica: str, data: bytes) -> None:
        target = os.path.join(self._dir(replica), _RECORD)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        _syncfs(os.path.dirname(target))  # the files the record vouches for are on disk first
        with open(target + ".tmp", "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(target + ".tmp", target)

    def get_record(self, replica: str) -> bytes | None:
        try:
            with open(os.path.join(self._dir(replica), _RECORD), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None

    def delete_record(self, replica: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self._dir(replica), _RECORD))

    def list_replicas(self) -> list[str]:
        try:
            names = os.listdir(self._base)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if os.path.isfile(os.path.join(self._base, n, _RECORD)))

    def list_all(self) -> list[str]:
        try:
            return sorted(e.name for e in os.scandir(self._base) if e.is_dir(follow_symlinks=False))
        except FileNotFoundError:
            return []

    def delete_replica(self, replica: str) -> None:
        self.delete_record(replica)
        base = self._dir(replica)
        shutil.rmtree(base, ignore_errors=True)
        with self._lock:
            self._made = {d for d in self._made if d != base and not d.startswith(base + os.sep)}
            self._digests = {k: v for k, v in self._digests.items() if k[0] != replica}

    def close(self) -> None:
        pass


class SftpTarget:
    """Replicas under ``path`` on an SSH server, one SFTP session per sending thread.

    The server's host key must be in ``known_hosts`` (an unknown or changed key
    is refused: paramiko's RejectPolicy). Authentication by ``key_filename``.
    """

    def __init__(self, *, host: str, path: str, username: str, key_filename: str, known_hosts: str,
                 port: int = 22, name: str = "sftp", timeout: float = 30.0, remote_hash: bool = True) -> None:
        import paramiko

        self.name = name
        self._base = path.rstrip("/") or "/"
        self._client = paramiko.SSHClient()
        self._client.load_host_keys(known_hosts)
        self._client.set_missing_host_key_policy(paramiko.RejectPolicy())
        self._client.connect(host, port=port, username=username, key_filename=key_filename,
                             timeout=timeout, allow_agent=False, look_for_keys=False)
        self._remote_hash = remote_hash
        self._timeout = timeout
        self._idle: list[Any] = []
        self._made: set[str] = set()  # remote directories known to exist
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _sftp(self) -> Iterator[Any]:
        """An idle SFTP session of the pool (sshd caps sessions per connection, 10 by default)."""
        with self._lock:
            sftp = self._idle.pop() if self._idle else None
        if sftp is None:
            import paramiko

            transport = self._client.get_transport()
            if transport is None:
                raise ConnectionError(f"SSH connection of target {self.name} is closed")
            # A window of 2 MiB (paramiko's default) caps throughput on any real link.
            sftp = paramiko.SFTPClient.from_transport(transport, window_size=_SFTP_WINDOW)
            # A server that stops answering mid-transfer raises after ``timeout`` s without
            # progress instead of stalling the upkeep for good; the next pass resumes.
            sftp.get_channel().settimeout(self._timeout)
        try:
            yield sftp
        except BaseException:
            sftp.close()  # its state (open handles, a half-done request) is unknown
            raise
        with self._lock:
            self._idle.append(sftp)

    def _dir(self, replica: str) -> str:
        _check_name(replica)
        return posixpath.join(self._base, replica)

    def _makedirs(self, sftp: Any, path: str) -> None:
        if path in self._made:
            return
        current = ""
        for part in path.strip("/").split("/"):
            current += "/" + part
            if current in self._made:
                continue
            try:
                sftp.stat(current)
            except FileNotFoundError:
                with contextlib.suppress(OSError):  # another thread may have made it
                    sftp.mkdir(current)
            self._made.add(current)

    def stat_files(self, replica: str) -> dict[str, RemoteFile]:
        found: dict[str, RemoteFile] = {}
        stack = [("", self._dir(replica))]
        with self._sftp() as sftp:
            while stack:
                prefix, path = stack.pop()
                try:
                    entries = sftp.listdir_attr(path)
                except FileNotFoundError:
                    continue
                for a in entries:
                    rel = prefix + a.filename
                    if stat.S_ISDIR(a.st_mode or 0):
                        stack.append((rel + "/", path + "/" + a.filename))
                    elif rel.endswith(_PART):
                        key = rel[: -len(_PART)]
                        found[key] = RemoteFile(found.get(key, RemoteFile()).size, a.st_size or 0)
                    elif rel != _RECORD:
                        found[rel] = RemoteFile(a.st_size or 0, found.get(rel, RemoteFile()).partial)
        return found

    def put_file(self, local_path: str, replica: str, rel: str, size: int, offset: int,
                 on_chunk: Callable[[int], None]) -> int:
        _check_name(replica, rel)
        final = posixpath.join(self._dir(replica), rel)
        part = final + _PART
        sent = 0
        with self._sftp() as sftp:
            self._makedirs(sftp, posixpath.dirname(final))
            with sftp.open(part, "r+" if offset else "w") as out:
                out.set_pipelined(True)
                if offset:
                    out.truncate(offset)
                    out.seek(offset)
                for chunk in _read_chunks(local_path, offset, on_chunk):
                    out.write(chunk)
                    sent += len(chunk)
            sftp.posix_rename(part, final)
        return sent

    def sha256_files(self, replica: str, rels: Sequence[str]) -> dict[str, str]:
        """Hash the replica's files on the server with ``sha256sum`` (when it has a shell).

        Every name is passed through ``shlex.quote``; names ``sha256sum`` must
        escape (backslash, newline) are left out, to be verified by reading back.
        """
        if not self._remote_hash:
            return {}
        base = self._dir(replica)
        found: dict[str, str] = {}
        for i in range(0, len(rels), _HASH_BATCH):
            batch = [r for r in rels[i:i + _HASH_BATCH] if "\\" not in r and "\n" not in r]
            for r in batch:
                _check_name(replica, r)
            if not batch:
                continue
            command = f"cd -- {shlex.quote(base)} && sha256sum -b -- " + " ".join(shlex.quote(r) for r in batch)
            _stdin, stdout, _stderr = self._client.exec_command(command, timeout=_HASH_TIMEOUT_S)
            out = stdout.read().decode("utf-8", "replace")
            if stdout.channel.recv_exit_status() != 0 and not out:
                return found  # no shell or no sha256sum: read back instead
            for line in out.splitlines():
                digest, sep, rel = line.partition(" *")
                if sep and len(digest) == 64 and rel in batch:
                    found[rel] = digest
        return found

    def read_file(self, replica: str, rel: str) -> Iterator[bytes]:
        _check_name(replica, rel)
        with self._sftp() as sftp, sftp.open(posixpath.join(self._dir(replica), rel), "r") as fh:
            fh.prefetch()
            while chunk := fh.read(_CHUNK):
                yield chunk

    def put_record(self, replica: str, data: bytes) -> None:
        target = posixpath.join(self._dir(replica), _RECORD)
        with self._sftp() as sftp:
            self._makedirs(sftp, self._dir(replica))
            sftp.putfo(io.BytesIO(data), target + ".tmp")
            sftp.posix_rename(target + ".tmp", target)

    def get_record(self, replica: str) -> bytes | None:
        buf = io.BytesIO()
        with self._sftp() as sftp:
            try:
                sftp.getfo(posixpath.join(self._dir(replica), _RECORD), buf)
            except FileNotFoundError:
                return None
        return buf.getvalue()

    def delete_record(self, replica: str) -> None:
        with self._sftp() as sftp, contextlib.suppress(FileNotFoundError):
            sftp.remove(posixpath.join(self._dir(replica), _RECORD))

    def list_replicas(self) -> list[str]:
        out = []
        with self._sftp() as sftp:
            try:
                names = sftp.listdir(self._base)
            except FileNotFoundError:
                return []
            for n in names:
                try:
                    sftp.stat(posixpath.join(self._base, n, _RECORD))
                except FileNotFoundError:
                    continue
                out.append(n)
        return sorted(out)

    def list_all(self) -> list[str]:
        with self._sftp() as sftp:
            try:
                attrs = sftp.listdir_attr(self._base)
            except FileNotFoundError:
                return []
        return sorted(a.filename for a in attrs if stat.S_ISDIR(a.st_mode or 0))

    def delete_replica(self, replica: str) -> None:
        self.delete_record(replica)
        base = self._dir(replica)
        dirs = [base]
        stack = [base]
        with self._sftp() as sftp:
            while stack:
                path = stack.pop()
                try:
                    entries = sftp.listdir_attr(path)
                except FileNotFoundError:
                    continue
                for a in entries:
                    child = path + "/" + a.filename
                    if stat.S_ISDIR(a.st_mode or 0):
                        dirs.append(child)
                        stack.append(child)
                    else:
                        sftp.remove(child)
            for d in reversed(dirs):
                with contextlib.suppress(OSError):
                    sftp.rmdir(d)
        with self._lock:
            self._made = {d for d in self._made if d != base and not d.startswith(base + "/")}

    def close(self) -> None:
        with self._lock:
            for sftp in self._idle:
                sftp.close()
            self._idle.clear()
        self._client.close()


class _ThrottledReader(io.RawIOBase):
    """A file read through the bandwidth limit (boto3 reads it in its own threads)."""

    def __init__(self, path: str, on_chunk: Callable[[int], None]) -> None:
        self._fh = open(path, "rb")  # noqa: SIM115 - closed in close()
        self._on_chunk = on_chunk

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._fh.read(size)
        if data:
            self._on_chunk(len(data))
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._fh.close()
        super().close()


class S3Target:
    """Replicas as objects ``<prefix><replica>/<rel>`` in an S3 bucket.

    Large files go up as multipart uploads (``part_size``); every upload
    carries a SHA-256 checksum the server checks. ``endpoint_url`` and the
    credentials options are passed to boto3 as they are.
    """

    def __init__(self, *, bucket: str, prefix: str = "", name: str = "s3", endpoint_url: str | None = None,
                 region_name: str | None = None, aws_access_key_id: str | None = None,
                 aws_secret_access_key: str | None = None, part_size: int = 64 << 20,
                 max_concurrency: int = 4) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig

        self.name = name
        self._bucket = bucket
        self._prefix = prefix
        self._s3 = boto3.client("s3", endpoint_url=endpoint_url, region_name=region_name,
                                aws_access_key_id=aws_access_key_id,
                                aws_secret_access_key=aws_secret_access_key)
        self._transfer = TransferConfig(multipart_threshold=part_size, multipart_chunksize=part_size,
                                        max_concurrency=max_concurrency, use_threads=True)
        self._part_size = part_size
        self._max_concurrency = max(1, max_concurrency)

    def _key(self, replica: str, rel: str) -> str:
        _check_name(replica, rel)
        return f"{self._prefix}{replica}/{rel}"

    def stat_files(self, replica: str) -> dict[str, RemoteFile]:
        _check_name(replica)
        prefix = f"{self._prefix}{replica}/"
        found: dict[str, RemoteFile] = {}
        for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=self._bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(prefix):]
                if rel != _RECORD:
                    found[rel] = RemoteFile(int(obj["Size"]))
        return found

    def put_file(self, local_path: str, replica: str, rel: str, size: int, offset: int,
                 on_chunk: Callable[[int], None]) -> int:
        # An object appears only when its upload completes. A small file is one PUT;
        # a large one a multipart upload that an interruption leaves open on the
        # server, so the next call continues it: the parts already there (same size,
        # ETag = MD5 of the same bytes here) are kept, the rest sent. ``offset``
        # (a file target's notion) is not used.
        key = self._key(replica, rel)
        if size <= self._part_size:
            reader = _ThrottledReader(local_path, on_chunk)
            try:
                self._s3.upload_fileobj(reader, self._bucket, key, ExtraArgs={"ChecksumAlgorithm": "SHA256"},
                                        Config=self._transfer)
            finally:
                reader.close()
            return size
        upload_id, done = self._open_upload(key)
        count = (size + self._part_size - 1) // self._part_size

        def part(number: int) -> tuple[dict[str, Any], int]:
            start = (number - 1) * self._part_size
            length = min(self._part_size, size - start)
            with open(local_path, "rb") as fh:
                fh.seek(start)
                data = fh.read(length)
            have = done.get(number)
            if have is not None and have["Size"] == len(data) and (
                    have["ETag"].strip('"') == hashlib.md5(data, usedforsecurity=False).hexdigest()):
                return {"PartNumber": number, "ETag": have["ETag"]}, 0
            for i in range(0, len(data), _CHUNK):
                on_chunk(min(_CHUNK, len(data) - i))
            digest = base64.b64encode(hashlib.sha256(data).digest()).decode()
            reply = self._s3.upload_part(Bucket=self._bucket, Key=key, UploadId=upload_id, PartNumber=number,
                                         Body=data, ChecksumAlgorithm="SHA256", ChecksumSHA256=digest)
            return {"PartNumber": number, "ETag": reply["ETag"]}, len(data)

        with ThreadPoolExecutor(max_workers=self._max_concurrency) as pool:
            results = list(pool.map(part, range(1, count + 1)))
        self._s3.complete_multipart_upload(Bucket=self._bucket, Key=key, UploadId=upload_id,
                                           MultipartUpload={"Parts": [r[0] for r in results]})
        return sum(r[1] for r in results)

    def _open_upload(self, key: str) -> tuple[str, dict[int, dict[str, Any]]]:
        """The newest unfinished multipart upload of ``key`` with its parts, else a new one;
        older unfinished uploads of the key are aborted (they only cost storage)."""
        listed = self._s3.list_multipart_uploads(Bucket=self._bucket, Prefix=key).get("Uploads", [])
        uploads = [u for u in listed if u["Key"] == key]
        uploads.sort(key=lambda u: u["Initiated"])
        for stale in uploads[:-1]:
            self._s3.abort_multipart_upload(Bucket=self._bucket, Key=key, UploadId=stale["UploadId"])
        if not uploads:
            created = self._s3.create_multipart_upload(Bucket=self._bucket, Key=key, ChecksumAlgorithm="SHA256")
            return str(created["UploadId"]), {}
        upload_id = str(uploads[-1]["UploadId"])
        parts: dict[int, dict[str, Any]] = {}
        marker = 0
        for _ in range(10_000):  # S3 allows at most 10,000 parts
            page = self._s3.list_parts(Bucket=self._bucket, Key=key, UploadId=upload_id,
                                       PartNumberMarker=marker)
            for p in page.get("Parts", []):
                parts[int(p["PartNumber"])] = p
            if not page.get("IsTruncated"):
                break
            marker = int(page["NextPartNumberMarker"])
        return upload_id, parts

    def read_file(self, replica: str, rel: str) -> Iterator[bytes]:
        try:
            body = self._s3.get_object(Bucket=self._bucket, Key=self._key(replica, rel))["Body"]
        except self._s3.exceptions.NoSuchKey:
            raise FileNotFoundError(rel) from None
        try:
            while chunk := body.read(_CHUNK):
                yield chunk
        finally:
            body.close()

    def put_record(self, replica: str, data: bytes) -> None:
        self._s3.put_object(Bucket=self._bucket, Key=self._key(replica, _RECORD), Body=data,
                            ChecksumAlgorithm="SHA256")

    def get_record(self, replica: str) -> bytes | None:
        try:
            body = self._s3.get_object(Bucket=self._bucket, Key=self._key(replica, _RECORD))["Body"]
        except self._s3.exceptions.NoSuchKey:
            return None
        data: bytes = body.read()
        return data

    def delete_record(self, replica: str) -> None:
        self._s3.delete_object(Bucket=self._bucket, Key=self._key(replica, _RECORD))

    def list_replicas(self) -> list[str]:
        return [n for n in self.list_all() if self.get_record(n) is not None]

    def list_all(self) -> list[str]:
        names = []
        paginator = self._s3.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self._bucket, Prefix=self._prefix, Delimiter="/"):
            names += [p["Prefix"][len(self._prefix):].rstrip("/") for p in page.get("CommonPrefixes", [])]
        return sorted(n for n in names if n)

    def delete_replica(self, replica: str) -> None:
        self.delete_record(replica)
        keys = [self._key(replica, rel) for rel in self.stat_files(replica)]
        for i in range(0, len(keys), 1000):
            self._s3.delete_objects(Bucket=self._bucket,
                                    Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]]})

    def close(self) -> None:
        self._s3.close()
