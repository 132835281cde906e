"""Segment topics on danube brokers: the controller's :class:`SegmentOps` (Pulsar PIP-468's Segments API).

A segment topic is an ordinary reliable topic.  Creating one writes its metadata (delivery
``reliable``, and each subscription with its cursor at ``-1``: Earliest), so it exists before any
producer or consumer reaches whichever broker comes to own it.

Terminating (sealing) a segment terminates its topic (``BrokerService.terminate_topic``): the
topic's terminated marker (``keys.topic_terminated``) is written, and the broker serving the topic
flags it, so every publish from then on fails with ``TopicTerminatedError`` (FAILED_PRECONDITION,
not retriable: the scalable producer re-routes the messages to the children).  Both publish paths
check the flag right before the append, so a publish is either stored before the seal or refused;
a broker that opens the segment later (a move, a restart) reads the marker before it serves it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Mapping

from danube import message_codec
from danube.errors import InvalidArgumentError, NotServedHereError
from danube.metadata import keys

if TYPE_CHECKING:
    from danube.broker.service import BrokerService

log = logging.getLogger(__name__)


class BrokerSegmentOps:
    """SegmentOps against the metadata store and one BrokerService (the broker serving the segments:
    a standalone broker, or the owner that a cluster forwards the call to)."""

    def __init__(self, broker: BrokerService) -> None:
        self.broker = broker
        self.metadata = broker.metadata

    async def create_segment(self, topic: str, subscriptions: Mapping[str, str]) -> None:
        key = keys.topic_delivery(topic)
        if await self.metadata.get(key) is None:
            await self.metadata.put_if_version(key, b'{"dispatch_strategy":"reliable"}', 0)
        for name, sub_type in subscriptions.items():
            await self.create_subscription(topic, name, sub_type)

    async def create_subscription(self, topic: str, subscription: str, sub_type: str) -> None:
        key = keys.subscription(topic, subscription)
        if await self.metadata.get(key) is not None:
            return
        served = self.broker.topics.get(topic)
        if served is not None:  # open here: the broker creates it (cursor at its latest offset)
            await self.broker.subscription(served, subscription, sub_type)
            return
        await self.metadata.put_json(keys.subscription_cursor(topic, subscription), -1)  # Earliest
        await self.metadata.put_json(key, {"type": sub_type, "created_at": int(time.time() * 1000)})

    async def terminate_segment(self, topic: str) -> None:
        """Terminate the segment topic: the marker, and the flag if it is served here.  Then it is
        opened here if it is not (reading the marker, so flagged), so a cluster that does not place
        the segment here answers NotServedHereError and the call is forwarded to the owner."""
        await self.broker.terminate_topic(topic)
        if topic not in self.broker.topics and await self.metadata.get(keys.topic_delivery(topic)) is not None:
            await self.broker.topic(topic)

    async def stored_messages(self, topic: str, producer_id: int, after_offset: int, since_ms: int) -> list[int]:
        """The offsets of ``producer_id``'s messages stored in the sealed segment above
        ``after_offset``, published (the producer's stamp) at ``since_ms`` or later.

        Only a sealed segment's answer is final (nothing is appended after the seal), so an open
        one is refused.  A producer's id is stable per (topic, producer name), so these are the
        messages of that producer whose acks it never got: the scalable producer asks before it
        re-sends a sealed segment's unanswered messages to the children (docs/scalable-topics.md)."""
        if not await self.is_terminated(topic):
            raise InvalidArgumentError(f"segment {topic} is not sealed: what it stores is not final yet")
        served = self.broker.topics.get(topic)
        if served is None:
            served = await self.broker.topic(topic)  # NotServedHereError where a cluster places it elsewhere
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10.0
        # batches appended before the seal may still wait for their durability; read what is final
        while served.readable_next < served.storage.next_offset:
            if loop.time() > deadline:
                raise NotServedHereError(f"segment {topic}: stored messages are still being committed; ask again")
            await asyncio.sleep(0.01)
        end = served.readable_next
        position = max(after_offset + 1, served.first_offset)
        found: list[int] = []
        while position < end:
            buf = await served.read_frames(position, 1 << 20)
            start = position
            for record in message_codec.iter_records(buf):
                if record.offset < start:
                    continue
                if record.offset >= end:
                    return found
                if record.producer_id == producer_id and record.publish_time >= since_ms:
                    found.append(record.offset)
                position = record.offset + 1
            if position == start:  # nothing more to read
                break
        return found

    async def is_terminated(self, topic: str) -> bool:
        return await self.metadata.get(keys.topic_terminated(topic)) is not None

    async def delete_segment(self, topic: str) -> None:
        """Stop serving the segment here, forget it (metadata, cluster assignment), then delete its
        stored data (``StorageFactory.delete_topic``: opens refused meanwhile, so nothing writes it
        again).  The broker serving it must be the one called (ForwardingSegmentOps sees to it)."""
        broker = self.broker

        async def unload() -> None:
            if topic in broker.topics:  # before the metadata: its last cursor flush writes cursors
                await broker.unload_topic(topic, local=True, seal=False)
            await self.metadata.delete_prefix(keys.topic_root(topic) + "/")
            cluster = broker.cluster
            if cluster is not None:
                for broker_id in {cluster.view.owner(topic), str(cluster.broker_id)}:
                    if broker_id is not None:
                        await self.metadata.delete(keys.broker_topic(broker_id, topic))
                await self.metadata.delete(keys.unassigned(topic))

        factory = broker.storage_factory
        if factory is None:
            await unload()
        else:
            await factory.delete_topic(topic, unload=unload)

    async def segment_subscriptions(self, topic: str) -> dict[str, str]:
        prefix = keys.topic_subscriptions(topic)
        out = {}
        for kv in await self.metadata.get_prefix(prefix):
            rest = kv.key[len(prefix) :]
            if "/" not in rest:
                import json

                out[rest] = json.loads(kv.value).get("type", "failover")
        served = self.broker.topics.get(topic)
        if served is not None:
            for name, sub in served.subscriptions.items():
                out.setdefault(name, sub.sub_type)
        return out

    async def delete_subscription(self, topic: str, subscription: str) -> None:
        served = self.broker.topics.get(topic)
        if served is not None and subscription in served.subscriptions:
            served.subscriptions.pop(subscription, None)
        await self.metadata.delete(keys.subscription(topic, subscription))
        await self.metadata.delete_prefix(keys.subscription(topic, subscription) + "/")

    async def backlog(self, topic: str, subscription: str) -> int:
        stats = await self.segment_stats(topic)
        return int(stats.get("subscriptions", {}).get(subscription, {}).get("backlog", 0))

    async def segment_stats(self, topic: str) -> dict[str, Any]:
        """Counters of the segment, opening it here if it exists and is not open (its owner answers:
        a cluster that places it elsewhere raises NotServedHereError).  Every subscription is listed,
        also one no consumer attached to yet (its backlog from the stored cursor)."""
        served = self.broker.topics.get(topic)
        if served is None and await self.metadata.get(keys.topic_delivery(topic)) is not None:
            served = await self.broker.topic(topic)
        out: dict[str, Any] = {
            "topic": topic,
            "terminated": await self.is_terminated(topic),
            "served_here": served is not None,
        }
        if served is None:
            return out
        st = served.stats()
        subs = {
            s.name: {
                "type": s.sub_type,
                "consumers": s.consumers,
                "cursor": s.cursor,
                "backlog": s.backlog,
                "unacked": s.unacked,
            }
            for s in st.subscriptions
        }
        for name, sub_type in (await self.segment_subscriptions(topic)).items():
            if name not in subs:
                cursor = await self.metadata.get_json(keys.subscription_cursor(topic, name))
                cursor = cursor if isinstance(cursor, int) else -1
                subs[name] = {
                    "type": sub_type,
                    "consumers": 0,
                    "cursor": cursor,
                    "backlog": max(0, served.readable_next - 1 - cursor),
                    "unacked": 0,
                }
        out.update(
            messages_in=st.messages_in,
            bytes_in=st.bytes_in,
            next_offset=st.next_offset,
            producers=st.producers,
            consumers=st.consumers,
            subscriptions=subs,
        )
        return out
