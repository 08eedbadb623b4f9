"""The ``filesystem`` replication target: replicas as directories on another mount.

Each file is copied in large blocks inside the kernel (``copy_file_range``, else
``sendfile``, else read+write) and hashed from the target as each block lands,
so verification after the copy reads nothing a second time; one ``syncfs``
makes the copies durable before the replica record is written.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import os
import shutil
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from b300.interfaces import RemoteFile

from .common import PART, RECORD, check_name, read_chunks

_BLOCK = 4 << 20  # bytes per copy_file_range call (and per hashing read)


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


def _copy_hashing(src: int, dst: int, offset: int, digest: Any, on_chunk: Callable[[int], None],
                  view: memoryview) -> int:
    """Copy ``src`` into ``dst`` from ``offset`` on, in large blocks, hashing ``dst`` as it fills.

    Each block goes by ``copy_file_range`` (in the kernel; a reflink where the file
    system offers one), else ``sendfile``, else read+write; the block is then hashed
    from ``dst`` (just written, so from the page cache): the digest is of the bytes
    the target holds, taken during the copy rather than by a second pass.
    ``view`` is a buffer of :data:`_BLOCK` bytes, reused across files: a fresh
    4 MiB buffer per file cost the kernel 4 GiB of zero-filled page faults for a
    checkpoint of 1,000 small files (measured: sys time 2.5-3.6 s vs cp's 1.5-2).
    """
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
        self._buffers = threading.local()  # one copy buffer per sending thread

    def _buffer(self) -> memoryview:
        view: memoryview | None = getattr(self._buffers, "view", None)
        if view is None:
            view = self._buffers.view = memoryview(bytearray(_BLOCK))
        return view

    def _dir(self, replica: str) -> str:
        check_name(replica)
        return os.path.join(self._base, replica)

    def stat_files(self, replica: str) -> dict[str, RemoteFile]:
        base = self._dir(replica)
        found: dict[str, RemoteFile] = {}
        for dirpath, _dirs, files in os.walk(base):
            for f in files:
                rel = os.path.relpath(os.path.join(dirpath, f), base).replace(os.sep, "/")
                size = os.lstat(os.path.join(dirpath, f)).st_size
                if rel.endswith(PART):
                    key = rel[: -len(PART)]
                    found[key] = RemoteFile(found.get(key, RemoteFile()).size, size)
                elif rel != RECORD:
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
        check_name(replica, rel)
        final = os.path.join(self._dir(replica), *rel.split("/"))
        part = final + PART
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
                sent = _copy_hashing(src, dst, offset, digest, on_chunk, self._buffer())
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
        check_name(replica, rel)
        yield from read_chunks(os.path.join(self._dir(replica), *rel.split("/")), 0, lambda n: None)

    def put_record(self, replica: str, data: bytes) -> None:
        target = os.path.join(self._dir(replica), RECORD)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        _syncfs(os.path.dirname(target))  # the files the record vouches for are on disk first
        with open(target + ".tmp", "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(target + ".tmp", target)

    def get_record(self, replica: str) -> bytes | None:
        try:
            with open(os.path.join(self._dir(replica), RECORD), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None

    def delete_record(self, replica: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(self._dir(replica), RECORD))

    def list_replicas(self) -> list[str]:
        try:
            names = os.listdir(self._base)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if os.path.isfile(os.path.join(self._base, n, RECORD)))

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
