"""The `danube` data source on local[2] over segments written by the storage code, in all three modes."""

from __future__ import annotations

import asyncio

import pytest

from danube.metadata import keys
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.storage import segment as seg
from danube.storage.backends import FilesystemBackend, S3Backend
from tests.integration.spark.helpers import collect_rows, write_history

pytestmark = pytest.mark.spark

TOPIC = "/default/orders"


def storage(mode, tmp_path, s3_bucket_factory):
    """(backend, load path, reader options) for a storage mode."""
    if mode == "local":
        root = str(tmp_path / "data" / "durable")
        return FilesystemBackend(root), root, {}
    if mode == "shared_fs":
        root = str(tmp_path / "shared-mount")
        return FilesystemBackend(root), f"file://{root}", {}
    s3 = s3_bucket_factory()
    backend = S3Backend(
        s3.bucket,
        "cluster-a",
        endpoint=s3.endpoint,
        region=s3.region,
        access_key=s3.access_key,
        secret_key=s3.secret_key,
    )
    return (
        backend,
        f"s3://{s3.bucket}/cluster-a",
        {"endpoint": s3.endpoint, "region": s3.region, "access_key": s3.access_key, "secret_key": s3.secret_key},
    )


def reader(spark, options):
    r = spark.read.format("danube")
    for k, v in options.items():
        r = r.option(k, v)
    return r


@pytest.mark.parametrize("mode", ["local", "shared_fs", "object_store"])
def test_every_record_read_back_equals_what_was_written(spark, tmp_path, request, mode):
    backend, path, options = storage(mode, tmp_path, lambda: request.getfixturevalue("s3_bucket"))
    descs, rows = write_history(backend, TOPIC, [(0, 40), (40, 60), (100, 900)])
    _, other = write_history(backend, "/other/topic", [(0, 5)])
    big = descs[2]
    # one partition per segment, and the large segment split into several on its offset index
    df = reader(spark, {**options, "topic": TOPIC, "maxPartitionBytes": str(big.size // 3)}).load(path)
    assert df.rdd.getNumPartitions() >= 5
    assert collect_rows(df) == rows
    if mode == "object_store":
        # without a topic: every topic under the prefix
        assert collect_rows(reader(spark, options).load(path)) == rows + other


def test_pruning_never_opens_excluded_segments(spark, tmp_path):
    backend, path, _ = storage("local", tmp_path, None)
    descs, rows = write_history(backend, TOPIC, [(0, 50), (50, 50), (100, 50)])
    # damage the first segment and delete the data of the last: a read that opened either would fail
    first = tmp_path / "data" / "durable" / descs[0].data_key
    raw = bytearray(first.read_bytes())
    raw[100] ^= 0xFF
    first.write_bytes(bytes(raw))
    (tmp_path / "data" / "durable" / descs[2].data_key).unlink()
    by_offset = reader(spark, {"topic": TOPIC, "startOffset": "55", "endOffset": "100"}).load(path)
    assert collect_rows(by_offset) == rows[55:100]
    t0 = rows[0][2]
    by_time = reader(spark, {"topic": TOPIC, "startTime": str(t0 + 600), "endTime": str(t0 + 700)}).load(path)
    assert collect_rows(by_time) == rows[60:70]
    with pytest.raises(Exception) as err:
        reader(spark, {"topic": TOPIC, "endOffset": "60"}).load(path).count()
    text = str(err.value)
    assert "SegmentCorruptError" in text and descs[0].segment_id in text and "offset" in text


def test_catalog_from_metadata_descriptors(spark, tmp_path):
    backend, path, _ = storage("local", tmp_path, None)
    descs, rows = write_history(backend, TOPIC, [(0, 30), (30, 30)])
    db = str(tmp_path / "meta" / "metadata.db")

    async def register():
        store = EmbeddedMetadataStore(db)
        # only the first segment is in the catalog: the data source must follow the catalog
        await store.put(keys.storage_segment("/danube", TOPIC, descs[0].start_offset), descs[0].to_json())
        await store.put_json(keys.storage_segments_cur("/danube", TOPIC), {"start": keys.offset20(0)})
        await store.close()

    asyncio.run(register())
    df = reader(spark, {"topic": TOPIC, "metadata": db, "metadataPrefix": "/danube"}).load(path)
    assert collect_rows(df) == rows[:30]


def test_empty_topic_reads_as_an_empty_dataframe(spark, tmp_path):
    df = spark.read.format("danube").option("topic", "/default/nothing").load(str(tmp_path))
    assert df.count() == 0
    assert df.columns == ["topic", "offset", "publish_time", "producer_id", "routing_key", "attributes", "payload"]


def test_writer_produces_consecutive_offsets_and_descriptors(spark, tmp_path):
    backend, path, _ = storage("local", tmp_path, None)
    _, rows = write_history(backend, TOPIC, [(0, 300)])
    db = str(tmp_path / "meta.db")
    source = reader(spark, {"topic": TOPIC}).load(path).repartition(3).orderBy("offset")
    (
        source.write.format("danube")
        .option("topic", "/default/copy")
        .option("segmentBytes", "8192")
        .option("metadata", db)
        .mode("overwrite")
        .save(path)
    )
    copied = collect_rows(reader(spark, {"topic": "/default/copy"}).load(path))
    assert [r[1] for r in copied] == list(range(300))
    assert [r[2:] for r in copied] == [r[2:] for r in rows]
    descs = seg.list_segments(backend, seg.topic_prefix("/default/copy"))
    assert len(descs) > 3 and descs[0].start_offset == 0
    assert all(a.end_offset + 1 == b.start_offset for a, b in zip(descs, descs[1:]))
    assert not list((tmp_path / "data" / "durable" / "default" / "copy").glob("_staging/*"))

    async def catalog():
        store = EmbeddedMetadataStore(db)
        try:
            return (
                [kv.key for kv in await store.get_prefix(keys.storage_segments("", "/default/copy"))],
                await store.get_json(keys.storage_segments_cur("", "/default/copy")),
            )
        finally:
            await store.close()

    catalog_keys, cur = asyncio.run(catalog())
    assert len(catalog_keys) == len(descs) + 1
    assert cur == {"start": keys.offset20(descs[-1].start_offset)}

    # append continues after the last offset
    extra = spark.createDataFrame([(b"late-1", "k"), (b"late-2", None)], "payload binary, routing_key string")
    extra.coalesce(1).write.format("danube").option("topic", "/default/copy").mode("append").save(path)
    tail = collect_rows(reader(spark, {"topic": "/default/copy", "startOffset": "299"}).load(path))
    assert [(r[1], r[4], r[6]) for r in tail] == [
        (299, rows[-1][4], rows[-1][6]),
        (300, "k", b"late-1"),
        (301, None, b"late-2"),
    ]


def test_writer_bad_input_is_a_clear_error_and_stores_nothing(spark, tmp_path):
    path = str(tmp_path)
    bad = spark.createDataFrame([(b"ok",), (None,)], "payload binary")
    with pytest.raises(Exception, match="null payload"):
        bad.coalesce(1).write.format("danube").option("topic", "/default/bad").mode("append").save(path)
    assert seg.list_segments(FilesystemBackend(path), seg.topic_prefix("/default/bad")) == []
    with pytest.raises(Exception, match="cannot write column"):
        spark.range(3).write.format("danube").option("topic", "/default/bad").mode("append").save(path)
    with pytest.raises(Exception, match="needs .option\\('topic'"):
        spark.createDataFrame([(b"x",)], "payload binary").write.format("danube").mode("append").save(path)


def test_small_segments_share_a_task_when_packed_and_min_partitions_spreads_them(spark, tmp_path):
    backend, path, _ = storage("local", tmp_path, None)
    _, rows = write_history(backend, TOPIC, [(i * 20, 20) for i in range(6)])
    per_segment = reader(spark, {"topic": TOPIC}).load(path)
    assert per_segment.rdd.getNumPartitions() == 6
    assert collect_rows(per_segment) == rows
    packed = reader(spark, {"topic": TOPIC, "packSegments": "true"}).load(path)
    assert packed.rdd.getNumPartitions() == 1
    assert collect_rows(packed) == rows
    spread = reader(spark, {"topic": TOPIC, "packSegments": "true", "minPartitions": "3"}).load(path)
    assert spread.rdd.getNumPartitions() >= 3
    assert collect_rows(spread) == rows


def test_a_narrower_schema_reads_only_those_columns(spark, tmp_path):
    backend, path, _ = storage("local", tmp_path, None)
    _, rows = write_history(backend, TOPIC, [(0, 40), (40, 60)])
    df = spark.read.format("danube").schema("payload binary, offset long").option("topic", TOPIC).load(path)
    assert df.columns == ["payload", "offset"]
    got = [(r.offset, bytes(r.payload)) for r in df.orderBy("offset").collect()]
    assert got == [(r[1], r[6]) for r in rows]
    ranged = (
        spark.read.format("danube")
        .schema("routing_key string")
        .option("topic", TOPIC)
        .option("startOffset", "10")
        .option("endOffset", "20")
        .load(path)
    )
    assert sorted(r.routing_key or "" for r in ranged.collect()) == sorted(r[4] or "" for r in rows[10:20])
    with pytest.raises(Exception, match="has no column 'color'"):
        spark.read.format("danube").schema("payload binary, color string").load(path).count()
