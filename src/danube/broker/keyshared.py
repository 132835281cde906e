"""Key-shared routing: a consistent-hash ring with 100 virtual nodes per
consumer, and glob key filters (``user-*``, ``eu-west-?``).

A message's key is its routing key, else its producer's name.  A consumer with
filters only receives keys matching one of them; the ring is walked from the
key's point to the first consumer that accepts the key, so adding or removing
a consumer moves only the keys that hashed next to it.
"""

from __future__ import annotations

import bisect
import fnmatch
import re
from typing import Iterable

import xxhash

VIRTUAL_NODES = 100


def key_hash(key: str) -> int:
    return xxhash.xxh64_intdigest(key.encode("utf-8"))


class KeyFilter:
    """Glob patterns; no patterns means every key."""

    __slots__ = ("patterns", "_regex")

    def __init__(self, patterns: Iterable[str] = ()) -> None:
        self.patterns = tuple(p for p in patterns if p)
        self._regex = (
            re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in self.patterns)) if self.patterns else None
        )

    def matches(self, key: str) -> bool:
        return self._regex is None or self._regex.match(key) is not None


class HashRing:
    def __init__(self) -> None:
        self._points: list[int] = []
        self._owners: list[int] = []
        self._filters: dict[int, KeyFilter] = {}
        self._cache: dict[str, int | None] = {}

    def __len__(self) -> int:
        return len(self._filters)

    def consumers(self) -> list[int]:
        return list(self._filters)

    def add(self, consumer_id: int, key_filter: KeyFilter | None = None) -> None:
        if consumer_id in self._filters:
            self._filters[consumer_id] = key_filter or KeyFilter()
            self._cache.clear()
            return
        self._filters[consumer_id] = key_filter or KeyFilter()
        for v in range(VIRTUAL_NODES):
            point = key_hash(f"{consumer_id}#{v}")
            i = bisect.bisect_left(self._points, point)
            self._points.insert(i, point)
            self._owners.insert(i, consumer_id)
        self._cache.clear()

    def remove(self, consumer_id: int) -> None:
        if self._filters.pop(consumer_id, None) is None:
            return
        keep = [(p, o) for p, o in zip(self._points, self._owners) if o != consumer_id]
        self._points = [p for p, _ in keep]
        self._owners = [o for _, o in keep]
        self._cache.clear()

    def owner(self, key: str) -> int | None:
        """The consumer for ``key``, or None when no consumer's filters accept it."""
        cached = self._cache.get(key, -1)
        if cached != -1:
            return cached
        result = None
        n = len(self._points)
        if n:
            start = bisect.bisect_left(self._points, key_hash(key)) % n
            tried: set[int] = set()
            for step in range(n):
                owner = self._owners[(start + step) % n]
                if owner in tried:
                    continue
                if self._filters[owner].matches(key):
                    result = owner
                    break
                tried.add(owner)
                if len(tried) == len(self._filters):
                    break
        if len(self._cache) > 100_000:
            self._cache.clear()
        self._cache[key] = result
        return result
