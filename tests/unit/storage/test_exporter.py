"""Export of rotated WAL files, crash between the steps, and resume without duplicates or gaps."""

from __future__ import annotations

import json

import pytest

from danube.errors import StorageError
from danube.metadata import keys
from danube.storage.backends import FilesystemBackend
from danube.storage.catalog import SegmentCatalog
from danube.storage.segment import list_segments, read_segment, topic_prefix
from tests.unit.storage.conftest import TOPIC, append, make_config, offsets_of


class CrashingBackend(FilesystemBackend):
    """A real directory backend that fails (like a process dying) when a chosen object is written."""

    def __init__(self, root, crash_on_suffix):
        super().__init__(root)
        self.crash_on_suffix = crash_on_suffix
        self.crashes = 0

    def put(self, key, data):
        if self.crash_on_suffix and key.endswith(self.crash_on_suffix):
            self.crashes += 1
            raise StorageError(f"simulated crash before writing {key}")
        super().put(key, data)


class CrashingMetadata:
    """Wraps the real metadata store; fails writes of segment descriptors while armed."""

    def __init__(self, inner, key_part):
        self.inner = inner
        self.key_part = key_part
        self.armed = True

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def put(self, key, value):
        if self.armed and self.key_part in key:
            raise StorageError(f"simulated crash before writing {key}")
        return await self.inner.put(key, value)

    async def put_if_version(self, key, value, expected_version):
        if self.armed and self.key_part in key:
            raise StorageError(f"simulated crash before writing {key}")
        return await self.inner.put_if_version(key, value, expected_version)

    async def put_json(self, key, value):
        return await self.put(key, json.dumps(value, separators=(",", ":"), sort_keys=True).encode())


def assert_contiguous(descs, first=0):
    expected = first
    for d in descs:
        assert d.start_offset == expected, f"segment {d.segment_id} should start at {expected}"
        expected = d.end_offset + 1
    return expected - 1


async def test_rotated_files_become_segments_with_catalog_and_cur(tmp_path, factories, metadata):
    cfg = make_config(tmp_path)
    storage = await factories(cfg).open_topic(TOPIC)
    await append(storage, 0, 60)
    rotated = storage.wal.rotated_files()
    assert len(rotated) >= 2
    descs = await storage.exporter.export_rotated()
    assert [(d.start_offset, d.end_offset) for d in descs] == [(f.first_offset, f.last_offset) for f in rotated]
    backend = cfg.make_backend()
    listed = list_segments(backend, topic_prefix(TOPIC))
    assert [d.segment_id for d in listed] == [d.segment_id for d in descs]
    for d in descs:
        data = read_segment(backend, d)  # etag and checksums verified
        assert offsets_of(data) == list(range(d.start_offset, d.end_offset + 1))
        assert d.offset_index[0] == [d.start_offset, 0]
        stored = await metadata.get(keys.storage_segment(cfg.metadata_prefix, TOPIC, d.start_offset))
        assert json.loads(stored.value)["etag"] == d.etag
    cur = await metadata.get_json(keys.storage_segments_cur(cfg.metadata_prefix, TOPIC))
    assert cur == {"start": keys.offset20(descs[-1].start_offset)}
    assert await storage.exporter.export_rotated() == [], "nothing exported twice"


async def test_crash_between_data_upload_and_sidecar_leaves_no_descriptor(tmp_path, factories, metadata):
    cfg = make_config(tmp_path)
    backend = CrashingBackend(cfg.durable.root, ".dnseg.json")
    storage = await factories(cfg, backend=backend).open_topic(TOPIC)
    await append(storage, 0, 60)
    with pytest.raises(StorageError, match="simulated crash"):
        await storage.exporter.export_rotated()
    assert backend.crashes == 1
    # The data object exists, but nothing describes it: no sidecar, no metadata descriptor, no cur.
    assert [o.key for o in backend.list(topic_prefix(TOPIC)) if o.key.endswith(".dnseg")]
    assert list_segments(backend, topic_prefix(TOPIC)) == []
    assert await metadata.get_prefix(keys.storage_segments(cfg.metadata_prefix, TOPIC)) == []
    await storage.close()

    # Restart: the exporter resumes from the (empty) catalog and redoes the range exactly.
    healthy = FilesystemBackend(cfg.durable.root)
    again = await factories(cfg, backend=healthy).open_topic(TOPIC)
    descs = await again.exporter.export_through(again.next_offset - 1)
    assert assert_contiguous(descs) == 59
    listed = list_segments(healthy, topic_prefix(TOPIC))
    assert [(d.start_offset, d.end_offset) for d in listed] == [(d.start_offset, d.end_offset) for d in descs]
    data_keys = [o.key for o in healthy.list(topic_prefix(TOPIC)) if o.key.endswith(".dnseg")]
    assert len(data_keys) == len(descs), "no orphan object and no duplicate range"


async def test_crash_between_sidecar_and_metadata_descriptor(tmp_path, factories, metadata):
    cfg = make_config(tmp_path)
    crashing = CrashingMetadata(metadata, "/segments/")
    storage = await factories(cfg).open_topic(TOPIC)
    storage.exporter.catalog.metadata = crashing
    await append(storage, 0, 40)
    # The seal's tail export crashes after the upload: a complete object, but no metadata descriptor.
    with pytest.raises(StorageError, match="simulated crash"):
        await storage.seal()
    assert not storage.sealed, "a failed seal keeps the topic here and writable"
    await append(storage, 40, 25)  # history grows past the orphan's range
    await storage.close()
    backend = cfg.make_backend()
    orphans = list_segments(backend, topic_prefix(TOPIC))
    assert orphans, "the crashed upload left an uncatalogued object behind"

    again = await factories(cfg).open_topic(TOPIC)  # reconcile runs on open
    descs = await again.exporter.export_through(again.next_offset - 1)
    assert assert_contiguous(descs) == 64
    listed = list_segments(backend, topic_prefix(TOPIC))
    assert [d.segment_id for d in listed] == [d.segment_id for d in descs], (
        "a backend listing (as Spark reads it) shows each offset exactly once"
    )


async def test_crash_between_descriptor_and_cur_is_repaired_on_load(tmp_path, factories, metadata):
    cfg = make_config(tmp_path)
    storage = await factories(cfg).open_topic(TOPIC)
    await append(storage, 0, 60)
    descs = await storage.exporter.export_rotated()
    # Simulate: the last descriptor was written but the process died before cur moved.
    await metadata.put_json(
        keys.storage_segments_cur(cfg.metadata_prefix, TOPIC), {"start": keys.offset20(descs[0].start_offset)}
    )
    catalog = await SegmentCatalog.load(metadata, cfg.metadata_prefix, TOPIC)
    assert catalog.end_offset == descs[-1].end_offset
    cur = await metadata.get_json(keys.storage_segments_cur(cfg.metadata_prefix, TOPIC))
    assert cur == {"start": keys.offset20(descs[-1].start_offset)}


async def test_restarted_exporter_neither_skips_nor_duplicates(tmp_path, factories):
    cfg = make_config(tmp_path)
    storage = await factories(cfg).open_topic(TOPIC)
    await append(storage, 0, 50)
    first_batch = await storage.exporter.export_rotated()
    await storage.close()
    again = await factories(cfg).open_topic(TOPIC)
    await append(again, 50, 50)
    second_batch = await again.exporter.export_rotated()
    assert second_batch and second_batch[0].start_offset == first_batch[-1].end_offset + 1
    backend = cfg.make_backend()
    assert_contiguous(list_segments(backend, topic_prefix(TOPIC)))


async def test_non_contiguous_catalog_is_reported(tmp_path, factories, metadata):
    cfg = make_config(tmp_path)
    storage = await factories(cfg).open_topic(TOPIC)
    await append(storage, 0, 60)
    descs = await storage.exporter.export_rotated()
    assert len(descs) >= 3
    await metadata.delete(keys.storage_segment(cfg.metadata_prefix, TOPIC, descs[1].start_offset))
    with pytest.raises(StorageError, match="not contiguous"):
        await SegmentCatalog.load(metadata, cfg.metadata_prefix, TOPIC)
