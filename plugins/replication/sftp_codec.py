"""The SFTP version 3 wire format: packet types, flags, and parsing of replies (pure functions)."""

from __future__ import annotations

import errno
import struct
from dataclasses import dataclass

INIT, VERSION, OPEN, CLOSE, READ, WRITE = 1, 2, 3, 4, 5, 6
FSETSTAT, OPENDIR, READDIR, REMOVE, MKDIR, RMDIR, STAT, RENAME = 10, 11, 12, 13, 14, 15, 17, 18
EXTENDED = 200
STATUS, HANDLE, DATA, NAME, ATTRS, EXTENDED_REPLY = 101, 102, 103, 104, 105, 201
OK, EOF, NO_SUCH_FILE, PERMISSION_DENIED = 0, 1, 2, 3
ATTR_SIZE, ATTR_UIDGID, ATTR_PERMISSIONS, ATTR_ACMODTIME, ATTR_EXTENDED = 1, 2, 4, 8, 0x80000000
O_READ, O_WRITE, O_CREAT, O_TRUNC = 0x01, 0x02, 0x08, 0x10
MAX_REPLY = 1 << 24  # a reply longer than this is a broken stream, not data
SPEC_MIN_IO = 32768  # every server must take reads and writes this large
IO_CAP = 255 << 10  # OpenSSH's sftp-server takes packets up to 256 KiB; leave room for the header


@dataclass(frozen=True, slots=True)
class Attrs:
    """The parts of a file's SFTP attributes the targets use."""

    size: int | None
    mode: int | None


def u32(data: bytes, pos: int) -> tuple[int, int]:
    return struct.unpack_from(">I", data, pos)[0], pos + 4


def string(data: bytes, pos: int) -> tuple[bytes, int]:
    n, pos = u32(data, pos)
    if pos + n > len(data):
        raise ConnectionError("truncated SFTP reply")
    return data[pos:pos + n], pos + n


def attrs(data: bytes, pos: int) -> tuple[Attrs, int]:
    flags, pos = u32(data, pos)
    size = mode = None
    if flags & ATTR_SIZE:
        size = struct.unpack_from(">Q", data, pos)[0]
        pos += 8
    if flags & ATTR_UIDGID:
        pos += 8
    if flags & ATTR_PERMISSIONS:
        mode, pos = u32(data, pos)
    if flags & ATTR_ACMODTIME:
        pos += 8
    if flags & ATTR_EXTENDED:
        count, pos = u32(data, pos)
        for _ in range(count * 2):
            _, pos = string(data, pos)
    return Attrs(size, mode), pos


def pack_string(value: bytes | str) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return struct.pack(">I", len(raw)) + raw


def status_error(code: int, message: str, path: str) -> OSError:
    """The OSError an SFTP status stands for (FileNotFoundError, PermissionError...)."""
    what = f"{path}: {message or f'SFTP status {code}'}"
    if code == NO_SUCH_FILE:
        return FileNotFoundError(errno.ENOENT, what)
    if code == PERMISSION_DENIED:
        return PermissionError(errno.EACCES, what)
    return OSError(errno.EIO, what)
