"""The ``s3`` replication target: replicas as objects ``<prefix><replica>/<rel>`` in a bucket."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from b300.interfaces import RemoteFile

from .common import CHUNK, RECORD, check_name


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


class S3Target:
    """Replicas as objects ``<prefix><replica>/<rel>`` in an S3 bucket.

    A file up to ``part_size`` is one PUT; a larger one a multipart upload whose
    parts go up ``max_concurrency`` at a time from one pool shared by every
    sending thread (so memory stays at ``part_size`` x parts in flight), all
    through the caller's bandwidth limit. Every request carries the SHA-256 of
    its body, which S3 checks on receipt (a mismatch is refused, BadDigest).

    Verification (``verify = "checksum"``, the default): right after an upload
    the object's checksum as the server reports it (HEAD with ChecksumMode) must
    equal the one computed from the bytes sent (for multipart, S3's composite:
    SHA-256 of the parts' SHA-256s, "-N"); the file's SHA-256 is then vouched for
    (:class:`b300.interfaces.SentDigests`) without downloading it. A server
    that reports no checksum gets its objects read back, as with ``verify =
    "read"``. ``endpoint_url`` and the credentials options go to boto3 as they are.
    """

    def __init__(self, *, bucket: str, prefix: str = "", name: str = "s3", endpoint_url: str | None = None,
                 region_name: str | None = None, aws_access_key_id: str | None = None,
                 aws_secret_access_key: str | None = None, part_size: int = 16 << 20,
                 max_concurrency: int = 8, verify: str = "checksum") -> None:
        import boto3
        from botocore.config import Config

        if verify not in ("checksum", "read"):
            raise ValueError(f"s3 target {name}: verify must be 'checksum' or 'read', not {verify!r}")
        if part_size < 5 << 20:
            raise ValueError(f"s3 target {name}: part_size must be at least 5 MiB (S3's minimum part)")
        self.name = name
        self._bucket = bucket
        self._prefix = prefix
        self._max_concurrency = max(1, int(max_concurrency))
        # Room for every part in flight plus the callers' own PUTs and HEADs.
        config = Config(max_pool_connections=self._max_concurrency + 16)
        self._s3 = boto3.client("s3", endpoint_url=endpoint_url, region_name=region_name,
                                aws_access_key_id=aws_access_key_id,
                                aws_secret_access_key=aws_secret_access_key, config=config)
        self._part_size = part_size
        self._verify = verify
        self._parts = ThreadPoolExecutor(max_workers=self._max_concurrency, thread_name_prefix="s3-part")
        self._lock = threading.Lock()
        self._vouched: dict[tuple[str, str], str] = {}  # (replica, rel) -> sha256 hex

    def _key(self, replica: str, rel: str) -> str:
        check_name(replica, rel)
        return f"{self._prefix}{replica}/{rel}"

    def stat_files(self, replica: str) -> dict[str, RemoteFile]:
        check_name(replica)
        prefix = f"{self._prefix}{replica}/"
        found: dict[str, RemoteFile] = {}
        for page in self._s3.get_paginator("list_objects_v2").paginate(Bucket=self._bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                rel = obj["Key"][len(prefix):]
                if rel != RECORD:
                    found[rel] = RemoteFile(int(obj["Size"]))
        return found

    def put_file(self, local_path: str, replica: str, rel: str, size: int, offset: int,
                 on_chunk: Callable[[int], None]) -> int:
        # An object appears only when its upload completes. A large file's multipart
        # upload, if interrupted, stays open on the server and the next call continues
        # it: the parts already there (same size, ETag = MD5 of the same bytes here)
        # are kept, the rest sent. ``offset`` (a file target's notion) is not used.
        key = self._key(replica, rel)
        whole = hashlib.sha256()
        with open(local_path, "rb") as fh:
            if size <= self._part_size:
                data = _read_throttled(fh, size, on_chunk)
                whole.update(data)
                self._s3.put_object(Bucket=self._bucket, Key=key, Body=data, ChecksumAlgorithm="SHA256",
                                    ChecksumSHA256=_b64(whole.digest()))
                sent, expected = len(data), _b64(whole.digest())
            else:
                sent, expected = self._put_multipart(fh, key, size, on_chunk, whole)
        if self._verify == "checksum":
            reported = self._s3.head_object(Bucket=self._bucket, Key=key, ChecksumMode="ENABLED")
            # A composite is "<b64>-<parts>" on AWS; some servers leave out the count (base64 has no '-').
            if str(reported.get("ChecksumSHA256", "")).split("-")[0] == expected.split("-")[0]:
                with self._lock:
                    self._vouched[(replica, rel)] = whole.hexdigest()
        return sent

    def _put_multipart(self, fh: Any, key: str, size: int, on_chunk: Callable[[int], None],
                       whole: Any) -> tuple[int, str]:
        """Upload ``fh`` as parts: read and hashed in order here, sent by the shared pool.

        Returns the bytes sent and the composite checksum S3 should report."""
        upload_id, done = self._open_upload(key)
        count = (size + self._part_size - 1) // self._part_size
        in_flight: deque[Future[dict[str, Any]]] = deque()
        parts: list[dict[str, Any]] = []
        part_digests: list[bytes] = []
        try:
            self._queue_parts(fh, key, upload_id, size, count, done, on_chunk, whole, in_flight, parts,
                              part_digests)
        except BaseException:
            for f in in_flight:  # what is on its way is kept for the next attempt; then give up
                with contextlib.suppress(Exception):
                    f.result()
            raise
        parts += [f.result() for f in in_flight]
        sent = sum(p.pop("_sent") for p in parts)
        self._s3.complete_multipart_upload(Bucket=self._bucket, Key=key, UploadId=upload_id,
                                           MultipartUpload={"Parts": parts})
        return sent, f"{_b64(hashlib.sha256(b''.join(part_digests)).digest())}-{count}"

    def _queue_parts(self, fh: Any, key: str, upload_id: str, size: int, count: int,
                     done: dict[int, dict[str, Any]], on_chunk: Callable[[int], None], whole: Any,
                     in_flight: deque[Future[dict[str, Any]]], parts: list[dict[str, Any]],
                     part_digests: list[bytes]) -> None:
        for number in range(1, count + 1):
            have = done.get(number)
            length = min(self._part_size, size - (number - 1) * self._part_size)
            kept = have is not None and have["Size"] == length
            data = fh.read(length) if kept else _read_throttled(fh, length, on_chunk)
            whole.update(data)
            part_digest = hashlib.sha256(data).digest()
            part_digests.append(part_digest)
            if kept and have is not None and (
                    have["ETag"].strip('"') == hashlib.md5(data, usedforsecurity=False).hexdigest()):
                in_flight.append(_done({"PartNumber": number, "ETag": have["ETag"],
                                        "ChecksumSHA256": _b64(part_digest), "_sent": 0}))
            else:
                if kept:  # same size, other bytes: send it after all
                    for i in range(0, length, CHUNK):
                        on_chunk(min(CHUNK, length - i))
                in_flight.append(self._parts.submit(self._upload_part, key, upload_id, number, data,
                                                    _b64(part_digest)))
            while len(in_flight) > self._max_concurrency:  # bounds the parts held in memory
                parts.append(in_flight.popleft().result())

    def _upload_part(self, key: str, upload_id: str, number: int, data: bytes, digest: str) -> dict[str, Any]:
        reply = self._s3.upload_part(Bucket=self._bucket, Key=key, UploadId=upload_id, PartNumber=number,
                                     Body=data, ChecksumAlgorithm="SHA256", ChecksumSHA256=digest)
        return {"PartNumber": number, "ETag": reply["ETag"], "ChecksumSHA256": digest, "_sent": len(data)}

    def sent_sha256(self, replica: str, rels: Sequence[str]) -> dict[str, str]:
        """SHA-256 of files uploaded by this process whose server-reported checksum matched."""
        with self._lock:
            return {r: d for r in rels if (d := self._vouched.pop((replica, r), None)) is not None}

    def _open_upload(self, key: str) -> tuple[str, dict[int, dict[str, Any]]]:
        """The newest unfinished multipart upload of ``key`` with its parts, else a new one;
        older unfinished uploads of the key are aborted (they only cost storage)."""
        listed = self._s3.list_multipart_uploads(Bucket=self._bucket, Prefix=key).get("Uploads", [])
        uploads = [u for u in listed if u["Key"] == key]
        uploads.sort(key=lambda u: u["Initiated"])
        for stale in uploads[:-1]:
            self._s3.abort_multipart_upload(Bucket=self._bucket, Key=key, UploadId=stale["UploadId"])
        if not uploads:
            created = self._s3.create_multipart_upload(Bucket=self._bucket, Key=key, ChecksumAlgorithm="SHA256")
            return str(created["UploadId"]), {}
        upload_id = str(uploads[-1]["UploadId"])
        parts: dict[int, dict[str, Any]] = {}
        marker = 0
        for _ in range(10_000):  # S3 allows at most 10,000 parts
            page = self._s3.list_parts(Bucket=self._bucket, Key=key, UploadId=upload_id,
                                       PartNumberMarker=marker)
            for p in page.get("Parts", []):
                parts[int(p["PartNumber"])] = p
            if not page.get("IsTruncated"):
                break
            marker = int(page["NextPartNumberMarker"])
        return upload_id, parts

    def read_file(self, replica: str, rel: str) -> Iterator[bytes]:
        try:
            body = self._s3.get_object(Bucket=self._bucket, Key=self._key(replica, rel))["Body"]
        except self._s3.exceptions.NoSuchKey:
            raise FileNotFoundError(rel) from None
        try:
            while chunk := body.read(CHUNK):
                yield chunk
        finally:
            body.close()

    def put_record(self, replica: str, data: bytes) -> None:
        self._s3.put_object(Bucket=self._bucket, Key=self._key(replica, RECORD), Body=data,
                            ChecksumAlgorithm="SHA256")

    def get_record(self, replica: str) -> bytes | None:
        try:
            body = self._s3.get_object(Bucket=self._bucket, Key=self._key(replica, RECORD))["Body"]
        except self._s3.exceptions.NoSuchKey:
            return None
        data: bytes = body.read()
        return data

    def delete_record(self, replica: str) -> None:
        self._s3.delete_object(Bucket=self._bucket, Key=self._key(replica, RECORD))

    def list_replicas(self) -> list[str]:
        return [n for n in self.list_all() if self.get_record(n) is not None]

    def list_all(self) -> list[str]:
        names = []
        paginator = self._s3.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self._bucket, Prefix=self._prefix, Delimiter="/"):
            names += [p["Prefix"][len(self._prefix):].rstrip("/") for p in page.get("CommonPrefixes", [])]
        return sorted(n for n in names if n)

    def delete_replica(self, replica: str) -> None:
        self.delete_record(replica)
        with self._lock:
            self._vouched = {k: v for k, v in self._vouched.items() if k[0] != replica}
        keys = [self._key(replica, rel) for rel in self.stat_files(replica)]
        for i in range(0, len(keys), 1000):
            self._s3.delete_objects(Bucket=self._bucket,
                                    Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]]})

    def close(self) -> None:
        self._parts.shutdown(wait=True)
        self._s3.close()


def _read_throttled(fh: Any, length: int, on_chunk: Callable[[int], None]) -> bytes:
    """``length`` bytes of ``fh``, ``on_chunk`` called before each MiB (the bandwidth limit)."""
    blocks = []
    left = length
    while left > 0:
        want = min(CHUNK, left)
        on_chunk(want)
        block = fh.read(want)
        if not block:
            raise OSError(f"{fh.name} is shorter than {length} bytes")
        blocks.append(block)
        left -= len(block)
    return b"".join(blocks)


def _done(value: dict[str, Any]) -> Future[dict[str, Any]]:
    future: Future[dict[str, Any]] = Future()
    future.set_result(value)
    return future
