"""A producer's sealed batch: its messages, the futures to resolve, its frames once encoded.

Encoded once per producer id by the compiled codec (``danube.message_codec``); re-encoded only
when the producer was re-created under a new id (a resend after a reconnect).
"""

from __future__ import annotations

import time

from danube import message_codec as frame_codec

# Per-message bookkeeping estimate (frame header + fixed body) used to size batches.
FRAME_OVERHEAD = 38


class Batch:
    """A sealed batch: what to encode, who to tell, and its wire form once encoded."""

    __slots__ = (
        "payloads",
        "keys",
        "attributes",
        "futures",
        "done",
        "frames",
        "encoded_for",
        "sent_at",
        "key",
        "attrs",
        "version",
        "offsets",
    )

    def __init__(
        self, payloads, keys=None, attributes=None, futures=None, done=None, key=None, attrs=None, offsets=False
    ) -> None:
        self.payloads = payloads
        self.keys = keys  # per-message keys (send path) or None
        self.attributes = attributes
        self.futures = futures  # per-message futures (send path) or None
        self.done = done  # one future for all (send_batch path) or None
        self.offsets = offsets  # done gets the list of offsets, else the pair (first, last)
        self.key = key  # one key for all (send_batch path)
        self.attrs = attrs
        self.frames: bytes | None = None
        self.encoded_for = -1
        self.sent_at = 0.0
        self.version: int | None = None  # the partitioning version its messages were routed under

    def encode(self, producer_id: int, schema_attrs: dict | None = None) -> bytes:
        """The batch's frames; ``schema_attrs`` (the schema id/version pair) go on every frame."""
        if self.frames is None or self.encoded_for != producer_id:
            now_ms = int(time.time() * 1000)
            if self.keys is None or (not any(k is not None for k in self.keys) and not any(self.attributes)):
                attrs = self.attrs
                if schema_attrs:
                    attrs = {**attrs, **schema_attrs} if attrs else schema_attrs
                self.frames = frame_codec.encode_payloads(
                    self.payloads, publish_time=now_ms, producer_id=producer_id, key=self.key, attributes=attrs
                )
            else:
                attributes = self.attributes
                if schema_attrs:
                    attributes = [{**a, **schema_attrs} if a else schema_attrs for a in attributes]
                self.frames = frame_codec.encode_records(
                    [(now_ms, producer_id, k, a, p) for k, a, p in zip(self.keys, attributes, self.payloads)]
                )
            self.encoded_for = producer_id
        return self.frames

    def resolve(self, first: int, last: int) -> None:
        if self.futures is not None:
            for i, fut in enumerate(self.futures):
                if not fut.done():
                    fut.set_result(first + i)
        if self.done is not None and not self.done.done():
            self.done.set_result(list(range(first, last + 1)) if self.offsets else (first, last))

    def fail(self, error: BaseException) -> None:
        if self.futures is not None:
            for fut in self.futures:
                if not fut.done():
                    fut.set_exception(error)
        if self.done is not None and not self.done.done():
            self.done.set_exception(error)
