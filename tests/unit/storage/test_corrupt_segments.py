"""A corrupt segment is an error naming the segment and offset, never skipped."""

from __future__ import annotations

import json
import os

import pytest

from danube.errors import SegmentCorruptError
from danube.metadata import keys
from danube.storage.catalog import SegmentCatalog
from danube.storage.tiered_reader import DurableHistoryReader
from tests.unit.storage.conftest import TOPIC, append, make_config


async def _setup(tmp_path, factories):
    cfg = make_config(tmp_path)
    storage = await factories(cfg).open_topic(TOPIC)
    await append(storage, 0, 50)
    descs = await storage.exporter.export_rotated()
    storage.wal.prune_through(storage.durable_end)
    return cfg, storage, descs


def _data_path(cfg, desc):
    return os.path.join(cfg.durable.root, desc.data_key)


async def _drain(reader, start=0):
    out = []
    async for piece in reader.stream(start):
        out.append(piece)
    return out


async def test_flipped_payload_byte_names_segment_and_offset(tmp_path, factories):
    cfg, storage, descs = await _setup(tmp_path, factories)
    desc = descs[1]
    path = _data_path(cfg, desc)
    data = bytearray(open(path, "rb").read())
    frame_size = len(data) // desc.record_count
    data[3 * frame_size + 100] ^= 0xFF  # inside the 4th frame's payload
    open(path, "wb").write(bytes(data))
    with pytest.raises(SegmentCorruptError) as info:
        await _drain(storage.history)
    err = info.value
    assert err.segment_id == desc.segment_id and err.offset == desc.start_offset + 3
    assert desc.segment_id in str(err) and f"offset {desc.start_offset + 3}" in str(err)
    with pytest.raises(SegmentCorruptError):
        await storage.read_frames(desc.start_offset + 3, 1 << 20)


async def test_damaged_offset_field_breaks_the_sequence_check(tmp_path, factories):
    cfg, storage, descs = await _setup(tmp_path, factories)
    desc = descs[0]
    path = _data_path(cfg, desc)
    data = bytearray(open(path, "rb").read())
    frame_size = len(data) // desc.record_count
    data[2 * frame_size] ^= 0x01  # offset field (not covered by the frame CRC)
    open(path, "wb").write(bytes(data))
    with pytest.raises(SegmentCorruptError) as info:
        await _drain(storage.history)
    assert info.value.offset == 2


async def test_etag_mismatch_is_reported(tmp_path, factories, metadata):
    cfg, storage, descs = await _setup(tmp_path, factories)
    desc = descs[0]
    key = keys.storage_segment(cfg.metadata_prefix, TOPIC, desc.start_offset)
    raw = json.loads((await metadata.get(key)).value)
    raw["etag"] = "0" * 32
    await metadata.put(key, json.dumps(raw).encode())
    catalog = await SegmentCatalog.load(metadata, cfg.metadata_prefix, TOPIC)
    reader = DurableHistoryReader(cfg.make_backend(), catalog)
    with pytest.raises(SegmentCorruptError, match="etag mismatch") as info:
        await _drain(reader)
    assert info.value.segment_id == desc.segment_id and info.value.expected == "0" * 32


async def test_truncated_object_is_reported(tmp_path, factories):
    cfg, storage, descs = await _setup(tmp_path, factories)
    desc = descs[1]
    path = _data_path(cfg, desc)
    data = open(path, "rb").read()
    open(path, "wb").write(data[:-50])
    with pytest.raises(SegmentCorruptError, match="shorter than its descriptor") as info:
        await _drain(storage.history, desc.start_offset)
    assert info.value.segment_id == desc.segment_id


async def test_missing_object_is_a_storage_error(tmp_path, factories):
    from danube.errors import StorageError

    cfg, storage, descs = await _setup(tmp_path, factories)
    os.unlink(_data_path(cfg, descs[0]))
    with pytest.raises(StorageError, match="not found"):
        await storage.read_frames(0, 1024)
