"""Durable history streamed with range reads and chained into the hot WAL: no gap, no duplicate."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from danube import message_codec
from danube.storage.tiered_reader import DurableHistoryReader, split_frames
from tests.unit.storage.conftest import TOPIC, append, make_config, offsets_of, payload, read_all


async def _exported_topic(tmp_path, factories, count=80, size=200):
    cfg = make_config(tmp_path)
    storage = await factories(cfg).open_topic(TOPIC)
    await append(storage, 0, count, size)
    await storage.exporter.export_rotated()
    return cfg, storage


async def test_reader_chains_durable_history_into_the_hot_wal(tmp_path, factories):
    cfg, storage = await _exported_topic(tmp_path, factories)
    durable_end = storage.durable_end
    storage.wal.prune_through(durable_end)  # the local copy of the exported prefix is gone
    assert storage.hot_start == durable_end + 1
    records = await read_all(storage, 3, 79, max_bytes=1000)
    assert [r.offset for r in records] == list(range(3, 80))
    assert [bytes(r.payload) for r in records] == [payload(i) for i in range(3, 80)]


async def test_tail_follows_live_appends_after_the_chain(tmp_path, factories):
    cfg, storage = await _exported_topic(tmp_path, factories, count=40)
    storage.wal.prune_through(storage.durable_end)
    got = []

    async def consume():
        async for piece in storage.tail_frames(0, 4096):
            got.extend(offsets_of(piece))
            if got[-1] >= 44:
                return

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    await append(storage, 40, 5)
    await asyncio.wait_for(task, 10)
    assert got == list(range(0, 45))


async def test_read_frames_switches_tier_at_hot_start(tmp_path, factories):
    cfg, storage = await _exported_topic(tmp_path, factories)
    storage.wal.prune_through(storage.durable_end)
    hot = storage.hot_start
    below = await storage.read_frames(hot - 2, 1 << 20)
    assert offsets_of(below) == [hot - 2, hot - 1], "a durable read stops at the hot start"
    above = await storage.read_frames(hot, 1 << 20)
    assert offsets_of(above)[0] == hot
    small = await storage.read_frames(0, 300)
    assert offsets_of(small) == [0], "max_bytes is respected (one frame ~240 bytes)"


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    chunk=st.integers(min_value=40, max_value=3000),
    start=st.integers(min_value=0, max_value=60),
    max_bytes=st.integers(min_value=1, max_value=5000),
    prefetch=st.integers(min_value=0, max_value=3),
)
def test_stream_is_exact_for_any_chunking(tmp_path_factory, chunk, start, max_bytes, prefetch):
    """Ranges cut anywhere (inside headers or bodies) still give every frame once, in order."""
    from danube.storage.backends import FilesystemBackend
    from danube.storage.catalog import SegmentCatalog
    from danube.storage.segment import write_segment

    root = tmp_path_factory.mktemp("seg")
    backend = FilesystemBackend(str(root))
    catalog = SegmentCatalog(None, "", TOPIC)
    sizes = [10, 700, 3, 1500, 64]
    offset = 0
    for n in (17, 25, 22):
        buf = bytearray(message_codec.encode_payloads([b"v" * sizes[(offset + i) % 5] for i in range(n)]))
        message_codec.stamp_offsets(buf, offset)
        catalog._append(write_segment(backend, TOPIC, bytes(buf), index_every=512))
        offset += n
    reader = DurableHistoryReader(backend, catalog, chunk_bytes=chunk, prefetch=prefetch)

    async def run():
        out = []
        async for piece in reader.stream(start, None, max_bytes=max_bytes):
            assert len(piece) <= max_bytes or len(offsets_of(piece)) == 1
            out.extend(offsets_of(piece))
        return out

    assert asyncio.run(run()) == list(range(start, offset))


def test_split_frames_respects_max_bytes():
    buf = message_codec.encode_payloads([b"x" * n for n in (10, 100, 1000, 5, 5, 5)])
    for limit in (1, 50, 200, 1100, 5000):
        pieces = split_frames(buf, limit)
        assert b"".join(bytes(p) for p in pieces) == bytes(buf)
        for p in pieces:
            assert len(p) <= limit or len(offsets_of(p)) == 1


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=1200), min_size=1, max_size=30),
    every=st.integers(min_value=0, max_value=4000),
    max_bytes=st.integers(min_value=1, max_value=5000),
)
def test_split_frames_at_marks_is_exact(sizes, every, max_bytes):
    """Cut at the scan's marks (or frame by frame between distant marks): same bytes, right last offsets."""
    from danube.storage.tiered_reader import split_frames_at

    buf = bytearray(message_codec.encode_payloads([b"y" * n for n in sizes]))
    message_codec.stamp_offsets(buf, 1000)
    _count, _end, _first, last, _reason, index = message_codec.scan(buf, 0, 1000, every)
    pieces = split_frames_at(buf, [(pos, off) for off, pos in index], last, max_bytes)
    assert b"".join(bytes(p) for p, _ in pieces) == bytes(buf)
    for piece, piece_last in pieces:
        got = offsets_of(piece)
        assert got and got[-1] == piece_last
        assert len(piece) <= max_bytes or len(got) == 1
