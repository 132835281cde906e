"""Durable object backends: a directory (local / shared_fs) or an S3 bucket prefix (object_store).

The interface is blocking on purpose (it is called from worker threads and from
Spark executors); async callers wrap calls in ``asyncio.to_thread``.  Keys are
``/``-separated relative paths such as ``ns/topic/segments/<name>.dnseg``.
"""

from __future__ import annotations

import abc
import os
import tempfile
import threading
from dataclasses import dataclass
from typing import Iterator

from danube.errors import StorageError


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int


class DurableBackend(abc.ABC):
    """Immutable-object store: whole-object puts, ranged gets, prefix listing."""

    @abc.abstractmethod
    def put(self, key: str, data: bytes | memoryview) -> None:
        """Store ``data`` at ``key`` atomically: readers see all of it or nothing."""

    @abc.abstractmethod
    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of the object (``end=None``: to the end)."""

    def get_self_checked(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """``get`` for a caller that checks every byte itself end to end.

        The tiered reader verifies each range's frame CRC32C checksums and offset
        sequence and each whole segment's xxh3-128 etag, so a transport checksum
        of the same bytes on top of that only costs CPU.  Backends that compute
        one (S3 clients validate a CRC32 of whole-object responses) leave it out
        here; the others just ``get``.
        """
        return self.get(key, start, end)

    @abc.abstractmethod
    def size(self, key: str) -> int | None:
        """Object size, or None if it does not exist."""

    @abc.abstractmethod
    def list(self, prefix: str) -> list[ObjectInfo]:
        """Objects whose key starts with ``prefix``, sorted by key."""

    @abc.abstractmethod
    def delete(self, key: str) -> None: ...

    #: Smallest range a streaming reader should ask for.  Object stores pay a
    #: round trip (and on some servers a whole-object read) per request, so they
    #: want fewer, larger ranges than a file system does.
    min_range_bytes: int = 0

    def describe(self) -> str:
        return type(self).__name__

    def iter_ranges(self, key: str, chunk: int, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """Stream ``[start, end)`` in chunks of ``chunk`` bytes (range reads)."""
        if end is None:
            size = self.size(key)
            if size is None:
                raise StorageError(f"object {key} not found in {self.describe()}", retriable=False)
            end = size
        pos = start
        while pos < end:
            n = min(chunk, end - pos)
            yield self.get(key, pos, pos + n)
            pos += n


def _pread_exactly(fd: int, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of ``fd`` (fewer only at end of file).

    One positioned read straight into the result (no buffered-reader copy, no
    seek); ``os.pread`` releases the GIL.  A short read is retried because a
    network file system may return less than asked before end of file.
    """
    if end <= start:
        return b""
    data = os.pread(fd, end - start, start)
    if len(data) == end - start or not data:
        return data
    parts = [data]
    pos = start + len(data)
    while pos < end:
        more = os.pread(fd, end - pos, pos)
        if not more:
            break
        parts.append(more)
        pos += len(more)
    return b"".join(parts)


class FilesystemBackend(DurableBackend):
    """A directory tree (local disk or a shared file system mount)."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        os.makedirs(self.root, exist_ok=True)

    def describe(self) -> str:
        return f"directory {self.root}"

    def _path(self, key: str) -> str:
        path = os.path.normpath(os.path.join(self.root, key))
        if not path.startswith(self.root + os.sep):
            raise StorageError(f"key {key!r} escapes the storage root", retriable=False)
        return path

    def put(self, key: str, data: bytes | memoryview) -> None:
        path = self._path(key)
        directory = os.path.dirname(path)
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fdatasync(f.fileno())
            os.replace(tmp, path)
            dfd = os.open(directory, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise StorageError(f"cannot write {path}: {exc}") from exc

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                if end is None:
                    end = os.fstat(fd).st_size
                return _pread_exactly(fd, start, end)
            finally:
                os.close(fd)
        except FileNotFoundError as exc:
            raise StorageError(f"object {key} not found in {self.describe()}", retriable=False) from exc
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc}") from exc

    def size(self, key: str) -> int | None:
        try:
            return os.stat(self._path(key)).st_size
        except FileNotFoundError:
            return None

    def list(self, prefix: str) -> list[ObjectInfo]:
        base = self._path(prefix.rstrip("/")) if prefix.strip("/") else self.root
        start_dir = base if os.path.isdir(base) else os.path.dirname(base)
        out = []
        for dirpath, _dirs, files in os.walk(start_dir):
            for name in files:
                if name.startswith(".tmp-"):
                    continue
                full = os.path.join(dirpath, name)
                key = os.path.relpath(full, self.root).replace(os.sep, "/")
                if key.startswith(prefix.lstrip("/")):
                    out.append(ObjectInfo(key, os.stat(full).st_size))
        return sorted(out, key=lambda o: o.key)

    def delete(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass


class S3Backend(DurableBackend):
    """An S3 API bucket prefix (AWS, MinIO, moto server, ...) through boto3."""

    # 16 MiB ranges: the size AWS recommends for parallel ranged GETs, and far
    # fewer requests than 4 MiB ones on servers that read the whole object per
    # range (moto does).  The tiered reader keeps several in flight.
    min_range_bytes = 16 * 1024 * 1024

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint: str | None = None,
        region: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
    ) -> None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError as exc:  # pragma: no cover - depends on extras
            raise StorageError(
                "object_store mode needs boto3: pip install 'danube-broker[s3]'", retriable=False
            ) from exc
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        options = {"retries": {"max_attempts": 5, "mode": "standard"}, "max_pool_connections": 16}

        def client(config):
            return boto3.client(
                "s3",
                endpoint_url=endpoint,
                region_name=region or "us-east-1",
                aws_access_key_id=access_key,
                aws_secret_access_key=secret_key,
                config=config,
            )

        self._client = client(Config(**options))

        def self_checked_client():
            # For ranges the caller checks itself (get_self_checked): no CRC32 of
            # the response.  botocore >= 1.36 computes one (zlib, on the calling
            # thread) for every whole-object GET that returns a checksum header:
            # as much client CPU as the rest of such a GET from a loopback server
            # (bench/storage_bench.py).  The tiered reader's frame CRC32C and
            # segment etag already cover those bytes.  Older botocore has no such
            # option and validates only when asked: the plain client is the same.
            try:
                return client(Config(**options, response_checksum_validation="when_required"))
            except TypeError:  # pragma: no cover - botocore < 1.36
                return self._client

        self._make_self_checked_client = self_checked_client
        self._self_checked = None
        self._self_checked_lock = threading.Lock()

    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key.lstrip('/')}" if self.prefix else key.lstrip("/")

    def _error(self, what: str, exc: Exception) -> StorageError:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
        missing = code in ("NoSuchKey", "404", "NotFound")
        return StorageError(f"{what} in {self.describe()} failed: {exc}", retriable=not missing)

    def put(self, key: str, data: bytes | memoryview) -> None:
        try:
            self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=bytes(data))
        except Exception as exc:  # botocore raises many types
            raise self._error(f"put {key}", exc) from exc

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return self._get(self._client, key, start, end)

    @property
    def _self_checked_client(self):
        """Made on first use: a backend that only writes (the exporter) never needs it."""
        if self._self_checked is None:
            with self._self_checked_lock:
                if self._self_checked is None:
                    self._self_checked = self._make_self_checked_client()
        return self._self_checked

    def get_self_checked(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return self._get(self._self_checked_client, key, start, end)

    def _get(self, client, key: str, start: int, end: int | None) -> bytes:
        kwargs = {}
        if start or end is not None:
            kwargs["Range"] = f"bytes={start}-" + ("" if end is None else str(end - 1))
        if end is not None and end <= start:
            return b""
        try:
            return client.get_object(Bucket=self.bucket, Key=self._key(key), **kwargs)["Body"].read()
        except Exception as exc:
            raise self._error(f"get {key}", exc) from exc

    def size(self, key: str) -> int | None:
        try:
            return self._client.head_object(Bucket=self.bucket, Key=self._key(key))["ContentLength"]
        except Exception as exc:
            code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
            if code in ("404", "NoSuchKey", "NotFound"):
                return None
            raise self._error(f"head {key}", exc) from exc

    def list(self, prefix: str) -> list[ObjectInfo]:
        out = []
        strip = len(self.prefix) + 1 if self.prefix else 0
        try:
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix)):
                for obj in page.get("Contents", []):
                    out.append(ObjectInfo(obj["Key"][strip:], obj["Size"]))
        except Exception as exc:
            raise self._error(f"list {prefix}", exc) from exc
        return sorted(out, key=lambda o: o.key)

    def delete(self, key: str) -> None:
        try:
            self._client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except Exception as exc:
            raise self._error(f"delete {key}", exc) from exc


def backend_from_url(url: str, **s3_options) -> DurableBackend:
    """``/path`` or ``file:///path`` → FilesystemBackend; ``s3://bucket/prefix`` → S3Backend."""
    if url.startswith("s3://"):
        bucket, _, prefix = url[5:].partition("/")
        return S3Backend(bucket, prefix, **s3_options)
    if url.startswith("file://"):
        url = url[7:]
    return FilesystemBackend(url)
