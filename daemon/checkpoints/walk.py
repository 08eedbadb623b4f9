"""One ``os.scandir`` walk of a checkpoint directory, never leaving the layout's root.

Layouts (``b300.plugins.layouts``) and manifests (:mod:`b300.checkpoints.manifest`)
both see a checkpoint's files through :func:`walk_checkpoint`, so they agree on what
a checkpoint contains. Symlinks are followed only when their target stays inside
the root; anything else (dangling, leaving the root, a loop) is left out. File
names are only ever data: nothing here runs a shell.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

#: Files b300 itself writes into a checkpoint; never part of what a framework wrote.
OWN_FILES = frozenset({".b300-manifest.json", ".b300-manifest.json.tmp", ".b300-replica.json"})


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One regular file of a checkpoint; ``rel`` uses '/' and is relative to the checkpoint."""

    rel: str
    size: int
    mtime: float


@dataclass(frozen=True, slots=True)
class CheckpointDir:
    """A checkpoint directory's files as one walk saw them."""

    path: str
    files: tuple[FileEntry, ...]
    dir_mtime: float

    @property
    def size_bytes(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def newest_mtime(self) -> float:
        return max((f.mtime for f in self.files), default=self.dir_mtime)

    def file(self, rel: str) -> FileEntry | None:
        for f in self.files:
            if f.rel == rel:
                return f
        return None


def real_root(root: str) -> str | None:
    """The resolved root directory, or ``None`` when it is missing or not a directory."""
    try:
        resolved = os.path.realpath(root)
        return resolved if os.path.isdir(resolved) else None
    except (OSError, ValueError):
        return None


def inside(path: str, root_real: str) -> bool:
    """Whether ``path`` resolves to ``root_real`` or something under it."""
    try:
        resolved = os.path.realpath(path)
    except (OSError, ValueError):
        return False
    return resolved == root_real or resolved.startswith(root_real.rstrip(os.sep) + os.sep)


def top_entries(root_real: str) -> Iterator[tuple[str, str, bool]]:
    """``(name, path, is_dir)`` for each entry of the root; one scandir, nothing raised.

    A symlink counts (and is a directory) only when its target stays inside the root.
    """
    try:
        it = os.scandir(root_real)
    except OSError:
        return
    with it:
        for entry in it:
            try:
                if entry.is_symlink():
                    if not inside(entry.path, root_real):
                        continue
                    yield entry.name, entry.path, entry.is_dir(follow_symlinks=True)
                else:
                    yield entry.name, entry.path, entry.is_dir(follow_symlinks=False)
            except OSError:
                continue


def walk_checkpoint(path: str, root_real: str) -> CheckpointDir:
    """Every regular file under ``path`` (recursively), without leaving ``root_real``.

    Unreadable subdirectories and files that vanish during the walk are left
    out; the result is what could be seen. Sorted by ``rel``.
    """
    files: list[FileEntry] = []
    try:
        dir_mtime = os.stat(path).st_mtime
    except OSError:
        return CheckpointDir(path, (), 0.0)
    seen_dirs: set[tuple[int, int]] = set()
    stack: list[tuple[str, str]] = [(path, "")]
    while stack:
        current, prefix = stack.pop()
        try:
            st_dir = os.stat(current)
            key = (st_dir.st_dev, st_dir.st_ino)
            if key in seen_dirs:
                continue
            seen_dirs.add(key)
            it = os.scandir(current)
        except OSError:
            continue
        with it:
            for entry in it:
                rel = prefix + entry.name
                if not prefix and entry.name in OWN_FILES:
                    continue
                try:
                    link = entry.is_symlink()
                    if link and not inside(entry.path, root_real):
                        continue
                    st = entry.stat(follow_symlinks=link)
                except OSError:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    stack.append((entry.path, rel + "/"))
                elif stat.S_ISREG(st.st_mode):
                    files.append(FileEntry(rel, st.st_size, st.st_mtime))
    files.sort(key=lambda f: f.rel)
    return CheckpointDir(path, tuple(files), dir_mtime)


def utc(ts: float) -> datetime:
    """A POSIX timestamp as an aware UTC datetime."""
    return datetime.fromtimestamp(ts, UTC)
