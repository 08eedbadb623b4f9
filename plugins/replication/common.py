"""What every built-in replication target shares: names, the partial-file suffix, the record."""

from __future__ import annotations

from collections.abc import Callable, Iterator

CHUNK = 1 << 20  # bytes per read when streaming a file back
PART = ".b300part"  # suffix of a file being copied (file-like targets)
RECORD = ".b300-replica.json"  # the replica record, written last


def check_name(replica: str, rel: str = "") -> None:
    """Names come from our own walks, but a target must never be steered outside its base.

    Raises ValueError for an empty, ``.``, ``..`` or NUL-carrying component, or a
    replica name with a '/'.
    """
    parts = [replica, *(rel.split("/") if rel else [])]
    if "/" in replica or any(p in ("", ".", "..") or "\x00" in p for p in parts):
        raise ValueError(f"unsafe replica path {replica!r}/{rel!r}")


def read_chunks(path: str, offset: int, on_chunk: Callable[[int], None]) -> Iterator[bytes]:
    """A local file from ``offset`` on in :data:`CHUNK` pieces, ``on_chunk`` called before each."""
    with open(path, "rb") as fh:
        fh.seek(offset)
        while True:
            on_chunk(CHUNK)
            chunk = fh.read(CHUNK)
            if not chunk:
                return
            yield chunk
