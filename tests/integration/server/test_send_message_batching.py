"""Danube's unary SendMessage over a real grpc.aio server and a real broker (WAL, sync=always):
concurrent calls are stored as shared batches, each answered with its own message stored."""

import asyncio

import grpc
import pytest

from danube import message_codec
from danube.broker import TopicPolicies
from danube.proto.danube import DanubeApi_pb2 as pb
from danube.proto.danube import DanubeApi_pb2_grpc as pb_grpc
from danube.server import danube_services
from tests.support.inprocess import served_broker

pytestmark = pytest.mark.timeout(60)
T = "/default/unary"


@pytest.fixture()
async def served(tmp_path):
    policies = TopicPolicies(max_message_size=1000)
    async with served_broker(tmp_path, danube_services.add_to_server, sync="always", policies=policies) as (
        broker,
        channel,
    ):
        yield broker, pb_grpc.ProducerServiceStub(channel)


async def test_concurrent_send_message_calls_are_batched_and_all_stored(served):
    broker, producers = served
    p = await producers.CreateProducer(
        pb.ProducerRequest(request_id=1, producer_name="p", topic_name=T, dispatch_strategy=pb.Reliable)
    )
    cid = await broker.subscribe(T, "s", "c", reliable=None)

    def message(i: int, payload: bytes) -> pb.StreamMessage:
        return pb.StreamMessage(
            request_id=100 + i,
            msg_id=pb.MsgID(producer_id=p.producer_id, topic_name=T),
            payload=payload,
            publish_time=i,
            producer_name="p",
        )

    answers = await asyncio.gather(
        *(producers.SendMessage(message(i, f"m{i}".encode())) for i in range(150)),
        producers.SendMessage(message(999, b"x" * 5000)),
        return_exceptions=True,
    )
    ok, too_large = answers[:150], answers[150]
    assert [a.request_id for a in ok] == [100 + i for i in range(150)]
    assert isinstance(too_large, grpc.aio.AioRpcError)
    assert too_large.code() == grpc.StatusCode.INVALID_ARGUMENT  # that call alone fails

    coalescer = broker.topics[T].coalescer
    assert coalescer.messages == 150
    assert coalescer.batches < 150
    assert coalescer.durability_waits < 150
    got = []
    while len(got) < 150:
        d = await asyncio.wait_for(broker.receive(cid, max_messages=1000, max_bytes=1 << 20), 5)
        got += [bytes(r.payload).decode() for r in message_codec.iter_records(d.frames)]
    assert sorted(got) == sorted(f"m{i}" for i in range(150))
