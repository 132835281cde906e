"""Pure-Python twin of ``danube._core.walfile``'s writer (``_core/wal/writer.pyx``):
``LogWriter``, the single writer of a log.  Frames come from ``danube._pure.frame``'s
encoders; this file holds no byte layout of its own.
"""

from __future__ import annotations

from danube._pure import frame as frames
from danube._pure.wal.segment import SegmentFile, now_ms
from danube.errors import WalClosedError, WalError


class LogWriter:
    """The single writer of a log: assigns offsets, writes frames into the active
    segment and the ring, and asks its owner for a new segment when the active one
    is full or too old.

    ``rotate(min_bytes)`` is called with the bytes the pending write needs; it must
    call :meth:`set_segment` with a new segment (sealing the old one is the caller's
    business, then or later: the writer never touches it again).
    ``on_append()`` is called once after an append when ``armed`` is set (the
    flag is cleared first), which is how waiting tail readers are woken without
    a cost per append when nobody waits.
    """

    def __init__(
        self, segment: SegmentFile, ring, rotate, *, max_file_age_s: float | None = None, producer_id: int = 0
    ) -> None:
        self.segment = segment
        self.ring = ring
        self._rotate = rotate
        self.max_file_age_ms = None if max_file_age_s is None else int(max_file_age_s * 1000)
        self.producer_id = producer_id
        self.next_offset = segment.next_offset
        self.armed = False
        self.on_append = None
        self.closed = False
        self.prefault_bytes = 0  # compiled: faults pages in ahead of the writer; a no-op here
        # the last append was stored through the mapping (always here; the compiled writer
        # pwrites big batches)
        self.last_stored = False
        self._deadline_ms = self._deadline_for(segment)

    def _deadline_for(self, segment) -> int:
        if self.max_file_age_ms is None:
            return 1 << 62
        return segment.created_ms + self.max_file_age_ms

    def set_segment(self, segment: SegmentFile) -> None:
        if segment.next_offset != self.next_offset:
            raise WalError(f"new segment starts at {segment.next_offset}, log continues at {self.next_offset}")
        self.segment = segment
        self._deadline_ms = self._deadline_for(segment)

    def close(self) -> None:
        self.closed = True

    def rotation_due(self) -> bool:
        return self.segment.count > 0 and now_ms() >= self._deadline_ms

    # ------------------------------------------------------------ appends

    def _room_for(self, n: int) -> None:
        if self.closed:
            raise WalClosedError("the WAL is closed")
        seg = self.segment
        if n > seg.capacity - seg.write_pos or (seg.count and now_ms() >= self._deadline_ms):
            self._rotate(n)

    def _publish(self, data, first: int, count: int) -> None:
        seg = self.segment
        pos = seg.write_frames(data, count)
        self.ring.append_from(seg._mm, pos, seg.write_pos - pos, first, count)  # no copy: the mapping itself
        self.last_stored = True
        self.next_offset = first + count
        if self.armed:
            self.armed = False
            self.on_append()

    def append(self, payload, *, key=None, attributes=None, publish_time=None) -> int:
        """Append one record; return its offset."""
        offset = self.next_offset
        if not isinstance(payload, bytes):
            payload = memoryview(payload)  # any buffer; TypeError for anything else (as compiled)
        frame = frames.encode_record(
            payload,
            offset=offset,
            publish_time=now_ms() if publish_time is None else publish_time,
            producer_id=self.producer_id,
            key=key,
            attributes=attributes,
        )
        self._room_for(len(frame))
        self._publish(frame, offset, 1)
        return offset

    def append_payloads(self, payloads, *, key=None, attributes=None, publish_time=None) -> tuple[int, int]:
        """Append payloads sharing key, attributes and publish time; return ``(first, last)``."""
        payloads = [p if isinstance(p, bytes) else memoryview(p) for p in payloads]
        if not payloads:
            raise ValueError("append_payloads needs at least one payload")
        first = self.next_offset
        data = frames.encode_payloads(
            payloads,
            base_offset=first,
            publish_time=now_ms() if publish_time is None else publish_time,
            producer_id=self.producer_id,
            key=key,
            attributes=attributes,
        )
        self._room_for(len(data))
        self._publish(data, first, len(payloads))
        return first, first + len(payloads) - 1

    def append_frames(self, buf) -> tuple[int, int]:
        """Validate a frame batch, stamp it with the next offsets and append it; ``(first, last)``.

        A writable buffer is stamped in place (the caller sees the offsets); a
        read-only one is stamped in the log's copy only.  A ``CheckedFrames`` (the checked
        copy ``frames.check_batch`` makes, and only it) is not validated again.
        """
        mv = memoryview(buf).cast("B")
        if type(buf) is frames.CheckedFrames and buf.nbytes == len(mv):
            count = buf.frame_count
        else:
            count, _f, _l = frames.validate(mv)
        if count == 0:
            raise ValueError("append_frames needs at least one frame")
        first = self.next_offset
        self._room_for(len(mv))
        first = self.next_offset
        if not mv.readonly:
            frames.stamp_offsets(mv, first)
            data = mv
        else:
            data = bytearray(mv)
            frames.stamp_offsets(data, first)
        self._publish(data, first, count)
        return first, first + count - 1
