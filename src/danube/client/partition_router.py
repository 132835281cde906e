"""Which partition a message goes to: FNV-1a-64 of the routing key (`danube.model.partitions`,
as Danube's clients), else round robin."""

from __future__ import annotations

from danube.model.partitions import fnv1a_64, partition_topic

__all__ = ["PartitionRouter", "fnv1a_64", "partition_topic"]


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
