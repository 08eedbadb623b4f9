"""The ``s3`` replication target: replicas as objects ``<prefix><replica>/<rel>`` in a bucket."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from b300.interfaces import RemoteFile

from .common import CHUNK, RECORD, check_name


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


class S3Target:
    """Replicas as objects ``<prefix><replica>/<rel>`` in an S3 bucket.

    A file up to ``part_size`` is one PUT; a larger one a multipart upload whose
    parts are read and sent ``max_concurrency`` at a time by one pool shared by
    every sending thread (so memory stays at ``part_size`` x workers), all
    through the caller's bandwidth limit, while the caller's thread takes the
    file's SHA-256 in order. Every request carries the SHA-256 of
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
                 max_concurrency: int = 8, verify: str = "checksum", timeout: float = 300.0) -> None:
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
        # Room for every part in flight plus the callers' own PUTs and HEADs; completing a
        # large upload can take a busy server minutes (moto at load 17 took over botocore's 60 s).
        config = Config(max_pool_connections=self._max_concurrency + 16, read_timeout=timeout,
                        connect_timeout=min(timeout, 60.0))
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
        before = _identity(local_path)
        if size <= self._part_size:
            with open(local_path, "rb") as fh:
                data = _read_throttled(fh, size, on_chunk)
            whole.update(data)
            reply = self._s3.put_object(Bucket=self._bucket, Key=key, Body=data, ChecksumAlgorithm="SHA256",
                                        ChecksumSHA256=_b64(whole.digest()))
            sent, expected = len(data), _b64(whole.digest())
        else:
            sent, expected, reply = self._put_multipart(local_path, key, size, on_chunk, whole)
        # The parts and the whole-file digest were read separately: vouch only for a file
        # that did not change meanwhile.
        if self._verify == "checksum" and _identity(local_path) == before:
            # S3 checks a checksum sent with the upload and refuses a mismatch; its reply names
            # the checksum it stored. Only when the reply does not say is it asked (HEAD).
            reported = reply.get("ChecksumSHA256") if isinstance(reply, dict) else None
            if not _same_checksum(reported, expected):
                reported = self._s3.head_object(Bucket=self._bucket, Key=key,
                                                ChecksumMode="ENABLED").get("ChecksumSHA256")
            if _same_checksum(reported, expected):
                with self._lock:
                    self._vouched[(replica, rel)] = whole.hexdigest()
        return sent

    def _put_multipart(self, path: str, key: str, size: int, on_chunk: Callable[[int], None],
                       whole: Any) -> tuple[int, str, dict[str, Any]]:
        """Upload ``path`` as parts, each read, hashed and sent by a worker of the shared pool,
        while this thread hashes the whole file in order (a local read, from the page cache).

        Reading and hashing every part here first, in order, starved the pool: py-spy showed
        half of its workers idle while two files' parts were being read. Returns the bytes
        sent and the composite checksum S3 should report."""
        upload_id, done = self._open_upload(key)
        count = (size + self._part_size - 1) // self._part_size
        futures = [self._parts.submit(self._send_part, path, key, upload_id, number,
                                      min(self._part_size, size - (number - 1) * self._part_size),
                                      done.get(number), on_chunk)
                   for number in range(1, count + 1)]
        try:
            with open(path, "rb") as fh:
                while block := fh.read(4 << 20):
                    whole.update(block)
            parts = [f.result() for f in futures]
        except BaseException:
            for f in futures:  # what is on its way is kept for the next attempt; the rest not sent
                f.cancel()
            for f in futures:
                with contextlib.suppress(Exception):
                    f.result()
            raise
        digests = [p.pop("_digest") for p in parts]
        sent = sum(p.pop("_sent") for p in parts)
        reply: dict[str, Any] = {}
        try:
            reply = self._s3.complete_multipart_upload(Bucket=self._bucket, Key=key, UploadId=upload_id,
                                                       MultipartUpload={"Parts": parts})
        except self._s3.exceptions.ClientError:
            # A completion that outlived the read timeout may have been done by the server all
            # the same, and then the client's retry finds no upload: the object settles it.
            if self._object_size(key) != size:
                raise
        return sent, f"{_b64(hashlib.sha256(b''.join(digests)).digest())}-{count}", reply

    def _object_size(self, key: str) -> int | None:
        try:
            return int(self._s3.head_object(Bucket=self._bucket, Key=key)["ContentLength"])
        except self._s3.exceptions.ClientError:
            return None

    def _send_part(self, path: str, key: str, upload_id: str, number: int, length: int,
                   have: dict[str, Any] | None, on_chunk: Callable[[int], None]) -> dict[str, Any]:
        """One part: kept if the open upload has it (same size, ETag = MD5 of these bytes), else sent."""
        with open(path, "rb") as fh:
            fh.seek((number - 1) * self._part_size)
            if have is not None and have["Size"] == length:
                data = fh.read(length)
                digest = hashlib.sha256(data).digest()
                if have["ETag"].strip('"') == hashlib.md5(data, usedforsecurity=False).hexdigest():
                    return {"PartNumber": number, "ETag": have["ETag"], "ChecksumSHA256": _b64(digest),
                            "_sent": 0, "_digest": digest}
                for i in range(0, length, CHUNK):  # same size, other bytes: send it after all
                    on_chunk(min(CHUNK, length - i))
            else:
                data = _read_throttled(fh, length, on_chunk)
                digest = hashlib.sha256(data).digest()
        reply = self._s3.upload_part(Bucket=self._bucket, Key=key, UploadId=upload_id, PartNumber=number,
                                     Body=data, ChecksumAlgorithm="SHA256", ChecksumSHA256=_b64(digest))
        return {"PartNumber": number, "ETag": reply["ETag"], "ChecksumSHA256": _b64(digest),
                "_sent": len(data), "_digest": digest}

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


def _identity(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ino


def _same_checksum(reported: object, expected: str) -> bool:
    """Whether S3's reported checksum is ours. A composite is "<b64>-<parts>" on AWS; some
    servers leave out the count (base64 has no '-')."""
    return isinstance(reported, str) and bool(reported) and reported.split("-")[0] == expected.split("-")[0]
