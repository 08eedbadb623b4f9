"""Copying a checkpoint offsite, resumably, and proving the copy is intact.

Targets are plugins (entry-point group ``b300.replication_targets``; the
protocol is :class:`b300.interfaces.ReplicationTarget`). This module drives any
of them the same way:

1. files the target already holds at the right size are skipped; a partial
   file left by an interrupted copy is continued from where it stopped;
2. the rest are sent by ``concurrency`` threads, all under one bandwidth limit;
3. every file is checked against the manifest's sha256: by the digest the
   target took of the bytes it wrote while copying (:class:`SentDigests`), else
   by the target hashing it where it is stored (:class:`RemoteHasher`), else by
   reading it back; a file that differs is sent again in full, once;
4. only then the replica record (manifest + step + time) is written, last, so a
   replica without a record is never taken for a complete one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog

from ..errors import UsageError
from ..interfaces import RemoteFile, RemoteHasher, ReplicationTarget, SentDigests
from ..model import CheckpointInfo
from ..plugin_registry import REPLICATION_TARGETS, PluginRegistry
from ..safety.faults import crashpoint
from .manifest import Manifest, ManifestEntry, write_manifest

log = structlog.get_logger(__name__)

_HASH_CHUNK = 4 << 20


class Throttle:
    """A token bucket shared by every sending thread: at most ``bytes_per_s`` on average.

    ``None`` means unlimited. ``clock`` and ``sleep`` are injected for tests.
    A burst of one second's worth is allowed.
    """

    def __init__(
        self,
        bytes_per_s: float | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._rate = bytes_per_s
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._tokens = bytes_per_s or 0.0
        self._last = clock()

    def consume(self, n: int) -> None:
        """Account for ``n`` bytes about to be sent; blocks while over the limit."""
        if self._rate is None:
            return
        with self._lock:
            now = self._clock()
            self._tokens = min(self._rate, self._tokens + (now - self._last) * self._rate)
            self._last = now
            self._tokens -= n
            wait = -self._tokens / self._rate if self._tokens < 0 else 0.0
        if wait > 0:
            self._sleep(wait)


@dataclass(frozen=True, slots=True)
class ReplicaRecord:
    """What a target holds about one complete replica (its last-written file)."""

    name: str
    step: int
    mtime: datetime
    manifest: Manifest

    def to_json(self) -> bytes:
        return json.dumps(
            {"name": self.name, "step": self.step, "mtime": self.mtime.isoformat(),
             "manifest": json.loads(self.manifest.to_json())},
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ReplicaRecord:
        doc = json.loads(data)
        return cls(
            name=str(doc["name"]),
            step=int(doc["step"]),
            mtime=datetime.fromisoformat(doc["mtime"]),
            manifest=Manifest.from_json(json.dumps(doc["manifest"])),
        )


@dataclass(frozen=True, slots=True)
class ReplicationResult:
    target: str
    name: str
    ok: bool
    bytes_sent: int
    files_sent: int
    files_skipped: int
    problems: tuple[str, ...] = ()


def replica_name(ckpt: CheckpointInfo) -> str:
    """The replica's name on a target: the checkpoint directory's own name."""
    return ckpt.path.rstrip("/").rsplit("/", 1)[-1]


def replicate(
    ckpt: CheckpointInfo,
    manifest: Manifest,
    target: ReplicationTarget,
    *,
    concurrency: int = 4,
    throttle: Throttle | None = None,
) -> ReplicationResult:
    """Copy the checkpoint to ``target`` (resuming any earlier attempt) and verify the copy.

    ``manifest`` must be the checkpoint's (see :func:`b300.checkpoints.manifest.ensure_manifest`).
    Errors of the target (network, permissions) propagate: the caller retries
    later and the next call resumes where this one stopped.
    """
    name = replica_name(ckpt)
    throttle = throttle or Throttle(None)
    existing = target.get_record(name)
    if existing is not None:
        try:
            if ReplicaRecord.from_json(existing).manifest.files == manifest.files:
                return ReplicationResult(target.name, name, True, 0, 0, len(manifest.files))
        except (ValueError, KeyError, TypeError):
            pass
        target.delete_record(name)  # a different checkpoint of the same name: start over
    remote = target.stat_files(name)
    todo = [e for e in manifest.files if not _same_size(remote.get(e.rel), e)]
    skipped = len(manifest.files) - len(todo)
    sent = _send(ckpt.path, name, todo, target, remote, concurrency, throttle)
    crashpoint("replica_sent")
    bad = _verify_remote(name, manifest.files, target, concurrency, _sent_digests(target, name, todo))
    if bad:
        log.warning("replication.resend", target=target.name, replica=name, files=len(bad))
        sent += _send(ckpt.path, name, bad, target, {}, concurrency, throttle)
        bad = _verify_remote(name, bad, target, concurrency, _sent_digests(target, name, bad))
    if bad:
        problems = tuple(f"{e.rel!r} differs on {target.name} after copying it twice" for e in bad)
        return ReplicationResult(target.name, name, False, sent, len(todo), skipped, problems)
    target.put_record(name, ReplicaRecord(name, ckpt.step, ckpt.mtime, manifest).to_json())
    crashpoint("replica_recorded")
    return ReplicationResult(target.name, name, True, sent, len(todo), skipped)


def verify_replica(name: str, target: ReplicationTarget, *, concurrency: int = 4) -> tuple[str, ...]:
    """Read the whole replica back and compare with its record; problems, empty when intact."""
    data = target.get_record(name)
    if data is None:
        return (f"{name} has no replica record on {target.name}",)
    files = ReplicaRecord.from_json(data).manifest.files
    bad = _verify_remote(name, files, target, concurrency)
    return tuple(f"{e.rel!r} differs on {target.name}" for e in bad)


def replica_records(target: ReplicationTarget) -> list[ReplicaRecord]:
    """Every complete replica on the target, oldest step first (unreadable records skipped)."""
    records = []
    for name in target.list_replicas():
        data = target.get_record(name)
        if data is None:
            continue
        try:
            records.append(ReplicaRecord.from_json(data))
        except (ValueError, KeyError, TypeError):
            log.warning("replication.bad_record", target=target.name, replica=name)
    return sorted(records, key=lambda r: (r.step, r.name))


def _same_size(remote: RemoteFile | None, entry: ManifestEntry) -> bool:
    return remote is not None and remote.size == entry.size


def _send(
    path: str,
    name: str,
    entries: list[ManifestEntry],
    target: ReplicationTarget,
    remote: Mapping[str, RemoteFile],
    concurrency: int,
    throttle: Throttle,
) -> int:
    def one(entry: ManifestEntry) -> int:
        have = remote.get(entry.rel)
        offset = have.partial if have is not None and 0 < have.partial < entry.size else 0
        return target.put_file(f"{path}/{entry.rel}", name, entry.rel, entry.size, offset, throttle.consume)

    # Largest first keeps the threads busy to the end.
    ordered = sorted(entries, key=lambda e: e.size, reverse=True)
    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        return sum(pool.map(one, ordered))


def _sent_digests(target: ReplicationTarget, name: str, entries: Sequence[ManifestEntry]) -> dict[str, str]:
    if not isinstance(target, SentDigests):
        return {}
    return target.sent_sha256(name, [e.rel for e in entries])


def _verify_remote(
    name: str, entries: Sequence[ManifestEntry], target: ReplicationTarget, concurrency: int,
    known: Mapping[str, str] | None = None,
) -> list[ManifestEntry]:
    hashed: dict[str, str] = dict(known or {})
    rest = [e.rel for e in entries if e.rel not in hashed]
    if rest and isinstance(target, RemoteHasher):
        try:
            hashed.update(target.sha256_files(name, rest))
        except Exception as exc:  # fall back to reading everything back
            log.warning("replication.remote_hash_failed", target=target.name,
                        error=f"{type(exc).__name__}: {exc}")

    def differs(entry: ManifestEntry) -> bool:
        if entry.rel in hashed:
            return hashed[entry.rel] != entry.sha256
        digest = hashlib.sha256()
        size = 0
        try:
            for chunk in target.read_file(name, entry.rel):
                digest.update(chunk)
                size += len(chunk)
        except FileNotFoundError:
            return True
        return size != entry.size or digest.hexdigest() != entry.sha256

    with ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        flags = list(pool.map(differs, entries))
    return [e for e, bad in zip(entries, flags, strict=True) if bad]


def load_target(kind: str, options: Mapping[str, Any],
                plugins: PluginRegistry | None = None) -> ReplicationTarget:
    """Build the replication target plugin registered as ``kind`` with ``options``.

    ``plugins`` is the caller's registry (the daemon's); without one a fresh registry
    loads the group. A plugin that failed to load was logged and skipped
    (b300.plugin_registry); an unknown or skipped kind, options the plugin refuses, or
    an object that is not a ReplicationTarget raise UsageError.
    """
    factory = (plugins or PluginRegistry()).get(REPLICATION_TARGETS, kind)
    try:
        return factory(**options)
    except TypeError as exc:
        raise UsageError(f"replication target {kind!r}: {exc}") from None


@dataclass(frozen=True, slots=True)
class RestoreResult:
    """What :func:`restore` wrote: the restored checkpoint's path and its size."""

    path: str
    files: int
    bytes: int


_MEGATRON_ITER = re.compile(r"iter_(\d{1,18})", re.ASCII)
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"


def restore(name: str, target: ReplicationTarget, dest_root: str) -> RestoreResult:
    """Copy the replica ``name`` from ``target`` into ``dest_root/name`` and prove it intact.

    Only a replica with a record (a finished copy) is restored. Files are
    written in name order to ``.part`` files, hashed on the way and renamed when
    they match the record's sha256; the manifest is written last, so the
    restored folder verifies like the original. The restored files have new
    times: whether the checkpoint is usable is for its layout to judge from
    the contents. A Megatron-LM legacy checkpoint restored into a root without
    ``latest_checkpointed_iteration.txt`` gets one naming it. Raises
    FileExistsError when the folder exists, ValueError when the replica is
    unrecorded or a file differs.
    """
    data = target.get_record(name)
    if data is None:
        raise ValueError(f"{name} has no replica record on {target.name}")
    manifest = ReplicaRecord.from_json(data).manifest
    dest = os.path.join(dest_root, name)
    os.makedirs(dest_root, exist_ok=True)
    os.mkdir(dest)
    total = 0
    for entry in manifest.files:
        out = os.path.join(dest, *entry.rel.split("/"))
        if not os.path.realpath(out).startswith(os.path.realpath(dest) + os.sep):
            raise ValueError(f"{entry.rel!r} would leave {dest}")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        digest = hashlib.sha256()
        with open(out + ".part", "wb") as fh:
            for chunk in target.read_file(name, entry.rel):
                digest.update(chunk)
                fh.write(chunk)
            fh.flush()
            os.fsync(fh.fileno())
        if digest.hexdigest() != entry.sha256:
            os.unlink(out + ".part")
            raise ValueError(f"{entry.rel!r} of {name} on {target.name} does not match its record")
        os.replace(out + ".part", out)
        total += entry.size
    write_manifest(dest, manifest)
    point_megatron_tracker(name, dest_root, manifest)
    return RestoreResult(dest, len(manifest.files), total)


def point_megatron_tracker(name: str, dest_root: str, manifest: Manifest) -> None:
    """A Megatron-LM legacy checkpoint loads only through its root's tracker, which is not part
    of the checkpoint folder: restored into a root without one, write it naming this iteration
    (``release`` for ``release/``), as Megatron-LM's own save would have."""
    legacy = any(e.rel.endswith("/model_optim_rng.pt") and e.rel.startswith("mp_rank_") for e in manifest.files)
    match = _MEGATRON_ITER.fullmatch(name)
    tracker = os.path.join(dest_root, MEGATRON_TRACKER)
    if not legacy or (match is None and name != "release") or os.path.lexists(tracker):
        return
    with open(tracker, "w", encoding="ascii") as fh:
        fh.write(str(int(match.group(1))) if match else "release")
        fh.flush()
        os.fsync(fh.fileno())
