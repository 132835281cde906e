"""FilesystemBackend ranged reads (positioned reads) and the backends' range-size hint."""

from __future__ import annotations

import asyncio

import pytest

from danube import message_codec
from danube.errors import StorageError
from danube.storage.backends import FilesystemBackend, S3Backend
from danube.storage.catalog import SegmentCatalog
from danube.storage.segment import write_segment
from danube.storage.tiered_reader import DurableHistoryReader
from tests.unit.storage.conftest import TOPIC, offsets_of

CONTENT = bytes(range(256)) * 40  # 10240 bytes, every position distinct mod 256


@pytest.fixture
def backend(tmp_path):
    fs = FilesystemBackend(str(tmp_path / "root"))
    fs.put("ns/t/obj", CONTENT)
    return fs


@pytest.mark.parametrize("start,end", [(0, None), (0, 10240), (5, 6), (100, 9000), (10000, None), (10239, 10240)])
def test_get_returns_exactly_the_range(backend, start, end):
    assert backend.get("ns/t/obj", start, end) == CONTENT[start:end]


def test_get_past_the_end_returns_what_exists(backend):
    assert backend.get("ns/t/obj", 10000, 20000) == CONTENT[10000:]
    assert backend.get("ns/t/obj", 20000, 30000) == b""
    assert backend.get("ns/t/obj", 50, 50) == b""


def test_get_missing_object_is_a_non_retriable_storage_error(backend):
    with pytest.raises(StorageError) as err:
        backend.get("ns/t/missing", 0, 10)
    assert not err.value.retriable
    assert "ns/t/missing" in str(err.value)


def test_get_rejects_keys_outside_the_root(backend):
    with pytest.raises(StorageError, match="escapes"):
        backend.get("../outside", 0, 10)


def test_object_stores_ask_for_larger_ranges_than_file_systems():
    assert FilesystemBackend.min_range_bytes == 0
    assert S3Backend.min_range_bytes >= 8 * 1024 * 1024


class RecordingBackend(FilesystemBackend):
    """A real directory backend that remembers the ranges asked of it."""

    min_range_bytes = 0

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.ranges: list[tuple[int, int | None]] = []

    def get(self, key, start=0, end=None):
        self.ranges.append((start, end))
        return super().get(key, start, end)


def _one_segment(tmp_path, backend_cls, min_range: int):
    backend = backend_cls(str(tmp_path / "seg"))
    backend.min_range_bytes = min_range
    catalog = SegmentCatalog(None, "", TOPIC)
    buf = bytearray(message_codec.encode_payloads([b"m" * 300 for _ in range(60)]))
    message_codec.stamp_offsets(buf, 0)
    catalog._append(write_segment(backend, TOPIC, bytes(buf), index_every=512))
    return backend, catalog, len(buf)


async def _stream(reader, **kwargs):
    out = []
    async for piece in reader.stream(0, None, **kwargs):
        out.extend(offsets_of(piece))
    return out


def test_stream_uses_the_backends_minimum_range_size(tmp_path):
    backend, catalog, size = _one_segment(tmp_path, RecordingBackend, min_range=1 << 20)
    reader = DurableHistoryReader(backend, catalog, chunk_bytes=1024, prefetch=2)
    assert asyncio.run(_stream(reader)) == list(range(60))
    assert backend.ranges == [(0, size)], "one range covering the whole segment, not 1 KiB ones"


def test_stream_uses_chunk_bytes_when_the_backend_has_no_minimum(tmp_path):
    backend, catalog, size = _one_segment(tmp_path, RecordingBackend, min_range=0)
    reader = DurableHistoryReader(backend, catalog, chunk_bytes=1024, prefetch=2)
    assert asyncio.run(_stream(reader)) == list(range(60))
    assert len(backend.ranges) > 10
    assert all(end - start <= 1024 for start, end in backend.ranges)
    assert backend.ranges[0][0] == 0 and backend.ranges[-1][1] == size
    assert all(a[1] == b[0] for a, b in zip(backend.ranges, backend.ranges[1:])), "contiguous, no overlap"
