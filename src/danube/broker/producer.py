"""A producer attached to a topic on this broker."""

from __future__ import annotations

ACCESS_MODES = ("shared", "exclusive")


class Producer:
    __slots__ = ("id", "name", "topic", "access_mode", "messages_in", "bytes_in", "closed")

    def __init__(self, producer_id: int, name: str, topic, access_mode: str) -> None:
        self.id = producer_id
        self.name = name
        self.topic = topic
        self.access_mode = access_mode
        self.messages_in = 0
        self.bytes_in = 0
        self.closed = False  # dropped by the broker (unload): health answers CLOSE
