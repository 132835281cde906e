"""The compiled WAL files and writer against the pure-Python twin: byte-identical files."""

from __future__ import annotations

import importlib
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from danube._pure import frame as pure_frame
from danube._pure import ring as pure_ring
from danube._pure import walfile as pure_walfile
from danube.errors import CorruptFrameError, FrameFormatError, WalClosedError

try:
    core_walfile = importlib.import_module("danube._core.walfile")
    core_ring = importlib.import_module("danube._core.ring")
except ImportError:  # pragma: no cover
    core_walfile = core_ring = None

PAIRS = [(pure_walfile, pure_ring)] + ([(core_walfile, core_ring)] if core_walfile else [])
CREATED = 1_700_000_000_000


def _writer(walfile, ring, path, capacity=1 << 16, index_every=256):
    rotations = []
    seg = walfile.SegmentFile.create(str(path), 1, 0, capacity, created_ms=CREATED, index_every=index_every)

    def rotate(n):  # a single-file test writer: rotation means the test overflowed
        rotations.append(n)
        raise AssertionError("unexpected rotation")

    return walfile.LogWriter(seg, ring.FrameRing(1 << 20), rotate), seg


def _write_workload(writer, ops):
    for kind, payloads, key, attrs in ops:
        if kind == "one":
            writer.append(payloads[0], key=key, attributes=attrs, publish_time=123)
        elif kind == "many":
            writer.append_payloads(payloads, key=key, attributes=attrs, publish_time=456)
        else:
            buf = bytearray(pure_frame.encode_payloads(payloads, publish_time=789, key=key, attributes=attrs))
            writer.append_frames(buf)


OPS = st.lists(
    st.tuples(
        st.sampled_from(["one", "many", "frames"]),
        st.lists(st.binary(max_size=300), min_size=1, max_size=6),
        st.one_of(st.none(), st.text(max_size=8)),
        st.one_of(st.none(), st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2)),
    ),
    min_size=1,
    max_size=20,
)


@pytest.mark.skipif(core_walfile is None, reason="compiled walfile not built")
@settings(max_examples=40, deadline=None)
@given(ops=OPS)
def test_files_are_byte_identical(tmp_path_factory, ops):
    d = tmp_path_factory.mktemp("wf")
    files = []
    for walfile, ring in PAIRS:
        path = d / f"{walfile.__name__}.log"
        writer, seg = _writer(walfile, ring, path)
        _write_workload(writer, ops)
        files.append((path, seg.index_entries(), writer.next_offset, seg.write_pos))
        seg.close()
    (a, ia, na, wa), (b, ib, nb, wb) = files
    assert open(a, "rb").read() == open(b, "rb").read()
    assert (ia, na, wa) == (ib, nb, wb)
    # and both read the other's file the same way
    for walfile, _ring in PAIRS:
        seg, report = walfile.SegmentFile.open(str(a), index_every=256, writable=True)
        assert (seg.count, seg.write_pos, seg.index_entries(), report) == (na, wa, ia, (pure_frame.SCAN_ZERO, 0))
        if na:
            assert bytes(seg.read_frames(0, 1 << 30, na)) == open(a, "rb").read()[64:wa]
        seg.close()


@pytest.mark.parametrize("walfile,ring", PAIRS, ids=lambda m: getattr(m, "__name__", ""))
def test_header_round_trip_and_rejection(walfile, ring):
    head = walfile.encode_file_header(7, 1234, CREATED)
    assert len(head) == walfile.FILE_HEADER_SIZE == 64
    assert walfile.decode_file_header(head) == (7, 1234, CREATED)
    assert head == pure_walfile.encode_file_header(7, 1234, CREATED)
    bad = bytearray(head)
    bad[17] ^= 1
    with pytest.raises(CorruptFrameError) as info:
        walfile.decode_file_header(bad, "x")
    assert info.value.expected_crc is not None and info.value.actual_crc is not None
    with pytest.raises(CorruptFrameError):
        walfile.decode_file_header(b"NOTAWAL!" + head[8:])
    with pytest.raises(CorruptFrameError):
        walfile.decode_file_header(head[:10])
    assert walfile.segment_file_name(3) == "wal-00000000000000000003.log"
    assert walfile.parse_segment_file_name("wal-00000000000000000003.log") == 3
    assert walfile.parse_segment_file_name("wal.ckpt") is None


@pytest.mark.parametrize("walfile,ring", PAIRS, ids=lambda m: getattr(m, "__name__", ""))
def test_recovery_trims_and_reports_identically(tmp_path, walfile, ring):
    path = tmp_path / "seg.log"
    writer, seg = _writer(pure_walfile, pure_ring, path)
    for i in range(20):
        writer.append(b"%d" % i * 10, publish_time=1)
    positions = [p for _o, p in seg.index_entries()]
    end = seg.write_pos
    seg.close()
    fd = os.open(path, os.O_RDWR)
    os.pwrite(fd, b"\xff" * 5, end - 3)  # tear the last frame and leave garbage after it
    os.close(fd)
    seg, (reason, trimmed) = walfile.SegmentFile.open(str(path), index_every=256, writable=True)
    assert seg.count == 19 and reason == pure_frame.SCAN_CORRUPT
    assert seg.write_pos < end - 3 and trimmed == end + 2 - seg.write_pos
    assert seg.index_entries()[0] == (0, 64) and positions[0] == 64
    data = open(path, "rb").read()
    assert not any(data[seg.write_pos :])
    seg.close()


@pytest.mark.parametrize("walfile,ring", PAIRS, ids=lambda m: getattr(m, "__name__", ""))
def test_writer_rejects_bad_input_without_writing(tmp_path, walfile, ring):
    writer, seg = _writer(walfile, ring, tmp_path / "s.log")
    writer.append(b"ok", publish_time=1)
    pos, nxt = seg.write_pos, writer.next_offset
    bad = bytearray(pure_frame.encode_payloads([b"a"]))
    bad[20] ^= 1
    with pytest.raises(CorruptFrameError):
        writer.append_frames(bad)
    with pytest.raises(FrameFormatError):
        writer.append_frames(b"\x00" * 10)
    with pytest.raises((FrameFormatError, OverflowError)):
        writer.append(b"x", key="k" * 70000)
    with pytest.raises(ValueError):
        writer.append_payloads([])
    with pytest.raises(TypeError):
        writer.append(12345)
    assert (seg.write_pos, writer.next_offset) == (pos, nxt)
    writer.close()
    with pytest.raises(WalClosedError):
        writer.append(b"x")
    seg.close()


@pytest.mark.parametrize("walfile,ring", PAIRS, ids=lambda m: getattr(m, "__name__", ""))
def test_lazy_index_of_a_trusted_file_and_seal(tmp_path, walfile, ring):
    path = tmp_path / "s.log"
    writer, seg = _writer(walfile, ring, path)
    writer.append_payloads([b"p" * 50] * 40, publish_time=1)
    seg.seal(sync=True)
    assert os.path.getsize(path) == seg.write_pos and not seg.writable
    entries = seg.index_entries()
    seg.close()
    trusted, report = walfile.SegmentFile.open(str(path), index_every=256, trusted_count=40)
    assert trusted.count == 40 and report == (pure_frame.SCAN_END, 0)
    assert trusted.index_entries() == entries
    assert trusted.position_of(39) > trusted.position_of(0) == 64
    view = trusted.read_frames(5, 200, 40)
    assert [r.offset for r in pure_frame.iter_records(view)][0] == 5
    trusted.close()


@pytest.mark.parametrize("walfile,ring", PAIRS, ids=lambda m: getattr(m, "__name__", ""))
def test_drop_cache_empties_the_page_cache_and_keeps_every_byte(tmp_path, walfile, ring):
    from tests.support.pagecache import page_cache_droppable, resident_pages

    if not page_cache_droppable(tmp_path):
        pytest.skip("the temp dir is on tmpfs: its pages are the file")
    page = 4096
    path = tmp_path / "s.log"
    writer, seg = _writer(walfile, ring, path, capacity=4 << 20)
    for i in range(24):  # ~2.4 MB through the writer's batch path
        writer.append_payloads([bytes([i]) * 100] * 1000, publish_time=7)
    seg.sync()
    end = seg.write_pos
    stored = bytes(seg.view(0, end))
    held = seg.view(0, end)  # a reader's view across the dropped range
    before = resident_pages(path, 0, end)
    assert before >= end // page - 1  # control: what was just written is cached

    assert seg.drop_cache(100, 2 * page - 1) == 0  # no whole page inside: nothing to drop
    dropped = seg.drop_cache(0, 1 << 20)
    assert dropped == 1 << 20
    assert resident_pages(path, 0, 1 << 20) == 0
    assert resident_pages(path, 1 << 20, end) >= (end - (1 << 20)) // page - 1  # the rest stays

    assert bytes(held) == stored  # faulted back in from the file, unchanged
    assert bytes(seg.view(0, end)) == stored
    assert [r.offset for r in pure_frame.iter_records(seg.read_frames(0, 1 << 30, writer.next_offset))] == list(
        range(writer.next_offset)
    )
    assert seg.drop_cache(0, 64 << 20) == seg.capacity  # clamped to the file's capacity
    del held
    writer.close()
    seg.close()
    assert seg.drop_cache(0, 1 << 20) == 0  # closed: nothing to drop, no error
