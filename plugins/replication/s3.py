"""The ``s3`` replication target: replicas as objects ``<prefix><replica>/<rel>`` in a bucket."""

from __future__ import annotations

import base64
import hashlib
import io
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from b300.interfaces import RemoteFile

from .common import CHUNK, RECORD, check_name


class _ThrottledReader(io.RawIOBase):
    """A file read through the bandwidth limit (boto3 reads it in its own threads)."""

    def __init__(self, path: str, on_chunk: Callable[[int], None]) -> None:
        self._fh = open(path, "rb")  # noqa: SIM115 - closed in close()
        self._on_chunk = on_chunk

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self._fh.read(size)
        if data:
            self._on_chunk(len(data))
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._fh.close()
        super().close()


class S3Target:
    """Replicas as objects ``<prefix><replica>/<rel>`` in an S3 bucket.

    Large files go up as multipart uploads (``part_size``); every upload
    carries a SHA-256 checksum the server checks. ``endpoint_url`` and the
    credentials options are passed to boto3 as they are.
    """

    def __init__(self, *, bucket: str, prefix: str = "", name: str = "s3", endpoint_url: str | None = None,
                 region_name: str | None = None, aws_access_key_id: str | None = None,
                 aws_secret_access_key: str | None = None, part_size: int = 64 << 20,
                 max_concurrency: int = 4) -> None:
        import boto3
        from boto3.s3.transfer import TransferConfig

        self.name = name
        self._bucket = bucket
        self._prefix = prefix
        self._s3 = boto3.client("s3", endpoint_url=endpoint_url, region_name=region_name,
                                aws_access_key_id=aws_access_key_id,
                                aws_secret_access_key=aws_secret_access_key)
        self._transfer = TransferConfig(multipart_threshold=part_size, multipart_chunksize=part_size,
                                        max_concurrency=max_concurrency, use_threads=True)
        self._part_size = part_size
        self._max_concurrency = max(1, max_concurrency)

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
        # An object appears only when its upload completes. A small file is one PUT;
        # a large one a multipart upload that an interruption leaves open on the
        # server, so the next call continues it: the parts already there (same size,
        # ETag = MD5 of the same bytes here) are kept, the rest sent. ``offset``
        # (a file target's notion) is not used.
        key = self._key(replica, rel)
        if size <= self._part_size:
            reader = _ThrottledReader(local_path, on_chunk)
            try:
                self._s3.upload_fileobj(reader, self._bucket, key, ExtraArgs={"ChecksumAlgorithm": "SHA256"},
                                        Config=self._transfer)
            finally:
                reader.close()
            return size
        upload_id, done = self._open_upload(key)
        count = (size + self._part_size - 1) // self._part_size

        def part(number: int) -> tuple[dict[str, Any], int]:
            start = (number - 1) * self._part_size
            length = min(self._part_size, size - start)
            with open(local_path, "rb") as fh:
                fh.seek(start)
                data = fh.read(length)
            have = done.get(number)
            if have is not None and have["Size"] == len(data) and (
                    have["ETag"].strip('"') == hashlib.md5(data, usedforsecurity=False).hexdigest()):
                return {"PartNumber": number, "ETag": have["ETag"]}, 0
            for i in range(0, len(data), CHUNK):
                on_chunk(min(CHUNK, len(data) - i))
            digest = base64.b64encode(hashlib.sha256(data).digest()).decode()
            reply = self._s3.upload_part(Bucket=self._bucket, Key=key, UploadId=upload_id, PartNumber=number,
                                         Body=data, ChecksumAlgorithm="SHA256", ChecksumSHA256=digest)
            return {"PartNumber": number, "ETag": reply["ETag"]}, len(data)

        with ThreadPoolExecutor(max_workers=self._max_concurrency) as pool:
            results = list(pool.map(part, range(1, count + 1)))
        self._s3.complete_multipart_upload(Bucket=self._bucket, Key=key, UploadId=upload_id,
                                           MultipartUpload={"Parts": [r[0] for r in results]})
        return sum(r[1] for r in results)

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
        keys = [self._key(replica, rel) for rel in self.stat_files(replica)]
        for i in range(0, len(keys), 1000):
            self._s3.delete_objects(Bucket=self._bucket,
                                    Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]]})

    def close(self) -> None:
        self._s3.close()
