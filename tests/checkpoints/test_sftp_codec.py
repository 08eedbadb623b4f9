"""The SFTP wire format's pure parts: attributes, strings, status codes, names the server hasher takes."""

from __future__ import annotations

import struct

import pytest

from b300.plugins.replication.sftp_codec import (
    ATTR_PERMISSIONS,
    ATTR_SIZE,
    Attrs,
    attrs,
    pack_string,
    status_error,
    string,
)
from b300.plugins.replication.sftp_hash import hashable, hasher_command


def test_attributes_are_read_whatever_else_the_server_sends() -> None:
    ext = 0x80000000
    raw = (struct.pack(">IQ", ATTR_SIZE | 2 | ATTR_PERMISSIONS | 8 | ext, 5 << 30) + struct.pack(">II", 0, 0)
           + struct.pack(">I", 0o100644) + struct.pack(">II", 1, 2)
           + struct.pack(">I", 1) + pack_string("k") + pack_string("v") + b"rest")
    got, pos = attrs(raw, 0)
    assert got == Attrs(size=5 << 30, mode=0o100644)
    assert raw[pos:] == b"rest"
    assert attrs(struct.pack(">I", 0), 0) == (Attrs(None, None), 4)


def test_a_string_longer_than_the_reply_is_a_broken_stream() -> None:
    assert string(pack_string("abc") + b"x", 0) == (b"abc", 7)
    with pytest.raises(ConnectionError):
        string(struct.pack(">I", 10) + b"abc", 0)


def test_status_codes_become_the_oserrors_callers_catch() -> None:
    assert isinstance(status_error(2, "No such file", "/a"), FileNotFoundError)
    assert isinstance(status_error(3, "Permission denied", "/a"), PermissionError)
    other = status_error(4, "", "/a")
    assert type(other) is OSError and "/a: SFTP status 4" in str(other)


def test_the_server_hasher_takes_names_as_data_never_as_code() -> None:
    assert hashable("odd name $(x) ;'.pt") and hashable("shards/__0_0.distcp")
    assert not hashable("back\\slash") and not hashable("new\nline") and not hashable("cr\r")
    command = hasher_command("/srv/o'ff site")
    assert command.startswith("exec /bin/sh -c ") and command.endswith("b300-hash '/srv/o'\"'\"'ff site'")
