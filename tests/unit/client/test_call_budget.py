"""The client's Python calls for one message, counted: a one-message ``send_batch`` and its ack,
and a one-message delivery taken through a ConsumerSet and acked, each over the client's own
HTTP/2 transport (a fake server peer feeding its connection).

At a thousand topics of ten messages a second each, every message travels alone and pays each
step of these paths.  The budgets hold the flattened paths (docs/client.md, "Transport"); a change
that puts calls back fails here rather than in a noisy end-to-end run.  Only calls of
``danube.client`` code are counted (not asyncio's, not the test's).
"""

from __future__ import annotations

import asyncio
import os
import sys
from types import SimpleNamespace

from danube import message_codec
from danube.client.connection import RetryPolicy
from danube.client.consumer import Consumer
from danube.client.consumer_set import ConsumerSet
from danube.client.consumer_stream import PartitionConsumer
from danube.client.h2 import frames
from danube.client.h2.call import H2StreamCall
from danube.client.partition_router import PartitionRouter
from danube.client.producer import Producer
from danube.client.producer_stream import PartitionProducer
from danube.proto.danube_batch import batch_pb2 as pb
from tests.unit.client.h2.peer import Peer, messages_bytes, turn

CLIENT = os.sep + os.path.join("danube", "client") + os.sep

# Python calls of danube.client per message when the budgets were set: a send and its ack 11
# (27 before the paths were flattened), a delivery taken through a ConsumerSet and acked 14 (31).
SEND_AND_ACK_BUDGET = 12
DELIVERY_AND_ACK_BUDGET = 15


class Counter:
    """Python function calls (and coroutine resumptions) of danube.client code while on."""

    def __init__(self) -> None:
        self.calls = 0
        self.names: list[str] = []

    def _profile(self, frame, event, arg) -> None:
        if event == "call" and CLIENT in frame.f_code.co_filename:
            self.calls += 1
            self.names.append(frame.f_code.co_name)

    def __enter__(self) -> Counter:
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(None)


def _data(stream_id: int, responses: list) -> bytes:
    return frames.frame(frames.DATA, 0, stream_id, messages_bytes([r.SerializeToString() for r in responses]))


async def test_a_one_message_send_and_its_ack_stay_within_the_call_budget():
    peer = Peer()
    peer.feed(peer.settings())
    producer = Producer(SimpleNamespace(retry=RetryPolicy()), "/ns/t", "p")
    part = PartitionProducer(producer, "/ns/t")
    part.producer_id = 7
    calls: list[H2StreamCall] = []

    def publish() -> H2StreamCall:
        calls.append(H2StreamCall(peer, b"", pb.PublishRequest.SerializeToString, pb.PublishAck.FromString))
        return calls[0]

    part._conn = SimpleNamespace(batch_lane=SimpleNamespace(Publish=publish))
    producer._router, producer._parts = PartitionRouter(1), [part]
    stream = asyncio.ensure_future(part._stream())
    await turn()
    (call,) = calls
    peer.feed(peer.response_headers(call.stream_id))
    offsets = []
    for seq in (1, 2, 3):  # the first two warm up (the writer's first wait, the first ack)
        with Counter() as counted:
            fut = await producer.send_batch([b"x" * 100])
            await turn()  # the request leaves in this turn's socket write
            ack = pb.PublishAck(sequence=seq, producer_id=7, first_offset=seq * 10, last_offset=seq * 10, count=1)
            peer.feed(_data(call.stream_id, [ack]))
            offsets.append(await fut)
    sent = [f for f in peer.sent() if f[0] == frames.DATA]
    reader = frames.MessageReader(1 << 20)
    requests = [pb.PublishRequest.FromString(m) for m in reader.feed(b"".join(f[3] for f in sent))]
    assert [r.sequence for r in requests] == [1, 2, 3]
    assert [[rec.payload for rec in message_codec.decode_batch(r.frames)] for r in requests] == [[b"x" * 100]] * 3
    assert offsets == [[10], [20], [30]]
    assert counted.calls <= SEND_AND_ACK_BUDGET, counted.names
    stream.cancel()
    await asyncio.gather(stream, return_exceptions=True)


async def test_a_one_message_delivery_and_its_ack_stay_within_the_call_budget():
    peer = Peer()
    peer.feed(peer.settings())
    consumer = Consumer(SimpleNamespace(retry=RetryPolicy()), "/ns/t", "c", "s")
    part = PartitionConsumer(consumer, 0, "/ns/t")
    consumer._parts = [part]
    calls: list[H2StreamCall] = []

    def consume() -> H2StreamCall:
        calls.append(H2StreamCall(peer, b"", lambda r: r, pb.ConsumeResponse.FromString))
        return calls[0]

    lane = SimpleNamespace(batch_lane=SimpleNamespace(Consume=consume))
    conn = SimpleNamespace(open_consume_lane=lambda: lane, close_consume_lane=lambda lane: None)
    stream = asyncio.ensure_future(part._stream(conn))
    await turn()
    (call,) = calls
    subscribed = pb.ConsumeResponse(subscribed=pb.Subscribed(consumer_id=5))
    peer.feed(peer.response_headers(call.stream_id) + _data(call.stream_id, [subscribed]))
    await turn()
    group = ConsumerSet([consumer])
    got = []
    for offset in (0, 1, 2):  # the first two warm up
        frame = message_codec.encode_payloads([b"m%d" % offset], publish_time=1, producer_id=7)
        delivery = pb.ConsumeResponse(
            batch=pb.ConsumeBatch(frames=frame, first_offset=offset, last_offset=offset, count=1)
        )
        with Counter() as counted:
            peer.feed(_data(call.stream_id, [delivery]))
            for c, batches in await group.receive():
                for batch in batches:
                    got.append(batch)
                    await c.ack_batch(batch)
    assert [bytes(p) for batch in got for p in batch.payloads()] == [b"m0", b"m1", b"m2"]
    assert part.acked.ranges() == [(0, 2)]
    assert counted.calls <= DELIVERY_AND_ACK_BUDGET, counted.names
    group.close()
    stream.cancel()
    await asyncio.gather(stream, return_exceptions=True)
