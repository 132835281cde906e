"""Which partition a message goes to: FNV-1a-64 of the routing key, else round robin.

Matches Danube's clients (partition = FNV-1a-64(key as UTF-8) % n), so keyed
messages land on the same partition whichever client produced them.
"""

from __future__ import annotations

FNV_OFFSET_BASIS = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
_MASK = 0xFFFFFFFFFFFFFFFF


def fnv1a_64(data: bytes) -> int:
    h = FNV_OFFSET_BASIS
    for byte in data:
        h = ((h ^ byte) * FNV_PRIME) & _MASK
    return h


def partition_topic(topic: str, index: int) -> str:
    """Name of partition ``index`` of the partitioned topic ``topic``."""
    return f"{topic}-part-{index}"


class PartitionRouter:
    """Chooses a partition index for each message (keyed: hash; unkeyed: round robin)."""

    def __init__(self, partitions: int) -> None:
        if partitions < 1:
            raise ValueError("a topic has at least one partition")
        self.partitions = partitions
        self._next = 0

    def route(self, key: str | None) -> int:
        if self.partitions == 1:
            return 0
        if key is not None:
            return fnv1a_64(key.encode("utf-8")) % self.partitions
        index = self._next
        self._next = (index + 1) % self.partitions
        return index
