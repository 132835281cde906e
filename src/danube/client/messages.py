"""What a consumer hands to the application: messages and whole delivered batches."""

from __future__ import annotations

from typing import Iterator

from danube import message_codec as frame_codec
from danube.schema.tag import SCHEMA_ATTR, parse_schema_value


class Message:
    """One delivered message.  ``payload`` is bytes; ``topic`` is the partition it came from."""

    __slots__ = (
        "topic",
        "offset",
        "payload",
        "publish_time",
        "producer_id",
        "routing_key",
        "attributes",
        "redelivery_count",
        "_partition",
    )

    def __init__(self, topic: str, partition: int, record, redelivery_count: int = 0) -> None:
        self.topic = topic
        self._partition = partition
        self.offset = record.offset
        self.payload = bytes(record.payload)
        self.publish_time = record.publish_time
        self.producer_id = record.producer_id
        self.routing_key = record.routing_key
        self.attributes = record.attributes
        self.redelivery_count = redelivery_count

    def __repr__(self) -> str:
        return f"Message(topic={self.topic!r}, offset={self.offset}, {len(self.payload)} bytes)"

    @property
    def schema_id(self) -> int | None:
        """The schema id the producer wrote it with (frame attribute ``danube.schema`` = "id:version"), or None."""
        return parse_schema_value(self.attributes.get(SCHEMA_ATTR) if self.attributes else None)[0]

    @property
    def schema_version(self) -> int | None:
        return parse_schema_value(self.attributes.get(SCHEMA_ATTR) if self.attributes else None)[1]


class MessageBatch:
    """One delivered batch: the frames as the broker stored them, decoded on demand."""

    __slots__ = (
        "topic",
        "frames",
        "first_offset",
        "last_offset",
        "count",
        "redelivery_counts",
        "_partition",
        "_stream",
    )

    def __init__(
        self,
        topic: str,
        partition: int,
        frames: bytes,
        first_offset: int,
        last_offset: int,
        count: int,
        redelivery_counts: list[int] | None = None,
        stream: int = 0,
    ) -> None:
        self.topic = topic
        self._partition = partition
        self.frames = frames
        self.first_offset = first_offset
        self.last_offset = last_offset
        self.count = count
        self.redelivery_counts = redelivery_counts or []
        self._stream = stream  # which Consume stream of the partition delivered it (credit goes back to it)

    def offsets(self) -> list[int]:
        """Offsets of the batch's messages (not always contiguous on shared subscriptions)."""
        if self.last_offset - self.first_offset + 1 == self.count:
            return list(range(self.first_offset, self.last_offset + 1))
        return [r.offset for r in frame_codec.iter_records(self.frames)]

    def without(self, skip) -> tuple["MessageBatch | None", list[int]]:
        """This batch minus the messages whose offset is in ``skip``: (the rest or None, skipped offsets)."""
        offsets = self.offsets()
        skipped = [o for o in offsets if o in skip]
        if not skipped:
            return self, []
        if len(skipped) == len(offsets):
            return None, skipped
        positions = frame_codec.frame_positions(self.frames)
        positions.append(len(self.frames))
        mv = memoryview(self.frames)
        parts, kept, counts = [], [], []
        for i, offset in enumerate(offsets):
            if offset in skip:
                continue
            parts.append(mv[positions[i] : positions[i + 1]])
            kept.append(offset)
            if self.redelivery_counts:
                counts.append(self.redelivery_counts[i])
        rest = MessageBatch(
            self.topic, self._partition, b"".join(parts), kept[0], kept[-1], len(kept), counts, self._stream
        )
        return rest, skipped

    def records(self):
        """Zero-copy ``danube.message_codec.Record``s (payloads are memoryviews into ``frames``)."""
        return frame_codec.iter_records(self.frames)

    def payloads(self) -> list[bytes]:
        return [bytes(r.payload) for r in frame_codec.iter_records(self.frames)]

    def messages(self) -> list[Message]:
        counts = self.redelivery_counts
        return [
            Message(self.topic, self._partition, r, counts[i] if counts else 0)
            for i, r in enumerate(frame_codec.iter_records(self.frames))
        ]

    def __iter__(self) -> Iterator[Message]:
        return iter(self.messages())

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"MessageBatch(topic={self.topic!r}, offsets {self.first_offset}..{self.last_offset}, {self.count} messages)"
