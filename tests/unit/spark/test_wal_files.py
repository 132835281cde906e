"""``walRoot``: a broker's WAL files after its durable segments, planned and decoded without Spark."""

from __future__ import annotations

import pytest

from danube import message_codec
from danube.errors import StorageError
from danube.spark import planning
from danube.spark.reading import read_partition
from danube.storage import segment as seg
from danube.storage.backends import FilesystemBackend
from danube.wal import Wal

TOPIC = "/default/events"


def write_wal(wal_root, count, *, first=0):
    path = wal_root / "default" / "events"
    with Wal.open(path, max_file_bytes=8192, initial_file_bytes=8192, sync="never", initial_offset=first) as wal:
        for i in range(first, first + count):
            wal.append(b"payload-%05d" % i, key=f"k{i % 3}", attributes={"i": str(i)})
    return path


def rows(options, backend, wal_root):
    reads = planning.plan_all(options, backend)
    out = []
    for batch in read_partition(reads, backend, wal_backend=FilesystemBackend(str(wal_root))):
        out += batch.to_pylist()
    return reads, out


def test_durable_segments_then_the_wal_files_without_overlap(tmp_path):
    wal_root, durable = tmp_path / "wal", tmp_path / "durable"
    path = write_wal(wal_root, 300)  # several rotated files and an active one with zeros after its frames
    backend = FilesystemBackend(str(durable))
    # offsets 0..119 exported (the export ends inside a WAL file)
    with Wal.open(path, max_file_bytes=8192, initial_file_bytes=8192, sync="never") as wal:
        data = b"".join(bytes(wal.read_frames(o, 1 << 20)) for o in (0,))
    cut = message_codec.find_offset(data, 120)
    seg.write_segment(backend, TOPIC, data[:cut])
    options = planning.ReadOptions.parse({"path": str(durable), "topic": TOPIC, "walRoot": str(wal_root)})
    reads, got = rows(options, backend, wal_root)
    assert reads[0].source == "durable" and {r.source for r in reads[1:]} == {"wal"}
    assert [r["offset"] for r in got] == list(range(300)), "each offset once, in order"
    assert got[250]["payload"] == b"payload-00250" and got[250]["routing_key"] == "k1"
    assert dict(got[250]["attributes"]) == {"i": "250"}
    # an offset range reaching into the WAL files
    ranged = planning.ReadOptions.parse(
        {"path": str(durable), "topic": TOPIC, "walRoot": str(wal_root), "startOffset": "100", "endOffset": "210"}
    )
    assert [r["offset"] for r in rows(ranged, backend, wal_root)[1]] == list(range(100, 210))


def test_all_topics_of_a_wal_root_and_a_gap_is_an_error(tmp_path):
    wal_root, durable = tmp_path / "wal", tmp_path / "durable"
    write_wal(wal_root, 50, first=500)
    backend = FilesystemBackend(str(durable))
    options = planning.ReadOptions.parse({"path": str(durable), "walRoot": str(wal_root)})
    _, got = rows(options, backend, wal_root)
    assert [r["offset"] for r in got] == list(range(500, 550)), "a topic with no durable segment"
    seg.write_segment(backend, TOPIC, message_codec.encode_payloads([b"x"] * 10, base_offset=0))
    with pytest.raises(StorageError, match="10..499 are neither in durable segments nor in the WAL"):
        planning.plan_all(options, backend)


def test_wal_root_must_exist(tmp_path):
    with pytest.raises(Exception, match="walRoot"):
        planning.ReadOptions.parse({"path": str(tmp_path), "walRoot": str(tmp_path / "missing")})
