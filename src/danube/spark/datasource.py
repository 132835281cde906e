"""The ``danube`` PySpark data source: durable segments as a DataFrame, and back.

Read::

    danube.spark.register(spark)
    df = (spark.read.format("danube")
          .option("topic", "/default/orders")          # optional: every topic under the root otherwise
          .option("startOffset", 1000).option("endOffset", 2000)        # [start, end)
          .option("startTime", "2024-05-01T00:00:00Z").option("endTime", 1714600000000)  # [start, end)
          .load("/var/lib/danube/durable"))             # or s3://bucket/prefix (+ endpoint, region, ...)

Write (a new topic's history, offsets consecutive from 0, or appended after the
topic's last segment)::

    df.write.format("danube").option("topic", "/default/orders-compacted").mode("append").save(root)

Options are listed in docs/spark.md.  Planning (descriptor listing and pruning)
is in :mod:`danube.spark.planning`, decoding in :mod:`danube.spark.reading`.
"""

from __future__ import annotations

import asyncio
import bisect
import uuid
from dataclasses import dataclass, field
from typing import Iterator

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from danube import message_codec
from danube.errors import InvalidArgumentError, StorageError
from danube.metadata import keys
from danube.spark import arrow, planning, schema_decode
from danube.storage import segment as seg

DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024
_BACKENDS: dict = {}


def _backend(spec: planning.BackendSpec):
    """One backend (and S3 client) per executor process and spec."""
    backend = _BACKENDS.get(spec)
    if backend is None:
        backend = _BACKENDS[spec] = spec.open()
    return backend


class DanubeDataSource(DataSource):
    """``spark.read.format("danube")`` / ``df.write.format("danube")``."""

    @classmethod
    def name(cls) -> str:
        return "danube"

    def schema(self) -> str:
        if schema_decode.wants_schema_decode(self.options):  # typed columns from the schema registry
            return self._decode_plan().ddl
        return arrow.SCHEMA_DDL

    def _decode_plan(self) -> "schema_decode.DecodePlan":
        plan = getattr(self, "_plan", None)
        if plan is None:
            plan = self._plan = schema_decode.plan(schema_decode.load_versions(self.options))
        return plan

    def reader(self, schema: StructType) -> "DanubeReader":
        if schema_decode.wants_schema_decode(self.options):
            return SchemaDecodingReader(
                planning.ReadOptions.parse(self.options),
                self._decode_plan(),
                {k.lower(): v for k, v in self.options.items()}.get("onerror", "fail"),
            )
        return DanubeReader(planning.ReadOptions.parse(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> "DanubeWriter":
        return DanubeWriter(WriteOptions.parse(self.options), schema, overwrite)


class SegmentPartition(InputPartition):
    """One Spark task: consecutive segment reads (``planning.pack``), together about ``maxPartitionBytes``."""

    def __init__(self, reads: list[planning.SegmentRead]) -> None:
        super().__init__(reads[0].segment_id if len(reads) == 1 else f"{reads[0].segment_id}..{reads[-1].segment_id}")
        self.reads = reads


class DanubeReader(DataSourceReader):
    """Reads the columns of ``schema``: all of them (the default schema) or the subset a user
    passed with ``spark.read.format("danube").schema("offset long, payload binary")``.

    Spark does not tell a Python data source which columns a query uses, so every column
    of the schema is built and converted to rows in the JVM whether used or not; a narrower
    schema is the way to skip that work.
    """

    def __init__(self, options: planning.ReadOptions, schema: StructType) -> None:
        self.options = options
        self.columns = arrow.check_read_columns([(f.name, f.dataType.simpleString()) for f in schema.fields])
        self._partitions: list[SegmentPartition] | None = None

    def partitions(self) -> list[SegmentPartition]:
        if self._partitions is None:
            reads = planning.plan_all(self.options, self.options.backend.open())
            self._partitions = [SegmentPartition(group) for group in planning.pack(self.options, reads)]
        # Spark needs at least one partition; an empty one yields no rows
        return self._partitions or [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator:
        if not isinstance(partition, SegmentPartition):
            return iter(())
        from danube.spark.reading import read_partition

        wal = self.options.wal_root
        return read_partition(
            partition.reads,
            _backend(self.options.backend),
            verify=self.options.verify,
            columns=self.columns,
            wal_backend=_backend(planning.BackendSpec(wal)) if wal else None,
        )


class SchemaDecodingReader(DanubeReader):
    """``decode=schema``: the frames' payloads decoded with the registered schema
    (:mod:`danube.spark.schema_decode`) into one column per field of the latest version."""

    def __init__(self, options: planning.ReadOptions, plan: "schema_decode.DecodePlan", on_error: str) -> None:
        self.options = options
        self.columns = schema_decode.SOURCE_COLUMNS
        self.plan = plan
        self.on_error = on_error
        self._partitions = None

    def read(self, partition: InputPartition) -> Iterator:
        return schema_decode.decode_partition(super().read(partition), schema_decode.Decoder(self.plan, self.on_error))


# ---------------------------------------------------------------- writer


@dataclass(frozen=True)
class WriteOptions:
    backend: planning.BackendSpec
    topic: str
    segment_bytes: int
    metadata: str | None
    metadata_prefix: str

    @classmethod
    def parse(cls, options) -> "WriteOptions":
        opts = planning._lower(options)
        topic = opts.get("topic")
        if not topic:
            raise InvalidArgumentError("df.write.format('danube') needs .option('topic', '/namespace/topic')")
        keys.split_topic(topic)
        return cls(
            backend=planning.backend_spec(opts),
            topic=topic,
            segment_bytes=planning._int_option(opts, "segmentBytes", DEFAULT_SEGMENT_BYTES, 1024),
            metadata=opts.get("metadata") or None,
            metadata_prefix=opts.get("metadataprefix", ""),
        )


@dataclass
class StagedPiece:
    key: str
    count: int
    size: int


@dataclass
class StagedPartition(WriterCommitMessage):
    partition_id: int
    pieces: list[StagedPiece] = field(default_factory=list)


def _staging_prefix(topic: str, job_id: str) -> str:
    ns, name = keys.split_topic(topic)
    return f"{ns}/{name}/_staging/{job_id}/"


def _remove_empty_staging(backend, prefix: str) -> None:
    """Object stores have no directories; on a file system drop the emptied staging folders."""
    import os

    from danube.storage.backends import FilesystemBackend

    if not isinstance(backend, FilesystemBackend):
        return
    path = os.path.join(backend.root, prefix.rstrip("/"))
    for directory in (path, os.path.dirname(path)):
        try:
            os.rmdir(directory)
        except OSError:
            return  # not empty (another job is staging) or already gone


class DanubeWriter(DataSourceArrowWriter):
    """Tasks stage frames with offsets relative to their own partition; the driver's commit
    numbers them.

    Offsets must be consecutive across the whole job, which no task can know on its own.
    Each task therefore writes its rows (in iterator order) as staged frame files under
    ``<ns>/<topic>/_staging/<job>/`` and reports their record counts.  ``commit`` walks
    the partitions in partition-id order, stamps each staged file's offsets from the
    running base (the header offset is outside the CRC, so no re-checksum) and writes
    it as a segment with ``segment.write_segment`` (data, then sidecar), then the
    metadata descriptor when a catalog is configured, then deletes the staged file.
    Readers ignore staged files (no sidecar).  For a global order across partitions,
    sort first (``df.orderBy("offset")``: range partitions are in order).
    """

    def __init__(self, options: WriteOptions, schema: StructType, overwrite: bool) -> None:
        arrow.check_writable_schema([(f.name, f.dataType.simpleString()) for f in schema.fields])
        self.options = options
        self.overwrite = overwrite
        self.job_id = uuid.uuid4().hex[:16]

    def write(self, iterator) -> StagedPartition:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        partition_id = ctx.partitionId() if ctx else 0
        attempt = ctx.attemptNumber() if ctx else 0
        backend = _backend(self.options.backend)
        prefix = _staging_prefix(self.options.topic, self.job_id)
        message = StagedPartition(partition_id)
        buf = bytearray()
        count = 0

        def flush():
            nonlocal buf, count
            if count:
                key = f"{prefix}part-{partition_id:05d}-{attempt}-{len(message.pieces):05d}.frames"
                backend.put(key, bytes(buf))
                message.pieces.append(StagedPiece(key, count, len(buf)))
            buf, count = bytearray(), 0

        limit = self.options.segment_bytes
        for batch in iterator:
            if batch.num_rows == 0:
                continue
            # relative offsets; the commit step stamps the final ones
            encoded = message_codec.encode_records(arrow.batch_to_records(batch), base_offset=0)
            positions = message_codec.frame_positions(encoded) + [len(encoded)]
            i, n = 0, len(positions) - 1
            while i < n:
                j = bisect.bisect_right(positions, positions[i] + limit - len(buf)) - 1
                if j <= i:
                    if count:
                        flush()  # the next frame does not fit: start a new segment
                        continue
                    j = i + 1  # one frame larger than a segment gets a segment of its own
                buf += encoded[positions[i] : positions[j]]
                count += j - i
                i = j
                if i < n or len(buf) >= limit:
                    flush()
        flush()
        return message

    # -- driver side

    def _existing(self, backend) -> list[seg.SegmentDescriptor]:
        return seg.list_segments(backend, seg.topic_prefix(self.options.topic))

    def commit(self, messages) -> None:
        backend = self.options.backend.open()
        staged = sorted((m for m in messages if m is not None), key=lambda m: m.partition_id)
        existing = self._existing(backend)
        if self.overwrite:
            for desc in existing:
                backend.delete(desc.data_key[: -len(seg.DATA_SUFFIX)] + seg.DESCRIPTOR_SUFFIX)
                backend.delete(desc.data_key)
            base = 0
            self._catalog_clear()
        else:
            base = max((d.end_offset + 1 for d in existing), default=0)
        written: list[seg.SegmentDescriptor] = []
        for message in staged:
            for piece in message.pieces:
                data = bytearray(backend.get(piece.key))
                stamped = message_codec.stamp_offsets(data, base)
                if stamped != piece.count:
                    raise StorageError(
                        f"staged file {piece.key} holds {stamped} frames, expected {piece.count}", retriable=False
                    )
                written.append(seg.write_segment(backend, self.options.topic, data))
                base += stamped
                backend.delete(piece.key)
        self._catalog_add(written)
        _remove_empty_staging(backend, _staging_prefix(self.options.topic, self.job_id))

    def abort(self, messages) -> None:
        backend = self.options.backend.open()
        for message in messages:
            if message is None:
                continue
            for piece in message.pieces:
                backend.delete(piece.key)
        _remove_empty_staging(backend, _staging_prefix(self.options.topic, self.job_id))

    # -- metadata catalog (optional)

    def _catalog(self, fn):
        if not self.options.metadata:
            return
        from danube.metadata.embedded import EmbeddedMetadataStore

        async def run():
            store = EmbeddedMetadataStore(self.options.metadata)
            try:
                await fn(store)
            finally:
                await store.close()

        asyncio.run(run())

    def _catalog_clear(self) -> None:
        async def clear(store):
            await store.delete_prefix(keys.storage_segments(self.options.metadata_prefix, self.options.topic))

        self._catalog(clear)

    def _catalog_add(self, written: list[seg.SegmentDescriptor]) -> None:
        if not written:
            return
        prefix, topic = self.options.metadata_prefix, self.options.topic

        async def add(store):
            for desc in written:
                await store.put(keys.storage_segment(prefix, topic, desc.start_offset), desc.to_json())
            await store.put_json(
                keys.storage_segments_cur(prefix, topic), {"start": keys.offset20(written[-1].start_offset)}
            )

        self._catalog(add)
