"""In-memory SegmentOps and a lease source for controller tests."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from danube.errors import NotFoundError


@dataclass
class FakeSegment:
    terminated: bool = False
    subscriptions: dict[str, int] = field(default_factory=dict)  # name -> backlog
    types: dict[str, str] = field(default_factory=dict)  # name -> subscription type
    messages_in: int = 0


class MemorySegmentOps:
    """Segment topics as dicts; ``calls`` records every operation in order."""

    def __init__(self) -> None:
        self.segments: dict[str, FakeSegment] = {}
        self.calls: list[tuple[str, str]] = []

    async def create_segment(self, topic: str, subscriptions: Mapping[str, str]) -> None:
        self.calls.append(("create", topic))
        seg = self.segments.setdefault(topic, FakeSegment())
        for s, t in subscriptions.items():
            seg.subscriptions.setdefault(s, 0)
            seg.types.setdefault(s, t)

    async def terminate_segment(self, topic: str) -> None:
        self.calls.append(("terminate", topic))
        self._get(topic).terminated = True

    async def delete_segment(self, topic: str) -> None:
        self.calls.append(("delete", topic))
        self.segments.pop(topic, None)

    async def segment_subscriptions(self, topic: str) -> dict[str, str]:
        seg = self._get(topic)
        return {s: seg.types.get(s, "failover") for s in sorted(seg.subscriptions)}

    async def create_subscription(self, topic: str, subscription: str, sub_type: str) -> None:
        seg = self._get(topic)
        seg.subscriptions.setdefault(subscription, 0)
        seg.types.setdefault(subscription, sub_type)

    async def delete_subscription(self, topic: str, subscription: str) -> None:
        if topic in self.segments:
            self.segments[topic].subscriptions.pop(subscription, None)

    async def backlog(self, topic: str, subscription: str) -> int:
        return self._get(topic).subscriptions.get(subscription, 0)

    async def segment_stats(self, topic: str) -> dict[str, Any]:
        seg = self._get(topic)
        return {
            "terminated": seg.terminated,
            "messages_in": seg.messages_in,
            "subscriptions": {n: {"backlog": b} for n, b in seg.subscriptions.items()},
        }

    def _get(self, topic: str) -> FakeSegment:
        try:
            return self.segments[topic]
        except KeyError:
            raise NotFoundError(f"segment topic {topic} does not exist") from None


class StoreLease:
    """A lease of its own (what a broker's Membership provides)."""

    def __init__(self) -> None:
        self.lease_id = 0
        self.fenced = False

    @classmethod
    async def grant(cls, store, ttl: int = 30) -> "StoreLease":
        lease = cls()
        lease.lease_id = await store.grant_lease(ttl)
        return lease
