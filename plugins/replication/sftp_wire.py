"""An SFTP (version 3) client speaking over the pipes of an OpenSSH ``ssh -s ... sftp`` process.

OpenSSH does the transport (cipher, MAC, host key check, keepalives) in C in its
own process; this module only frames SFTP requests, so the Python side costs a
header per 255 KiB write. Writes and reads are pipelined (``depth`` requests in
flight, never drained to zero between chunks). A reader thread takes every
reply off the pipe as it comes, so the server is never stalled by us; a
server that stops answering raises :class:`TimeoutError` after ``timeout``
seconds and the ``ssh`` process is killed.

Every ``path`` here is passed to the server as data, never through a shell.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import struct
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from . import sftp_codec as sc
from .sftp_codec import Attrs, attrs, pack_string, status_error, string, u32


class SftpChannel:
    """One SFTP session in one ``ssh`` process; used by one thread at a time.

    ``argv`` is the whole ``ssh`` command line (ending in ``-s HOST sftp`` or
    equivalent). Raises ConnectionError (with ssh's own last message, e.g.
    "Host key verification failed.") when the session cannot be opened.
    """

    def __init__(self, argv: Sequence[str], *, timeout: float, depth: int = 16) -> None:
        self._timeout = timeout
        self._depth = depth
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self._proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=self._stderr, bufsize=0, start_new_session=True)
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._out = self._proc.stdin.fileno()
        os.set_blocking(self._out, False)
        for fd in (self._out, self._proc.stdout.fileno()):
            with contextlib.suppress(OSError):  # fewer wake-ups per MiB; the default 64 KiB also works
                fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, 1 << 20)
        self._replies: dict[int, tuple[int, bytes]] = {}
        self._version: bytes | None = None
        self._broken: BaseException | None = None
        self._cond = threading.Condition()
        self._next_id = 0
        self._send_buffer: memoryview | None = None
        self._reader = threading.Thread(target=self._read_loop, args=(self._proc.stdout.fileno(),),
                                        name="sftp-reader", daemon=True)
        self._reader.start()
        try:
            self._send([struct.pack(">IBI", 5, sc.INIT, 3)])
            version = self._wait_version()
            self.extensions = self._parse_extensions(version)
            self.write_size = self.read_size = sc.SPEC_MIN_IO
            if b"limits@openssh.com" in self.extensions:
                t, body = self._call(sc.EXTENDED, pack_string("limits@openssh.com"))
                if t == sc.EXTENDED_REPLY and len(body) >= 32:
                    _packet, rmax, wmax, _handles = struct.unpack_from(">QQQQ", body, 0)
                    self.read_size = max(sc.SPEC_MIN_IO, min(sc.IO_CAP, rmax or sc.IO_CAP))
                    self.write_size = max(sc.SPEC_MIN_IO, min(sc.IO_CAP, wmax or sc.IO_CAP))
        except BaseException:
            self.close()
            raise

    # -- the pipe -------------------------------------------------------------

    def _read_loop(self, fd: int) -> None:
        buf = bytearray()
        try:
            while True:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise ConnectionError(self._ssh_said("the SSH connection closed"))
                buf += chunk
                while len(buf) >= 4:
                    n = struct.unpack_from(">I", buf, 0)[0]
                    if n < 1 or n > sc.MAX_REPLY:
                        raise ConnectionError(f"malformed SFTP stream (packet of {n} bytes)")
                    if len(buf) < 4 + n:
                        break
                    body = bytes(buf[4:4 + n])
                    del buf[:4 + n]
                    with self._cond:
                        if body[0] == sc.VERSION:
                            self._version = body[1:]
                        else:
                            rid = struct.unpack_from(">I", body, 1)[0]
                            self._replies[rid] = (body[0], body[5:])
                        self._cond.notify_all()
        except BaseException as exc:
            with self._cond:
                self._broken = exc
                self._cond.notify_all()

    def _ssh_said(self, default: str) -> str:
        """ssh's last line on stderr (e.g. "Host key verification failed."), else ``default``."""
        with contextlib.suppress(OSError, ValueError):
            self._proc.wait(timeout=2)
            self._stderr.seek(0)
            lines = [ln.strip() for ln in self._stderr.read()[-4096:].decode("utf-8", "replace").splitlines()]
            lines = [ln for ln in lines if ln]
            if lines:
                return f"ssh: {lines[-1]}"
            if self._proc.returncode is not None:
                return f"{default} (ssh exited with {self._proc.returncode})"
        return default

    def _send(self, parts: Sequence[bytes | memoryview]) -> None:
        """Write all of ``parts`` to ssh's stdin; TimeoutError when it takes nothing for ``timeout``."""
        views = [memoryview(p) for p in parts]
        deadline = time.monotonic() + self._timeout
        while views:
            try:
                n = os.writev(self._out, views)
            except BlockingIOError:
                n = 0
            except BrokenPipeError:
                self._fail(ConnectionError(self._ssh_said("the SSH connection closed")))
            if n:
                deadline = time.monotonic() + self._timeout
                while views and n >= len(views[0]):
                    n -= len(views.pop(0))
                if views and n:
                    views[0] = views[0][n:]
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                self._fail(TimeoutError(f"SFTP server took no data for {self._timeout:g} s"))
            select.select([], [self._out], [], min(left, 1.0))
            self._check_alive()

    def _check_alive(self) -> None:
        with self._cond:
            broken = self._broken
        if broken is not None:
            self._fail(broken)

    def _fail(self, exc: BaseException) -> Any:
        self.kill()
        if isinstance(exc, OSError):
            raise exc
        raise ConnectionError(str(exc)) from exc

    def _wait_version(self) -> bytes:
        deadline = time.monotonic() + self._timeout
        with self._cond:
            while self._version is None:
                if self._broken is not None:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            version, broken = self._version, self._broken
        if version is None:
            self._fail(broken or TimeoutError(f"no SFTP greeting within {self._timeout:g} s"))
        assert version is not None
        return version

    @staticmethod
    def _parse_extensions(version: bytes) -> dict[bytes, bytes]:
        found: dict[bytes, bytes] = {}
        pos = 4
        while pos < len(version):
            name, pos = string(version, pos)
            data, pos = string(version, pos)
            found[name] = data
        return found

    def _request(self, kind: int, parts: Sequence[bytes | memoryview]) -> int:
        self._next_id = (self._next_id + 1) & 0xFFFFFFFF
        rid = self._next_id
        length = 5 + sum(len(p) for p in parts)
        self._send([struct.pack(">IBI", length, kind, rid), *parts])
        return rid

    def _wait(self, rid: int) -> tuple[int, bytes]:
        deadline = time.monotonic() + self._timeout
        with self._cond:
            while rid not in self._replies:
                if self._broken is not None:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            reply = self._replies.pop(rid, None)
            broken = self._broken
        if reply is None:
            self._fail(broken or TimeoutError(f"SFTP server did not answer within {self._timeout:g} s"))
        assert reply is not None
        return reply

    def _call(self, kind: int, *parts: bytes | memoryview) -> tuple[int, bytes]:
        return self._wait(self._request(kind, parts))

    def _check(self, reply: tuple[int, bytes], path: str) -> None:
        t, body = reply
        if t != sc.STATUS:
            raise ConnectionError(f"unexpected SFTP reply {t} for {path}")
        code, pos = u32(body, 0)
        if code != sc.OK:
            message, _ = string(body, pos) if len(body) > pos else (b"", pos)
            raise status_error(code, message.decode("utf-8", "replace"), path)

    def _handle(self, reply: tuple[int, bytes], path: str) -> bytes:
        if reply[0] == sc.HANDLE:
            return string(reply[1], 0)[0]
        self._check(reply, path)
        raise ConnectionError(f"no handle for {path}")

    # -- operations -----------------------------------------------------------

    def stat(self, path: str) -> Attrs:
        """The attributes of ``path`` (following symlinks); FileNotFoundError if absent."""
        reply = self._call(sc.STAT, pack_string(path))
        if reply[0] == sc.ATTRS:
            return attrs(reply[1], 0)[0]
        self._check(reply, path)
        raise ConnectionError(f"no attributes for {path}")

    def mkdir(self, path: str) -> None:
        self._check(self._call(sc.MKDIR, pack_string(path), struct.pack(">I", 0)), path)

    def rmdir(self, path: str) -> None:
        self._check(self._call(sc.RMDIR, pack_string(path)), path)

    def remove(self, path: str) -> None:
        self._check(self._call(sc.REMOVE, pack_string(path)), path)

    def rename(self, old: str, new: str) -> None:
        """Rename ``old`` over ``new`` (POSIX semantics where the server offers them)."""
        if b"posix-rename@openssh.com" in self.extensions:
            ext = pack_string("posix-rename@openssh.com")
            self._check(self._call(sc.EXTENDED, ext, pack_string(old), pack_string(new)), new)
            return
        with contextlib.suppress(FileNotFoundError):
            self.remove(new)
        self._check(self._call(sc.RENAME, pack_string(old), pack_string(new)), new)

    def listdir(self, path: str) -> list[tuple[str, Attrs]]:
        """Every entry of the directory but ``.`` and ``..``; FileNotFoundError if absent."""
        handle = self._handle(self._call(sc.OPENDIR, pack_string(path)), path)
        found: list[tuple[str, Attrs]] = []
        try:
            for _ in range(1 << 24):  # bounded: a server that never says sc.EOF is broken
                t, body = self._call(sc.READDIR, pack_string(handle))
                if t == sc.STATUS and u32(body, 0)[0] == sc.EOF:
                    break
                if t != sc.NAME:
                    self._check((t, body), path)
                count, pos = u32(body, 0)
                for _ in range(count):
                    name, pos = string(body, pos)
                    _long, pos = string(body, pos)
                    entry, pos = attrs(body, pos)
                    if name not in (b".", b".."):
                        found.append((name.decode("utf-8", "surrogateescape"), entry))
        finally:
            self.close_handle(handle, path)
        return found

    def open(self, path: str, flags: int) -> bytes:
        return self._handle(self._call(sc.OPEN, pack_string(path), struct.pack(">II", flags, 0)), path)

    def close_handle(self, handle: bytes, path: str) -> None:
        self._check(self._call(sc.CLOSE, pack_string(handle)), path)

    def truncate(self, handle: bytes, size: int, path: str) -> None:
        self._check(self._call(sc.FSETSTAT, pack_string(handle), struct.pack(">IQ", sc.ATTR_SIZE, size)), path)

    def write_from(self, handle: bytes, fd: int, offset: int, path: str, on_chunk: Callable[[int], None],
                   on_data: Callable[[memoryview], None]) -> int:
        """Send local ``fd`` from ``offset`` to its end into the open ``handle``, pipelined.

        ``on_chunk(n)`` runs before each request (the bandwidth limit), ``on_data``
        with each block read (hashing while sending). Returns the bytes sent.
        """
        view = self._buffer()
        hs = pack_string(handle)
        pending: deque[int] = deque()
        pos = offset
        size = os.fstat(fd).st_size
        while True:
            on_chunk(min(len(view), max(size - pos, 0)))  # the bytes about to go, not the buffer's size
            n = os.preadv(fd, [view], pos)
            if n <= 0:
                break
            on_data(view[:n])
            pending.append(self._request(sc.WRITE, [hs, struct.pack(">QI", pos, n), view[:n]]))
            pos += n
            while len(pending) >= self._depth:
                self._check(self._wait(pending.popleft()), path)
        while pending:
            self._check(self._wait(pending.popleft()), path)
        return pos - offset

    def _buffer(self) -> memoryview:
        """The session's send buffer, made once (one per file cost a page-faulting allocation each)."""
        if self._send_buffer is None:
            self._send_buffer = memoryview(bytearray(self.write_size))
        return self._send_buffer

    def read_iter(self, path: str) -> Iterator[bytes]:
        """The file's bytes in order, ``depth`` reads in flight."""
        handle = self.open(path, sc.O_READ)
        pending: deque[tuple[int, int]] = deque()
        pos = 0
        eof = False
        try:
            while not eof or pending:
                while not eof and len(pending) < self._depth:
                    ask = struct.pack(">QI", pos, self.read_size)
                    pending.append((pos, self._request(sc.READ, [pack_string(handle), ask])))
                    pos += self.read_size
                at, rid = pending.popleft()
                t, body = self._wait(rid)
                if t == sc.STATUS and u32(body, 0)[0] == sc.EOF:
                    eof = True
                    continue
                if t != sc.DATA:
                    self._check((t, body), path)
                data, _ = string(body, 0)
                if len(data) < self.read_size:
                    # A short read: ask again from where it stopped (drop what is in flight).
                    for _at, other in pending:
                        self._wait(other)
                    pending.clear()
                    pos = at + len(data)
                    eof = not data
                if data:
                    yield data
        finally:
            for _at, other in pending:
                with contextlib.suppress(OSError):
                    self._wait(other)
            with contextlib.suppress(OSError):
                self.close_handle(handle, path)

    def put_bytes(self, path: str, data: bytes) -> None:
        handle = self.open(path, sc.O_WRITE | sc.O_CREAT | sc.O_TRUNC)
        try:
            for i in range(0, len(data), self.write_size):
                block = data[i:i + self.write_size]
                at = struct.pack(">QI", i, len(block))
                self._check(self._call(sc.WRITE, pack_string(handle), at, block), path)
        finally:
            self.close_handle(handle, path)

    def get_bytes(self, path: str) -> bytes:
        return b"".join(self.read_iter(path))

    # -- lifetime -------------------------------------------------------------

    def kill(self) -> None:
        """End the ssh process at once (its state is unknown after an error)."""
        with contextlib.suppress(ProcessLookupError):
            self._proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(timeout=5)

    def close(self) -> None:
        """End the session: close ssh's stdin, give it a moment to leave, else kill it."""
        if self._proc.stdin is not None:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=min(self._timeout, 5.0))
        except subprocess.TimeoutExpired:
            self.kill()
        self._reader.join(timeout=5)  # ssh has gone: its stdout is at sc.EOF
        if self._proc.stdout is not None:
            with contextlib.suppress(OSError):
                self._proc.stdout.close()
        self._stderr.close()
