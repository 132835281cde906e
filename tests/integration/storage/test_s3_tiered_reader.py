"""The tiered reader over a real S3 endpoint (moto server): exact streams and every check.

Its range reads use ``S3Backend.get_self_checked``, which leaves out botocore's
CRC32 of the response, so these tests show that the reader's own checks (frame
CRC32C, offset sequence, object size, segment etag) still catch each kind of
damage to an object in the bucket.
"""

from __future__ import annotations

import asyncio

import pytest

from danube import message_codec
from danube.errors import SegmentCorruptError
from danube.storage.backends import S3Backend
from danube.storage.catalog import SegmentCatalog
from danube.storage.segment import write_segment
from danube.storage.tiered_reader import DurableHistoryReader
from tests.unit.storage.conftest import TOPIC, offsets_of

SEGMENTS = ((0, 40), (40, 55), (95, 30))  # (first offset, frame count)


def _frames(first: int, count: int, fill: bytes = b"s") -> bytes:
    buf = bytearray(message_codec.encode_payloads([fill * (100 + (first + i) % 7 * 90) for i in range(count)]))
    message_codec.stamp_offsets(buf, first)
    return bytes(buf)


@pytest.fixture
def s3_history(s3_bucket):
    backend = S3Backend(
        s3_bucket.bucket,
        "history",
        endpoint=s3_bucket.endpoint,
        region=s3_bucket.region,
        access_key=s3_bucket.access_key,
        secret_key=s3_bucket.secret_key,
    )
    catalog = SegmentCatalog(None, "", TOPIC)
    descs = [write_segment(backend, TOPIC, _frames(first, count), index_every=512) for first, count in SEGMENTS]
    for desc in descs:
        catalog._append(desc)
    return backend, catalog, descs, s3_bucket.client()


async def _drain(reader: DurableHistoryReader, start: int = 0, **kwargs) -> list[int]:
    out = []
    async for piece, last in reader.stream_with_last_offsets(start, **kwargs):
        got = offsets_of(piece)
        assert got[-1] == last, "a piece's reported last offset is its last frame's"
        out.extend(got)
    return out


@pytest.mark.parametrize(
    "chunk,max_bytes,start", [(1 << 20, 1 << 20, 0), (1 << 20, 2000, 17), (3000, 700, 50), (512, 1, 94)]
)
def test_stream_over_s3_is_exact(s3_history, chunk, max_bytes, start):
    backend, catalog, _descs, _client = s3_history
    reader = DurableHistoryReader(backend, catalog, chunk_bytes=chunk, prefetch=2)
    assert asyncio.run(_drain(reader, start, max_bytes=max_bytes, chunk_bytes=chunk)) == list(range(start, 125))


def _replace_object(client, backend: S3Backend, key: str, data: bytes) -> None:
    client.put_object(Bucket=backend.bucket, Key=backend._key(key), Body=data)


def test_flipped_byte_in_an_s3_object_names_segment_and_offset(s3_history):
    backend, catalog, descs, client = s3_history
    desc = descs[1]
    data = bytearray(backend.get(desc.data_key))
    third = message_codec.frame_positions(data)[3]
    data[third + message_codec.HEADER_SIZE + 20] ^= 0x40  # inside the 4th frame's body
    _replace_object(client, backend, desc.data_key, bytes(data))
    with pytest.raises(SegmentCorruptError) as info:
        asyncio.run(_drain(DurableHistoryReader(backend, catalog)))
    assert info.value.segment_id == desc.segment_id and info.value.offset == desc.start_offset + 3
    assert desc.segment_id in str(info.value) and backend.describe() in str(info.value)


def test_valid_frames_with_other_content_fail_the_etag_over_s3(s3_history):
    """Same size, same offsets, every frame checksum valid: only the segment etag can tell."""
    backend, catalog, descs, client = s3_history
    desc = descs[0]
    first, count = SEGMENTS[0]
    other = _frames(first, count, fill=b"t")
    assert len(other) == desc.size
    _replace_object(client, backend, desc.data_key, other)
    with pytest.raises(SegmentCorruptError, match="etag mismatch") as info:
        asyncio.run(_drain(DurableHistoryReader(backend, catalog)))
    assert info.value.segment_id == desc.segment_id and info.value.expected == desc.etag


def test_truncated_s3_object_is_reported(s3_history):
    backend, catalog, descs, client = s3_history
    desc = descs[2]
    _replace_object(client, backend, desc.data_key, backend.get(desc.data_key)[:-30])
    with pytest.raises(SegmentCorruptError, match="shorter than its descriptor") as info:
        asyncio.run(_drain(DurableHistoryReader(backend, catalog), desc.start_offset))
    assert info.value.segment_id == desc.segment_id


def test_self_checked_gets_return_the_same_bytes_as_plain_gets(s3_history):
    backend, _catalog, descs, _client = s3_history
    key = descs[1].data_key
    whole = backend.get(key)
    assert backend.get_self_checked(key) == whole
    for start, end in ((0, len(whole)), (5, 900), (len(whole) - 1, len(whole)), (100, 100)):
        assert backend.get_self_checked(key, start, end) == whole[start:end]


def test_only_self_checked_gets_leave_out_the_response_checksum(s3_history):
    backend = s3_history[0]
    assert backend._client.meta.config.response_checksum_validation == "when_supported"
    assert backend._self_checked_client.meta.config.response_checksum_validation == "when_required"
