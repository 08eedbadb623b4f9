"""Hashing replica files on the SSH server as they land, in parallel with the next transfer.

One long-lived ``ssh HOST sh -c LOOP`` per target reads batches of names on its
stdin (data, never code: the loop passes them to the hasher as ``"$@"``) and
prints one ``<sha256> *<name>`` line per file, then a marker line. It uses
``openssl dgst -sha256 -r`` where the server has it (SHA-NI, ~1.7 GB/s per core
here) and coreutils ``sha256sum -b`` otherwise (~0.36 GB/s here): on a server
whose CPU is the bottleneck that is 4-5x less work for the same digest. Names
that ``sha256sum`` would escape (backslash, newline) are never sent: those
files get verified by reading them back.
"""

from __future__ import annotations

import contextlib
import os
import select
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

import structlog

log = structlog.get_logger(__name__)

_BATCH = 200  # names per hashing command (bounds the server's argv)
_BATCH_BYTES = 64 << 20  # ... or this many bytes queued: small files are hashed many per command
_LINGER_S = 0.5  # ... or the oldest queued file has waited this long
_GIVE_UP = 2  # failed hashing commands in a row before the rest is left to read-back
_DONE = "b300-batch-done"
_SLOWEST = 10 << 20  # bytes/s: a server hashing slower than this for a whole batch is taken as stuck
_UNKNOWN_SIZE_S = 600.0  # seconds allowed per file of unknown size
_LOOP = (
    'cd -- "$1" || exit 3\n'
    "if command -v openssl >/dev/null 2>&1; then h() { openssl dgst -sha256 -r \"$@\"; }\n"
    'else h() { sha256sum -b -- "$@"; }; fi\n'
    'while IFS= read -r n; do set --\n'
    '  while [ "$n" -gt 0 ]; do IFS= read -r f || exit 4; set -- "$@" "$f"; n=$((n-1)); done\n'
    f'  h "$@" 2>/dev/null; echo {_DONE}\n'
    "done\n"
)


def hashable(rel: str) -> bool:
    """Whether the server-side hasher can report on ``rel`` unambiguously."""
    return "\\" not in rel and "\n" not in rel and "\r" not in rel


def hasher_command(base: str) -> str:
    """The remote command line (for the login shell) running the hashing loop in ``base``."""
    return f"exec /bin/sh -c {shlex.quote(_LOOP)} b300-hash {shlex.quote(base)}"


class ServerHasher:
    """A queue of files to hash on the server, worked by one thread and one ssh process.

    ``spawn()`` starts the ssh process (stdin/stdout pipes). ``submit`` queues a
    file (``path`` relative to the base, ``size`` to bound the wait);
    ``results`` waits for those named and returns the digests found. A broken
    connection is logged and the queue's files are simply absent from the
    results (the caller reads them back).
    """

    def __init__(self, spawn: Callable[[], subprocess.Popen[bytes]], *, timeout: float) -> None:
        self._spawn = spawn
        self._timeout = timeout
        self._cond = threading.Condition()
        self._queue: list[tuple[str, int | None]] = []
        self._busy: set[str] = set()
        self._done: dict[str, str | None] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._closed = False
        self._waiting = 0  # threads in results()
        self._failures = 0  # hashing commands failed in a row (no shell there?)
        self._since = time.monotonic()  # when the oldest queued file was queued

    def submit(self, path: str, size: int | None) -> None:
        """Queue ``path`` for hashing; ``size`` None when unknown (the wait is then generous)."""
        if not hashable(path):
            return
        with self._cond:
            self._done.pop(path, None)
            if not self._queue:
                self._since = time.monotonic()
            self._queue.append((path, size))
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="sftp-hasher", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def results(self, paths: Sequence[str], wait: float) -> dict[str, str]:
        """Digests of those of ``paths`` submitted before, waiting up to ``wait`` s for them."""
        wanted = [p for p in paths if hashable(p)]
        deadline = time.monotonic() + wait
        with self._cond:
            self._waiting += 1
            self._cond.notify_all()
            try:
                queued = {p for p, _ in self._queue} | self._busy
                while any(p in queued for p in wanted) and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        log.warning("replication.server_hash_slow", waited_s=wait)
                        break
                    self._cond.wait(left)
                    queued = {p for p, _ in self._queue} | self._busy
            finally:
                self._waiting -= 1
            return {p: d for p in wanted if (d := self._done.pop(p, None)) is not None}

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            proc = self._proc
        if proc is not None:
            _end(proc)
        if self._thread is not None:
            self._thread.join(timeout=10)

    # -- the worker -------------------------------------------------------------

    def _take_batch(self) -> list[tuple[str, int | None]] | None:
        """The next batch (under the lock): waits until enough is queued to be worth one hashing
        command (each costs the server a process start, ~2 ms for openssl), someone waits for
        results, or the oldest file has waited :data:`_LINGER_S`. None once closed."""
        while not self._closed:
            if self._queue:
                queued = sum(s or _BATCH_BYTES for _, s in self._queue)
                lingered = time.monotonic() - self._since >= _LINGER_S
                if self._waiting or lingered or queued >= _BATCH_BYTES or len(self._queue) >= _BATCH:
                    batch, self._queue = self._queue[:_BATCH], self._queue[_BATCH:]
                    self._since = time.monotonic()
                    self._busy = {p for p, _ in batch}
                    return batch
                self._cond.wait(max(0.0, _LINGER_S - (time.monotonic() - self._since)))
            else:
                self._cond.wait()
        return None

    def _work(self) -> None:
        while True:
            with self._cond:
                batch = self._take_batch()
            if batch is None:
                return
            found: dict[str, str] = {}
            if self._failures < _GIVE_UP:
                try:
                    found = self._hash(batch)
                    self._failures = 0
                except (OSError, ValueError) as exc:
                    self._failures += 1
                    log.warning("replication.server_hash_failed", error=f"{type(exc).__name__}: {exc}",
                                giving_up=self._failures >= _GIVE_UP)
                    with self._cond:
                        proc, self._proc = self._proc, None
                    if proc is not None:
                        _end(proc)
            with self._cond:
                for p, _ in batch:
                    self._done[p] = found.get(p)
                self._busy = set()
                self._cond.notify_all()

    def _hash(self, batch: list[tuple[str, int | None]]) -> dict[str, str]:
        with self._cond:
            if self._proc is None:
                self._proc = self._spawn()
            proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None
        names = [p for p, _ in batch]
        proc.stdin.write(f"{len(names)}\n".encode() + b"".join(f"./{p}\n".encode() for p in names))
        proc.stdin.flush()
        allowed = self._timeout + sum(_UNKNOWN_SIZE_S if s is None else s / _SLOWEST for _, s in batch)
        deadline = time.monotonic() + allowed
        wanted = set(names)
        found: dict[str, str] = {}
        fd = proc.stdout.fileno()
        pending = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"server hashing of {len(names)} files took longer than {allowed:.0f} s")
            ready, _, _ = select.select([fd], [], [], min(left, 1.0))
            if not ready:
                if proc.poll() is not None:
                    raise ConnectionError(f"hashing ssh exited with {proc.returncode}")
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                raise ConnectionError("hashing ssh closed its output")
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                line = raw.decode("utf-8", "surrogateescape")
                if line == _DONE:
                    return found
                digest, sep, name = line.partition(" *")
                name = name.removeprefix("./")
                if sep and len(digest) == 64 and name in wanted:
                    found[name] = digest.lower()


def _end(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        if proc.stdin is not None:
            proc.stdin.close()
    try:
        proc.wait(timeout=2)
    except subprocess.TimeoutExpired:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    if proc.stdout is not None:
        with contextlib.suppress(OSError):
            proc.stdout.close()
