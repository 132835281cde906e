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


def _linux_populate_write() -> bool:
    import platform
    import sys

    if not sys.platform.startswith("linux"):
        return False
    major, minor = (int(x) for x in platform.release().split(".")[:2])
    return (major, minor) >= (5, 14)


SYNC_OPS = st.lists(
    st.tuples(st.sampled_from(["append", "sync", "rearm"]), st.integers(min_value=0, max_value=5000)),
    min_size=1,
    max_size=25,
)


@pytest.mark.skipif(core_walfile is None, reason="compiled walfile not built")
@settings(max_examples=25, deadline=None)
@given(ops=SYNC_OPS)
def test_appends_around_syncs_and_rearms_write_identical_files_that_reopen(tmp_path_factory, ops):
    """Rearming the tail after a sync changes no byte: both twins write the same file whatever
    the syncs and rearms between appends, and it reopens with every record."""
    d = tmp_path_factory.mktemp("rearm")
    files = []
    for walfile, ring in PAIRS:
        path = d / f"{walfile.__name__}.log"
        writer, seg = _writer(walfile, ring, path, capacity=1 << 18)
        for kind, n in ops:
            if kind == "append":
                writer.append_frames(bytearray(pure_frame.encode_payloads([b"r" * (n % 900)] * (1 + n % 7))))
            elif kind == "sync":
                seg.sync()
            else:
                before = bytes(seg.view(0, seg.capacity))
                seg.rearm(n)
                assert bytes(seg.view(0, seg.capacity)) == before
        seg.sync()
        files.append((path, writer.next_offset, seg.write_pos))
        seg.close()
    (a, na, wa), (b, nb, wb) = files
    assert (na, wa) == (nb, wb)
    assert open(a, "rb").read() == open(b, "rb").read()
    for walfile, _ring in PAIRS:
        seg, report = walfile.SegmentFile.open(str(b), index_every=256, writable=True)
        assert (seg.count, seg.write_pos, report) == (na, wa, (pure_frame.SCAN_ZERO, 0))
        seg.close()


@pytest.mark.skipif(not _linux_populate_write(), reason="MADV_POPULATE_WRITE needs Linux 5.14")
@pytest.mark.parametrize("walfile,ring", PAIRS, ids=lambda m: getattr(m, "__name__", ""))
def test_rearm_covers_the_tail_page_only_where_the_writer_may_write(tmp_path, walfile, ring):
    page = 4096
    writer, seg = _writer(walfile, ring, tmp_path / "s.log", capacity=4 * page)
    assert seg.rearm() is True  # the header's page: the write position is inside it
    fill = page - 64 - len(pure_frame.encode_payloads([b""]))
    writer.append_frames(bytearray(pure_frame.encode_payloads([b"x" * fill])))
    assert seg.write_pos == page  # the next append starts a fresh page
    seg.sync()
    assert seg.rearm() is False  # nothing of that page was written back
    assert seg.rearm(ahead=64 * page) is True  # ahead of the writer: clamped to its capacity
    assert os.path.getsize(tmp_path / "s.log") == 4 * page
    writer.append_frames(bytearray(pure_frame.encode_payloads([b"y" * 10])))
    seg.sync()
    assert seg.rearm() is True
    writer.close()
    seg.close()
    assert seg.rearm() is False  # closed: nothing to do, no error
    ro, _report = walfile.SegmentFile.open(str(tmp_path / "s.log"), index_every=256)
    assert ro.rearm() is False  # read-only mapping
    assert [r.payload for r in pure_frame.iter_records(ro.read_frames(0, 1 << 20, 2))] == [
        b"x" * fill,
        b"y" * 10,
    ]
    ro.close()


@pytest.mark.skipif(core_walfile is None or not _linux_populate_write(), reason="compiled, Linux 5.14+")
def test_rearm_after_a_sync_spares_the_next_append_its_page_fault(tmp_path):
    """The point of rearm: after a sync wrote the tail page back (and write-protected it), the
    writer's next store into it takes no fault on the writer's thread."""
    import resource

    from tests.support.pagecache import page_cache_droppable

    if not page_cache_droppable(tmp_path):
        pytest.skip("tmpfs: no writeback, no write-protected pages")
    batch = pure_frame.encode_payloads([b"z" * 100, b"z" * 100])

    def faults_per_round(rearm: bool) -> float:
        writer, seg = _writer(core_walfile, core_ring, tmp_path / f"f{rearm}.log", capacity=1 << 20)
        writer.append_frames(bytearray(batch))
        faults = 0
        for _ in range(40):
            seg.sync()
            if rearm:
                seg.rearm(1024)
            before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            writer.append_frames(bytearray(batch))
            faults += resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before
        seg.close()
        return faults / 40

    assert faults_per_round(False) > 0.5  # control: a synced tail page faults on the next store
    assert faults_per_round(True) < 0.2


@pytest.mark.parametrize("walfile,ring", PAIRS, ids=lambda m: getattr(m, "__name__", ""))
def test_the_writer_tells_whether_its_last_append_went_through_the_mapping(tmp_path, walfile, ring):
    """The WAL rearms the tail after a sync only for a writer that stores through the mapping;
    the compiled one pwrites batches of 16 KiB and more (the pure one stores everything)."""
    writer, seg = _writer(walfile, ring, tmp_path / "s.log", capacity=1 << 20)
    assert writer.last_stored is False  # nothing appended yet
    writer.append_frames(bytearray(pure_frame.encode_payloads([b"s" * 100])))
    assert writer.last_stored is True
    writer.append_payloads([b"b" * 1000] * 40)
    assert writer.last_stored is (walfile is pure_walfile)
    writer.append(b"one")
    assert writer.last_stored is True
    writer.close()
    seg.close()


@pytest.mark.skipif(not _linux_populate_write(), reason="MADV_POPULATE_WRITE needs Linux 5.14")
@pytest.mark.parametrize("walfile,ring", PAIRS, ids=lambda m: getattr(m, "__name__", ""))
def test_rearm_many_rearms_each_file_as_rearm_would_and_changes_no_byte(tmp_path, walfile, ring):
    """One call for a round's files: the ones rearm would do are counted, a closed or page-aligned
    one is skipped, no byte changes, and the files reopen with every record."""
    page = 4096
    made = []
    for i in range(5):
        writer, seg = _writer(walfile, ring, tmp_path / f"{i}.log", capacity=4 * page)
        writer.append_frames(bytearray(pure_frame.encode_payloads([b"y" * (100 + i)] * (i + 1))))
        seg.sync()
        made.append((writer, seg))
    closed = made[4][1]
    closed.close()
    before = [bytes(seg.view(0, seg.capacity)) for _w, seg in made[:4]]
    assert walfile.rearm_many([seg for _w, seg in made], 0) == 4
    assert walfile.rearm_many([], 0) == 0
    assert [bytes(seg.view(0, seg.capacity)) for _w, seg in made[:4]] == before
    for i, (writer, seg) in enumerate(made[:4]):
        count = seg.count
        seg.close()
        again, report = walfile.SegmentFile.open(str(tmp_path / f"{i}.log"), index_every=256, writable=True)
        assert (again.count, report) == (count, (pure_frame.SCAN_ZERO, 0))
        again.close()
