"""In-memory storage of a non-reliable topic: at-most-once, bounded history.

Same shape as ``danube.storage.TopicStorage`` so one dispatch path serves both
kinds of topic.  Offsets are stamped as in the WAL; the oldest batches are
dropped once the history exceeds its byte budget, and a subscriber that falls
behind skips to the oldest batch still held (messages it missed are lost, which
is what non-reliable means).
"""

from __future__ import annotations

import asyncio
import bisect
from typing import AsyncIterator

from danube import message_codec
from danube.errors import TopicSealedError


class MemoryTopicStorage:
    def __init__(self, topic: str, *, max_bytes: int, initial_offset: int = 0) -> None:
        self.topic = topic
        self.next_offset = initial_offset
        self.first_offset = initial_offset
        self._max_bytes = max_bytes
        self._firsts: list[int] = []
        self._chunks: list[bytes | bytearray] = []
        self._bytes = 0
        self._closed = False
        self._read_only: str | None = None
        self._appended = asyncio.Event()

    @property
    def durable_offset(self) -> int:
        return self.next_offset - 1

    def append_frames(self, buf: bytearray) -> tuple[int, int]:
        if self._closed:
            raise TopicSealedError(f"topic {self.topic} is closed on this broker")
        if self._read_only is not None:
            raise TopicSealedError(
                f"topic {self.topic} is read-only on this broker: {self._read_only}; publish refused, nothing stored",
                retriable=True,
            )
        base = self.next_offset
        message_codec.validate(buf)
        count = message_codec.stamp_offsets(buf, base)
        if count == 0:
            return base, base - 1
        self._firsts.append(base)
        self._chunks.append(buf)
        self._bytes += len(buf)
        self.next_offset = base + count
        while self._bytes > self._max_bytes and len(self._chunks) > 1:
            self._bytes -= len(self._chunks[0])
            del self._chunks[0]
            del self._firsts[0]
            self.first_offset = self._firsts[0]
        self._appended.set()
        self._appended = asyncio.Event()
        return base, self.next_offset - 1

    def durable_now(self, offset: int) -> bool:
        return True

    async def wait_durable(self, offset: int) -> None:
        return None

    def read_frames_now(self, from_offset: int, max_bytes: int) -> memoryview | bytes:
        """Whole frames from ``from_offset`` (at least one if any), up to about ``max_bytes``."""
        if from_offset >= self.next_offset or not self._chunks:
            return b""
        from_offset = max(from_offset, self.first_offset)
        i = bisect.bisect_right(self._firsts, from_offset) - 1
        chunk = memoryview(self._chunks[i])
        pos = message_codec.find_offset(chunk, from_offset)
        if pos < 0:
            return b""
        return chunk[pos:]

    def read_deliverable_now(self, from_offset: int, max_messages: int, max_bytes: int):
        """``(frames, count)`` from ``from_offset``, cut to ``max_messages`` and ``max_bytes`` (at
        least one frame), each one a subscriber can decode; None otherwise (as the WAL's)."""
        data = self.read_frames_now(from_offset, max_bytes)
        if not data or max_messages < 1 or int.from_bytes(data[:8], "little") != from_offset:
            return None
        view = data if type(data) is memoryview else memoryview(data)
        end, count = message_codec.frames_within(view, max_messages, max_bytes)
        view = view[:end]
        if message_codec.check_fields(view)[0] >= 0:
            return None
        return view, count

    async def read_frames(self, from_offset: int, max_bytes: int) -> memoryview | bytes:
        return self.read_frames_now(from_offset, max_bytes)

    async def tail_frames(self, from_offset: int, max_bytes: int) -> AsyncIterator[memoryview | bytes]:
        while not self._closed:
            data = self.read_frames_now(from_offset, max_bytes)
            if data:
                _count, _first, last = message_codec.validate(data)
                from_offset = last + 1
                yield data
            else:
                await self._appended.wait()

    async def seal(self) -> int:
        self._closed = True
        self._appended.set()
        return self.next_offset - 1

    async def make_read_only(self, reason: str) -> int:  # nothing to release: reads go on as before
        self._read_only = reason
        return self.next_offset - 1

    async def close(self, *, export: bool = False) -> None:  # nothing durable to export
        self._closed = True
        self._appended.set()
