"""Fetching a replica back from its target into a folder, all or nothing.

:func:`fetch_replica` is what ``b300ctl checkpoints restore`` runs. Every file
of the replica's manifest is streamed from the target by ``concurrency``
threads into a temporary folder beside the destination, hashed as it arrives
and compared with the manifest (size and sha256). Only when every file matches
is the manifest written beside them and the folder renamed to the destination,
so a failed, refused or interrupted restore never leaves a partial checkpoint
there; the temporary folder is removed on the way out (after a hard kill its
name, ``.<dest>.b300-restore-*``, says what it is).
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from ..errors import TransferError, UsageError, one_line
from ..interfaces import ReplicationTarget
from .manifest import Manifest, ManifestEntry, write_manifest
from .walk import OWN_FILES

TEMP_MARK = ".b300-restore-"


@dataclass(frozen=True, slots=True)
class FetchedFile:
    """One file that arrived and matched the manifest."""

    rel: str
    size: int
    sha256: str
    seconds: float


@dataclass(frozen=True, slots=True)
class FetchResult:
    """A restored folder: where, how many files and bytes, how long (wall clock)."""

    path: str
    files: int
    bytes: int
    seconds: float


class _Stopped(Exception):
    """Another file failed (or the operator interrupted): stop reading this one."""


def describe(exc: BaseException) -> str:
    """An exception as one line: its type and message (a client library's errors vary)."""
    text = str(exc) or type(exc).__name__
    return one_line(text if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {text}")


def unsafe_rel(rel: str) -> bool:
    """A manifest path that must not be written: absolute, empty or ``.``/``..``/NUL parts, or
    one of b300's own file names (the record comes from the target, which is not trusted)."""
    parts = rel.split("/")
    return (rel.startswith("/") or any(p in ("", ".", "..") or "\x00" in p for p in parts)
            or parts[-1] in OWN_FILES)


def check_destination(dest: str) -> None:
    """Raise UsageError unless ``dest`` is absent or an empty directory (not a symlink)."""
    if os.path.islink(dest):
        raise UsageError(f"{dest} is a symbolic link; give a folder that does not exist or is empty")
    if not os.path.lexists(dest):
        return
    if not os.path.isdir(dest):
        raise UsageError(f"{dest} exists and is not a folder")
    try:
        with os.scandir(dest) as it:
            if any(True for _ in it):
                raise UsageError(f"{dest} is not empty; give a folder that does not exist or is empty")
    except OSError as exc:
        raise UsageError(f"{dest}: {exc.strerror or exc}") from None


def fetch_replica(target: ReplicationTarget, name: str, manifest: Manifest, dest: str, *,
                  concurrency: int = 4, on_file: Callable[[FetchedFile], None] | None = None,
                  clock: Callable[[], float] = time.monotonic) -> FetchResult:
    """Fetch replica ``name`` (whose record's manifest is ``manifest``) into ``dest``, verified.

    ``dest`` must not exist or be an empty folder (UsageError otherwise, also when its
    parent cannot be made); its parent is created if missing. ``on_file`` is called in
    the calling thread for each file that arrived intact. Raises TransferError, naming
    the file, when the target fails, a file is missing there, or its size or sha256
    differs from the manifest; then, as on any other exception (KeyboardInterrupt
    included), nothing is left at ``dest`` and the temporary folder is gone.
    """
    dest = os.path.abspath(dest)
    check_destination(dest)
    bad = [e.rel for e in manifest.files if unsafe_rel(e.rel)]
    if bad:
        raise TransferError(f"replica {name} on {target.name}: its record names an unsafe path {bad[0]!r}")
    parent = os.path.dirname(dest)
    try:
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(dest)}{TEMP_MARK}", dir=parent)
    except OSError as exc:
        raise UsageError(f"cannot write into {parent}: {exc.strerror or exc}") from None
    started = clock()
    try:
        _fetch_all(target, name, manifest.files, tmp, max(1, concurrency), on_file, clock)
        try:
            write_manifest(tmp, manifest)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would hide the checkpoint from the job
            _fsync_dir(tmp)
            os.rename(tmp, dest)  # replaces an empty folder; refuses one that filled up since
            _fsync_dir(parent)
        except OSError as exc:
            if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise UsageError(f"{dest} appeared or filled up during the restore; "
                                 "nothing written there") from None
            raise TransferError(f"finishing {dest} failed: {exc.strerror or exc}") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return FetchResult(dest, len(manifest.files), manifest.size_bytes, clock() - started)


def _fetch_all(target: ReplicationTarget, name: str, entries: Sequence[ManifestEntry], tmp: str,
               concurrency: int, on_file: Callable[[FetchedFile], None] | None,
               clock: Callable[[], float]) -> None:
    stop = threading.Event()
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="restore")
    try:
        # Largest first keeps the threads busy to the end.
        todo = sorted(entries, key=lambda e: e.size, reverse=True)
        pending: set[Future[FetchedFile]] = {
            pool.submit(_fetch_one, target, name, e, tmp, stop, clock) for e in todo}
        while pending:
            done, pending = wait(pending, return_when=FIRST_EXCEPTION)
            for future in done:
                error = future.exception()
                if error is not None:
                    raise error
                if on_file is not None:
                    on_file(future.result())
    finally:
        stop.set()  # the other threads stop at their next chunk
        pool.shutdown(wait=True, cancel_futures=True)


def _fetch_one(target: ReplicationTarget, name: str, entry: ManifestEntry, tmp: str,
               stop: threading.Event, clock: Callable[[], float]) -> FetchedFile:
    if stop.is_set():
        raise _Stopped
    started = clock()
    out = os.path.join(tmp, *entry.rel.split("/"))
    where = f"{entry.rel!r} of {name} on {target.name}"
    digest = hashlib.sha256()
    size = 0
    try:
        os.makedirs(os.path.dirname(out), exist_ok=True)
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise TransferError(f"cannot write {entry.rel!r} under {tmp}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "wb") as fh:
        try:
            chunks = target.read_file(name, entry.rel)
            try:
                for chunk in chunks:
                    if stop.is_set():
                        raise _Stopped
                    size += len(chunk)
                    if size > entry.size:
                        break  # longer than recorded: reported below, without reading the rest
                    digest.update(chunk)
                    fh.write(chunk)
            finally:
                _close(chunks)  # a generator left early releases its connection now, not at GC
            fh.flush()
            os.fsync(fh.fileno())
        except (_Stopped, TransferError):
            raise
        except FileNotFoundError:
            raise TransferError(f"{where} is missing (the replica is damaged)") from None
        except Exception as exc:  # the target's client library may raise anything (socket, botocore)
            raise TransferError(f"reading {where} failed: {describe(exc)}") from None
    if size != entry.size:
        got = f"more than {entry.size}" if size > entry.size else str(size)
        raise TransferError(f"{where}: {got} bytes arrived, the manifest says {entry.size}; "
                            "refused, nothing restored")
    if digest.hexdigest() != entry.sha256:
        raise TransferError(f"{where} does not match its sha256 in the manifest; refused, nothing restored")
    return FetchedFile(entry.rel, size, entry.sha256, clock() - started)


def _close(chunks: Iterator[bytes]) -> None:
    close = getattr(chunks, "close", None)
    if close is not None:
        close()


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
