"""Checksum manifests: sha256 of every file of a checkpoint, made once, checked often.

The manifest is a JSON file written atomically beside the data
(``<checkpoint>/.b300-manifest.json``), so it travels with the checkpoint when it
is copied and survives a daemon without its database. Files are hashed streaming,
in 4 MiB reads. :func:`verify` re-hashes and compares: a checkpoint whose bytes
changed after its manifest was made fails, so a resume falls back to an older one.

Files added after the manifest was made are not damage: libraries legitimately
write into a checkpoint after the point its layout calls it complete
(Megatron-LM saves ``tokenizer/`` after ``latest_checkpointed_iteration.txt``).
So the manifest is *extended*, not settled: when every recorded file is
present, at its size and (for a full verify) its sha256, new files are hashed
and added to it. A recorded file that is missing, resized or changed still
fails, and so does an addition seen alongside such damage.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .walk import CheckpointDir, FileEntry, real_root, walk_checkpoint

MANIFEST_NAME = ".b300-manifest.json"
_CHUNK = 4 << 20
_VERSION = 1


@dataclass(frozen=True, slots=True)
class ManifestEntry:
    rel: str
    size: int
    sha256: str


@dataclass(frozen=True, slots=True)
class Manifest:
    """What a checkpoint held when it was hashed. ``files`` is sorted by ``rel``."""

    files: tuple[ManifestEntry, ...]
    created_at: datetime

    @property
    def size_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": _VERSION,
                "created_at": self.created_at.isoformat(),
                "files": [{"path": f.rel, "size": f.size, "sha256": f.sha256} for f in self.files],
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        """Parse a manifest; ValueError when it is not one."""
        doc: Any = json.loads(text)
        if not isinstance(doc, dict) or doc.get("version") != _VERSION:
            raise ValueError("not a b300 manifest (version 1)")
        files = tuple(
            ManifestEntry(str(f["path"]), int(f["size"]), str(f["sha256"])) for f in doc["files"]
        )
        return cls(files=files, created_at=datetime.fromisoformat(doc["created_at"]))


@dataclass(frozen=True, slots=True)
class Verification:
    """The outcome of :func:`verify`; ``problems`` are one line each, for people and logs."""

    ok: bool
    problems: tuple[str, ...] = ()
    bytes_hashed: int = 0


def sha256_file(path: str, progress: Callable[[int], None] | None = None) -> str:
    """The hex sha256 of a file, read in chunks (``progress`` gets each chunk's length)."""
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
            if progress is not None:
                progress(len(chunk))
    return digest.hexdigest()


def _root_of(path: str, root: str | None) -> str | None:
    return real_root(root if root is not None else os.path.dirname(os.path.abspath(path)))


def build_manifest(path: str, now: datetime, *, root: str | None = None) -> Manifest:
    """Hash every file of the checkpoint at ``path`` (symlinks leaving ``root`` are not followed).

    ``root`` defaults to the checkpoint's parent directory. Raises OSError when
    a file cannot be read.
    """
    root_real = _root_of(path, root)
    if root_real is None:
        raise FileNotFoundError(f"checkpoint root of {path} is missing")
    ckpt = walk_checkpoint(path, root_real)
    entries = tuple(
        ManifestEntry(f.rel, f.size, sha256_file(os.path.join(path, f.rel))) for f in ckpt.files
    )
    return Manifest(files=entries, created_at=now)


def write_manifest(path: str, manifest: Manifest) -> str:
    """Write ``<path>/.b300-manifest.json`` atomically (temp file, fsync, rename); return its path."""
    target = os.path.join(path, MANIFEST_NAME)
    tmp = target + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(manifest.to_json())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return target


def read_manifest(path: str) -> Manifest | None:
    """The checkpoint's manifest, or ``None`` when it has none or it is unreadable."""
    try:
        with open(os.path.join(path, MANIFEST_NAME), "rb") as fh:
            return Manifest.from_json(fh.read())
    except (OSError, ValueError, KeyError, TypeError):
        return None


def ensure_manifest(path: str, now: datetime, *, root: str | None = None) -> Manifest:
    """The checkpoint's manifest, made and written now if it has none (computed once).

    Call it only for a checkpoint its layout reports complete: a manifest
    records the bytes as they are and later changes count as corruption.
    """
    existing = read_manifest(path)
    if existing is not None:
        return existing
    manifest = build_manifest(path, now, root=root)
    write_manifest(path, manifest)
    return manifest


def compare(manifest: Manifest, seen: CheckpointDir) -> list[str]:
    """Problems visible without reading data: missing, extra or resized files (pure)."""
    problems: list[str] = []
    have = {f.rel: f.size for f in seen.files}
    for entry in manifest.files:
        size = have.pop(entry.rel, None)
        if size is None:
            problems.append(f"missing {entry.rel!r}")
        elif size != entry.size:
            problems.append(f"{entry.rel!r} is {size} bytes, manifest says {entry.size}")
    problems.extend(f"unexpected file {rel!r}" for rel in sorted(have))
    return problems


def verify(path: str, *, root: str | None = None, full: bool = True) -> Verification:
    """Check the checkpoint at ``path`` against its manifest.

    Fails when there is no manifest, a file is missing, added or resized, or
    (``full``, the default) any file's sha256 differs. Never raises for I/O
    errors: they are problems in the result.
    """
    manifest = read_manifest(path)
    if manifest is None:
        return Verification(False, ("no readable manifest",))
    root_real = _root_of(path, root)
    if root_real is None:
        return Verification(False, ("checkpoint root is missing",))
    seen = walk_checkpoint(path, root_real)
    problems = compare(manifest, seen)
    recorded = {f.rel for f in manifest.files}
    added = [f for f in seen.files if f.rel not in recorded]
    if added and len(problems) == len(added):  # only additions: judged below, after the hashes
        problems = []
    hashed = 0
    if full and not problems:
        for entry in manifest.files:
            try:
                digest = sha256_file(os.path.join(path, entry.rel))
            except OSError as exc:
                problems.append(f"cannot read {entry.rel!r}: {exc.strerror or exc}")
                continue
            hashed += entry.size
            if digest != entry.sha256:
                problems.append(f"{entry.rel!r} does not match its sha256")
    if added and not problems:
        problems = _extend(path, manifest, added)
    return Verification(not problems, tuple(problems), hashed)


def _extend(path: str, manifest: Manifest, added: list[FileEntry]) -> list[str]:
    """Add files a library wrote after the manifest was made (Megatron-LM's tokenizer assets
    come after its tracker) once every recorded file checked out; [] or the problems."""
    entries = list(manifest.files)
    for f in added:
        try:
            entries.append(ManifestEntry(f.rel, f.size, sha256_file(os.path.join(path, f.rel))))
        except OSError as exc:
            return [f"cannot read {f.rel!r}: {exc.strerror or exc}"]
    entries.sort(key=lambda e: e.rel)
    try:
        write_manifest(path, Manifest(files=tuple(entries), created_at=manifest.created_at))
    except OSError as exc:
        return [f"cannot extend the manifest: {exc.strerror or exc}"]
    return []
