"""TEST DOUBLE of ``danube.broker.service.BrokerService`` for unit tests of the batch lane and client.

In memory, one log per topic, exclusive-style cursors per consumer; it follows
the BrokerService contract of docs/internals.md closely enough to exercise the
server edge and the client (validate → stamp → append; receive waits; acks).
Integration tests use the real broker (tests/support/broker.py).  Also serves
a minimal Danube ``Discovery`` (lookup answers Connect; partitions from
``partitioned``) so the client can run against it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import grpc

from danube import message_codec as frame_codec
from danube.errors import InvalidArgumentError, NotFoundError
from danube.proto.danube import DanubeApi_pb2 as danube_pb
from danube.proto.danube import DanubeApi_pb2_grpc as danube_grpc


@dataclass
class Delivery:
    frames: memoryview | bytes
    first_offset: int
    last_offset: int
    count: int
    redelivery_counts: list[int] = field(default_factory=list)


class FakeTopic:
    def __init__(self) -> None:
        self.log = bytearray()
        self.positions: list[int] = []  # byte position of each offset
        self.changed = asyncio.Condition()


class FakeBroker:
    def __init__(self) -> None:
        self.topics: dict[str, FakeTopic] = {}
        self.producers: dict[int, str] = {}
        self.producer_names: dict[tuple[str, str], int] = {}
        self.consumers: dict[int, dict] = {}
        self.acked: dict[int, set[int]] = {}
        self.nacked: list[tuple[int, int, int | None]] = []
        self.partitioned: dict[str, int] = {}
        self.publish_calls = 0
        self.ack_calls = 0  # ack requests read off the Consume streams
        # BrokerService's slots the edges read (broker/contracts.py): none filled here
        self.metadata = None
        self.schema_gate = None
        self.cluster = None

    async def create_producer(self, topic, producer_name, *, access_mode="shared", reliable=True) -> int:
        if not topic.startswith("/") or topic.count("/") != 2:
            raise InvalidArgumentError(f"invalid topic name {topic!r}")
        key = (topic, producer_name)
        if key not in self.producer_names:
            pid = len(self.producers) + 1
            self.producer_names[key] = pid
            self.producers[pid] = topic
            self.topics.setdefault(topic, FakeTopic())
        return self.producer_names[key]

    async def publish(self, producer_id, frames: bytearray, *, partitioning_version=None):
        self.publish_calls += 1
        if producer_id not in self.producers:
            raise NotFoundError(f"producer {producer_id} not found")
        count, _, _ = frame_codec.validate(frames)
        topic = self.topics[self.producers[producer_id]]
        base = len(topic.positions)
        frame_codec.stamp_offsets(frames, base)
        start = len(topic.log)
        topic.positions.extend(start + p for p in frame_codec.frame_positions(frames))
        topic.log.extend(frames)
        async with topic.changed:
            topic.changed.notify_all()
        await asyncio.sleep(0)  # "durable"
        return base, base + count - 1

    async def subscribe(
        self,
        topic,
        subscription,
        consumer_name,
        *,
        sub_type="exclusive",
        key_filters=(),
        reliable=True,
        initial_position="latest",
    ) -> int:
        t = self.topics.setdefault(topic, FakeTopic())
        cid = len(self.consumers) + 1
        self.consumers[cid] = {"topic": topic, "cursor": 0 if initial_position == "earliest" else len(t.positions)}
        self.acked[cid] = set()
        return cid

    def health(self, client_type, id) -> bool:
        return id in (self.consumers if client_type == "consumer" else self.producers)

    async def receive(self, consumer_id, *, max_messages, max_bytes, interrupt=None, push=None) -> Delivery:
        # (``push`` is an offer the broker may ignore: the fake always returns its deliveries)
        consumer = self.consumers.get(consumer_id)
        if consumer is None:
            raise NotFoundError(f"consumer {consumer_id} not found")
        topic = self.topics[consumer["topic"]]

        def wake(_future) -> None:  # interrupt done: re-check under the condition
            async def notify() -> None:
                async with topic.changed:
                    topic.changed.notify_all()

            asyncio.ensure_future(notify())

        if interrupt is not None:
            interrupt.add_done_callback(wake)
        try:
            async with topic.changed:
                await topic.changed.wait_for(
                    lambda: consumer["cursor"] < len(topic.positions) or (interrupt is not None and interrupt.done())
                )
        finally:
            if interrupt is not None:
                interrupt.remove_done_callback(wake)
        if consumer["cursor"] >= len(topic.positions):
            return Delivery(b"", -1, -1, 0, [])  # interrupted (BrokerService.receive's contract)
        first = consumer["cursor"]
        last = min(len(topic.positions), first + max_messages) - 1
        start = topic.positions[first]
        while last > first:
            end = topic.positions[last + 1] if last + 1 < len(topic.positions) else len(topic.log)
            if end - start <= max_bytes:
                break
            last -= 1
        end = topic.positions[last + 1] if last + 1 < len(topic.positions) else len(topic.log)
        consumer["cursor"] = last + 1
        return Delivery(bytes(topic.log[start:end]), first, last, last - first + 1, [])

    async def ack(self, consumer_id, offsets) -> None:
        if consumer_id not in self.consumers:
            raise NotFoundError(f"consumer {consumer_id} not found")
        self.ack_calls += 1
        self.acked[consumer_id].update(offsets)

    def publish_nowait(self, producer_id, frames_buf, answer=None, tag=0):
        return None  # the batch lane then takes the awaited path (publish)

    def ack_ranges_now(self, consumer_id, ranges):
        return None  # not loaded here: the batch lane then awaits ack_ranges

    async def ack_ranges(self, consumer_id, ranges) -> int:
        offsets = [o for lo, hi in ranges for o in range(lo, hi + 1)]
        await self.ack(consumer_id, offsets)
        return len(offsets)

    def detach(self, consumer_id, stream=None) -> None:
        """Unacked deliveries go back to the subscription (nothing to do here)."""

    async def producer(self, producer_id):
        if producer_id not in self.producers:
            raise NotFoundError(f"unknown producer id {producer_id}")
        return producer_id

    async def nack(self, consumer_id, offset, *, delay_ms=None, reason=None) -> None:
        if consumer_id not in self.consumers:
            raise NotFoundError(f"consumer {consumer_id} not found")
        self.nacked.append((consumer_id, offset, delay_ms))


class FakeDiscovery(danube_grpc.DiscoveryServicer):
    def __init__(self, broker: FakeBroker) -> None:
        self.broker = broker

    async def TopicLookup(self, request, context):
        return danube_pb.TopicLookupResponse(
            request_id=request.request_id, response_type=danube_pb.TopicLookupResponse.Connect
        )

    async def TopicPartitions(self, request, context):
        n = self.broker.partitioned.get(request.topic)
        names = [f"{request.topic}-part-{i}" for i in range(n)] if n else [request.topic]
        return danube_pb.TopicPartitionsResponse(request_id=request.request_id, partitions=names)


async def start_fake_server(broker: FakeBroker, port: int = 0) -> tuple[grpc.aio.Server, int]:
    """A real grpc.aio server on 127.0.0.1 with the batch lane over the fake broker."""
    from danube.server.batch_lane import add_to_server

    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ("grpc.max_send_message_length", 64 * 1024 * 1024),
        ]
    )
    add_to_server(server, broker)
    danube_grpc.add_DiscoveryServicer_to_server(FakeDiscovery(broker), server)
    port = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, port
