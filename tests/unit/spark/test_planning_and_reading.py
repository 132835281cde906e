"""The data source's driver planning and executor decoding, without Spark (real files, real codec)."""

from __future__ import annotations

import datetime

import pyarrow as pa
import pytest

from danube import message_codec
from danube.errors import InvalidArgumentError, SegmentCorruptError
from danube.spark import arrow, planning
from danube.spark.reading import read_batches, read_partition
from danube.storage import segment as seg
from danube.storage.backends import DurableBackend, FilesystemBackend

TOPIC = "/default/events"
EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


class CountingBackend(DurableBackend):
    """A real directory, read through ranged gets (like S3), recording which objects were read.

    A plain FilesystemBackend is read through mmap instead; both paths are tested.
    """

    def __init__(self, root):
        self._fs = FilesystemBackend(root)
        self.gets: list[tuple[str, int, int | None]] = []

    def get(self, key, start=0, end=None):
        self.gets.append((key, start, end))
        return self._fs.get(key, start, end)

    def put(self, key, data):
        self._fs.put(key, data)

    def size(self, key):
        return self._fs.size(key)

    def list(self, prefix):
        return self._fs.list(prefix)

    def delete(self, key):
        self._fs.delete(key)


def make_records(base, count, t0=1_000):
    out = []
    for i in range(count):
        n = base + i
        key = None if n % 7 == 0 else f"key-{n % 5}"
        attrs = {"n": str(n), "ü": "ß"} if n % 3 == 0 else {}
        payload = (f"payload-{n}-" + "x" * (n % 300)).encode()
        out.append((t0 + n * 10, 42 + n % 2, key, attrs, payload))
    return out


def write_topic(backend, topic=TOPIC, segments=((0, 50), (50, 50), (100, 400))):
    written = []
    descs = []
    for base, count in segments:
        records = make_records(base, count)
        data = message_codec.encode_records(records, base_offset=base)
        descs.append(seg.write_segment(backend, topic, data, index_every=2048))
        written.extend((base + i, *r) for i, r in enumerate(records))
    return descs, written


def rows_of(batches):
    table = pa.Table.from_batches(batches, schema=arrow.ARROW_SCHEMA)
    out = []
    for row in table.to_pylist():
        millis = (row["publish_time"] - EPOCH) // datetime.timedelta(milliseconds=1)
        out.append(
            (row["offset"], millis, row["producer_id"], row["routing_key"], dict(row["attributes"]), row["payload"])
        )
    return out


def expected_rows(written):
    return [(o, t, p, k, a or {}, pl) for o, t, p, k, a, pl in written]


def read_all(options, backend):
    descs = planning.list_descriptors(options, backend)
    reads = planning.plan(options, descs)
    batches = [b for r in reads for b in read_batches(r, backend, verify=options.verify)]
    return reads, batches


@pytest.mark.parametrize("backend_type", [CountingBackend, FilesystemBackend])
def test_every_record_read_back_equals_what_was_written(tmp_path, backend_type):
    backend = backend_type(str(tmp_path))
    _, written = write_topic(backend)
    options = planning.ReadOptions.parse({"path": str(tmp_path), "topic": TOPIC})
    reads, batches = read_all(options, backend)
    assert len(reads) == 3 and all(r.whole for r in reads)
    assert all(b.schema.equals(arrow.ARROW_SCHEMA) for b in batches)
    assert rows_of(batches) == expected_rows(written)
    assert {b.column("topic")[0].as_py() for b in batches} == {TOPIC}


def test_large_segment_splits_on_the_offset_index(tmp_path):
    backend = CountingBackend(str(tmp_path))
    descs, written = write_topic(backend)
    big = descs[2]
    assert len(big.offset_index) > 4
    options = planning.ReadOptions.parse(
        {"path": str(tmp_path), "topic": TOPIC, "maxPartitionBytes": str(big.size // 3), "batchBytes": "4096"}
    )
    reads, batches = read_all(options, backend)
    pieces = [r for r in reads if r.segment_id == big.segment_id]
    assert len(pieces) >= 3 and not any(p.whole for p in pieces)
    # pieces tile the segment exactly
    assert pieces[0].byte_start == 0 and pieces[-1].byte_end == big.size
    assert all(a.byte_end == b.byte_start for a, b in zip(pieces, pieces[1:]))
    assert rows_of(batches) == expected_rows(written)


def test_offset_range_pruning_reads_no_excluded_segment(tmp_path):
    backend = CountingBackend(str(tmp_path))
    descs, written = write_topic(backend)
    options = planning.ReadOptions.parse(
        {"path": str(tmp_path), "topic": TOPIC, "startOffset": "60", "endOffset": "90"}
    )
    backend.gets.clear()
    descriptors = planning.list_descriptors(options, backend)
    reads = planning.plan(options, descriptors)
    backend.gets.clear()  # listing reads the sidecars only
    batches = [b for r in reads for b in read_batches(r, backend)]
    assert [k for k, _s, _e in backend.gets] == [descs[1].data_key]
    assert [r[0] for r in rows_of(batches)] == list(range(60, 90))


def test_offset_range_inside_a_large_segment_reads_only_its_index_interval(tmp_path):
    backend = CountingBackend(str(tmp_path))
    descs, written = write_topic(backend)
    big = descs[2]
    options = planning.ReadOptions.parse(
        {"path": str(tmp_path), "topic": TOPIC, "startOffset": "300", "endOffset": "310", "maxPartitionBytes": "8192"}
    )
    reads, batches = read_all(options, backend)
    assert [r[0] for r in rows_of(batches)] == list(range(300, 310))
    data_reads = [(s, e) for k, s, e in backend.gets if k == big.data_key]
    assert sum(e - s for s, e in data_reads) < big.size // 4


def test_time_range_pruning(tmp_path):
    backend = CountingBackend(str(tmp_path))
    descs, written = write_topic(backend)
    # publish_time = 1000 + offset*10 → [1500, 1600) is offsets 50..59, all in segment 2
    options = planning.ReadOptions.parse(
        {"path": str(tmp_path), "topic": TOPIC, "startTime": "1500", "endTime": "1970-01-01T00:00:01.600Z"}
    )
    reads, batches = read_all(options, backend)
    assert [r.segment_id for r in reads] == [descs[1].segment_id]
    assert [r[0] for r in rows_of(batches)] == list(range(50, 60))


@pytest.mark.parametrize("backend_type", [CountingBackend, FilesystemBackend])
def test_corrupt_but_excluded_segment_is_never_opened_and_included_one_fails_clearly(tmp_path, backend_type):
    backend = backend_type(str(tmp_path))
    descs, _ = write_topic(backend)
    path = tmp_path / descs[0].data_key
    raw = bytearray(path.read_bytes())
    raw[200] ^= 0xFF
    path.write_bytes(bytes(raw))
    ok = planning.ReadOptions.parse({"path": str(tmp_path), "topic": TOPIC, "startOffset": "50"})
    _, batches = read_all(ok, backend)
    assert rows_of(batches)[0][0] == 50
    bad = planning.ReadOptions.parse({"path": str(tmp_path), "topic": TOPIC})
    with pytest.raises(SegmentCorruptError) as err:
        read_all(bad, backend)
    assert err.value.segment_id == descs[0].segment_id
    assert err.value.offset is not None and 0 <= err.value.offset < 50
    assert descs[0].segment_id in str(err.value) and f"offset {err.value.offset}" in str(err.value)


def test_corruption_inside_a_split_piece_names_segment_and_offset(tmp_path):
    backend = CountingBackend(str(tmp_path))
    descs, _ = write_topic(backend)
    big = descs[2]
    path = tmp_path / big.data_key
    raw = bytearray(path.read_bytes())
    off, pos = big.offset_index[2]
    raw[pos + 40] ^= 0x01  # inside the body of the frame with offset `off`
    path.write_bytes(bytes(raw))
    options = planning.ReadOptions.parse(
        {"path": str(tmp_path), "topic": TOPIC, "maxPartitionBytes": "4096", "startOffset": "100"}
    )
    with pytest.raises(SegmentCorruptError) as err:
        read_all(options, backend)
    assert err.value.segment_id == big.segment_id and err.value.offset == off


@pytest.mark.parametrize("backend_type", [CountingBackend, FilesystemBackend])
def test_truncated_segment_is_a_clear_error(tmp_path, backend_type):
    backend = backend_type(str(tmp_path))
    descs, _ = write_topic(backend)
    path = tmp_path / descs[1].data_key
    path.write_bytes(path.read_bytes()[:-10])
    options = planning.ReadOptions.parse(
        {"path": str(tmp_path), "topic": TOPIC, "startOffset": "50", "endOffset": "100"}
    )
    with pytest.raises(SegmentCorruptError, match=descs[1].segment_id):
        read_all(options, backend)


def test_overlapping_reexport_is_not_read_twice(tmp_path):
    backend = CountingBackend(str(tmp_path))
    _, written = write_topic(backend, segments=((0, 50), (50, 50)))
    # a later export covering 40..79 (e.g. after a handoff) overlaps both
    records = [r[1:] for r in written[40:80]]
    seg.write_segment(backend, TOPIC, message_codec.encode_records(records, base_offset=40))
    options = planning.ReadOptions.parse({"path": str(tmp_path), "topic": TOPIC})
    _, batches = read_all(options, backend)
    assert [r[0] for r in rows_of(batches)] == list(range(100))


def test_all_topics_under_a_root_and_incomplete_uploads_ignored(tmp_path):
    backend = CountingBackend(str(tmp_path))
    write_topic(backend, "/a/one", ((0, 5),))
    write_topic(backend, "/b/two", ((0, 7),))
    # a data object without its sidecar: an unfinished upload
    backend.put(seg.segment_key("/b/two", 7, 9), message_codec.encode_records(make_records(7, 3), base_offset=7))
    options = planning.ReadOptions.parse({"path": str(tmp_path)})
    _, batches = read_all(options, backend)
    topics = [t for b in batches for t in b.column("topic").to_pylist()]
    assert topics == ["/a/one"] * 5 + ["/b/two"] * 7


@pytest.mark.parametrize(
    "options, message",
    [
        ({}, "needs a path"),
        ({"path": "/x", "topic": "no-slash"}, "invalid topic name"),
        ({"path": "/x", "startOffset": "ten"}, "startOffset='ten': expected an integer"),
        ({"path": "/x", "startOffset": "10", "endOffset": "5"}, "endOffset 5 is before startOffset 10"),
        ({"path": "/x", "startTime": "yesterday"}, "startTime='yesterday'"),
        ({"path": "/x", "verify": "maybe"}, "verify='maybe'"),
        ({"path": "/x", "metadata": "/m.db"}, "needs option topic"),
    ],
)
def test_bad_options_are_clear_errors(options, message):
    with pytest.raises(InvalidArgumentError, match=message):
        planning.ReadOptions.parse(options)


def test_missing_catalog_database_is_a_clear_error(tmp_path):
    options = planning.ReadOptions.parse({"path": str(tmp_path), "topic": TOPIC, "metadata": str(tmp_path / "nope.db")})
    with pytest.raises(InvalidArgumentError, match="no metadata database"):
        planning.list_descriptors(options, FilesystemBackend(str(tmp_path)))


def test_writer_record_conversion_rejects_bad_rows():
    ok = pa.RecordBatch.from_pydict({"payload": [b"a", b""], "routing_key": ["k", None]})
    assert [r[2:] for r in arrow.batch_to_records(ok, default_publish_time_ms=5)] == [
        ("k", None, b"a"),
        (None, None, b""),
    ]
    with pytest.raises(InvalidArgumentError, match="row 1 of the batch has a null payload"):
        arrow.batch_to_records(pa.RecordBatch.from_pydict({"payload": [b"a", None]}))
    with pytest.raises(InvalidArgumentError, match="cannot write column"):
        arrow.check_writable_schema([("payload", "binary"), ("extra", "int")])
    with pytest.raises(InvalidArgumentError, match="needs a 'payload' column"):
        arrow.check_writable_schema([("routing_key", "string")])
    with pytest.raises(InvalidArgumentError, match="column 'routing_key' has type int"):
        arrow.check_writable_schema([("payload", "binary"), ("routing_key", "int")])


def test_small_segments_are_packed_into_partitions_up_to_max_partition_bytes(tmp_path):
    backend = FilesystemBackend(str(tmp_path))
    descs, written = write_topic(backend)
    sizes = [d.size for d in descs]
    default = planning.ReadOptions.parse({"path": str(tmp_path), "topic": TOPIC})
    assert [[r.segment_id for r in group] for group in planning.pack(default, planning.plan(default, descs))] == [
        [d.segment_id] for d in descs
    ]  # by default one partition per segment
    whole = planning.ReadOptions.parse({"path": str(tmp_path), "topic": TOPIC, "packSegments": "true"})
    reads = planning.plan(whole, descs)
    assert [[r.segment_id for r in group] for group in planning.pack(whole, reads)] == [
        [d.segment_id for d in descs]
    ]  # 128 MiB default: everything in one task
    # a limit that fits the first two segments but not the third with them
    two = planning.ReadOptions.parse(
        {"path": str(tmp_path), "topic": TOPIC, "packSegments": "true", "maxPartitionBytes": str(sizes[0] + sizes[1])}
    )
    groups = planning.pack(two, planning.plan(two, descs))
    assert [[r.segment_id for r in g] for g in groups][0] == [descs[0].segment_id, descs[1].segment_id]
    assert all(sum(r.byte_end - r.byte_start for r in g) <= sizes[0] + sizes[1] or len(g) == 1 for g in groups)
    # every read once, in order, whatever the grouping
    assert [r for g in groups for r in g] == planning.plan(two, descs)
    batches = [b for g in groups for b in read_partition(g, backend)]
    assert rows_of(batches) == expected_rows(written)


def test_min_partitions_splits_for_parallelism(tmp_path):
    backend = FilesystemBackend(str(tmp_path))
    descs, written = write_topic(backend)
    options = planning.ReadOptions.parse(
        {"path": str(tmp_path), "topic": TOPIC, "minPartitions": "6", "packSegments": "true"}
    )
    groups = planning.pack(options, planning.plan(options, descs))
    assert len(groups) >= 6
    total = sum(d.size for d in descs)
    assert all(sum(r.byte_end - r.byte_start for r in g) <= -(-total // 6) or len(g) == 1 for g in groups)
    assert rows_of([b for g in groups for b in read_partition(g, backend)]) == expected_rows(written)
    with pytest.raises(InvalidArgumentError, match="minPartitions=0: must be ≥ 1"):
        planning.ReadOptions.parse({"path": str(tmp_path), "minPartitions": "0"})


@pytest.mark.parametrize(
    "columns",
    [("payload",), ("payload", "offset"), ("attributes", "routing_key", "topic"), ("producer_id", "publish_time")],
)
def test_a_column_subset_is_built_alone_and_equals_the_full_read(tmp_path, columns):
    backend = FilesystemBackend(str(tmp_path))
    descs, _ = write_topic(backend)
    # a time filter needs publish_time and the index check needs offset, even when not asked for
    options = planning.ReadOptions.parse(
        {"path": str(tmp_path), "topic": TOPIC, "startTime": "1500", "endTime": "3000", "batchBytes": "2048"}
    )
    reads = planning.plan(options, descs)
    full = pa.Table.from_batches([b for r in reads for b in read_batches(r, backend)])
    narrow_batches = [b for r in reads for b in read_batches(r, backend, columns=columns)]
    assert all(tuple(b.schema.names) == columns for b in narrow_batches)
    narrow = pa.Table.from_batches(narrow_batches)
    assert narrow.num_rows == full.num_rows == 150  # offsets 50..199
    assert narrow.equals(full.select(list(columns)))


@pytest.mark.parametrize(
    "schema, message",
    [
        ([("payload", "binary"), ("color", "string")], "has no column 'color'"),
        ([("offset", "int")], "column 'offset' is bigint in the danube data source, not int"),
        ([("payload", "binary"), ("payload", "binary")], "names a column twice"),
        ([], "at least one column"),
    ],
)
def test_bad_read_schema_is_a_clear_error(schema, message):
    with pytest.raises(InvalidArgumentError, match=message):
        arrow.check_read_columns(schema)
    assert arrow.check_read_columns([("payload", "binary"), ("offset", "bigint")]) == ("payload", "offset")
