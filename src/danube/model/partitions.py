"""Which partition a keyed message goes to, and what a partition is called.

Matches Danube's clients (partition = FNV-1a-64(key as UTF-8) % n), so keyed messages land on the
same partition whichever client produced them, and a repartitioned topic keeps the same function
under every routing version (only the count changes).
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
