"""Danube's unary SendMessage over a real grpc.aio server and a real broker (WAL, sync=always):
concurrent calls are stored as shared batches, each answered with its own message stored."""

import asyncio
import contextlib

import grpc
import pytest

from danube import frames
from danube.broker import BrokerService, TopicPolicies
from danube.metadata.embedded import EmbeddedMetadataStore
from danube.proto.danube import DanubeApi_pb2 as pb
from danube.proto.danube import DanubeApi_pb2_grpc as pb_grpc
from danube.server import danube_services
from danube.storage.config import StorageConfig
from danube.storage.factory import StorageFactory

pytestmark = pytest.mark.timeout(60)
T = "/default/unary"


@pytest.fixture()
async def served(tmp_path):
    metadata = EmbeddedMetadataStore(str(tmp_path / "metadata.db"))
    factory = StorageFactory(StorageConfig.from_dict({"wal": {"sync": "always"}}, data_dir=str(tmp_path)),
                             metadata, broker_id="test")
    broker = BrokerService(metadata, factory, policies=TopicPolicies(max_message_size=1000))
    await broker.start()
    server = grpc.aio.server()
    danube_services.add_to_server(server, broker)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield broker, pb_grpc.ProducerServiceStub(channel)
    finally:
        await channel.close()
        await server.stop(None)
        with contextlib.suppress(Exception):
            await broker.stop()
            await metadata.close()


async def test_concurrent_send_message_calls_are_batched_and_all_stored(served):
    broker, producers = served
    p = await producers.CreateProducer(pb.ProducerRequest(request_id=1, producer_name="p", topic_name=T,
                                                          dispatch_strategy=pb.Reliable))
    cid = await broker.subscribe(T, "s", "c", reliable=None)

    def message(i: int, payload: bytes) -> pb.StreamMessage:
        return pb.StreamMessage(request_id=100 + i, msg_id=pb.MsgID(producer_id=p.producer_id, topic_name=T),
                                payload=payload, publish_time=i, producer_name="p")

    answers = await asyncio.gather(
        *(producers.SendMessage(message(i, f"m{i}".encode())) for i in range(150)),
        producers.SendMessage(message(999, b"x" * 5000)), return_exceptions=True)
    ok, too_large = answers[:150], answers[150]
    assert [a.request_id for a in ok] == [100 + i for i in range(150)]
    assert isinstance(too_large, grpc.aio.AioRpcError)
    assert too_large.code() == grpc.StatusCode.INVALID_ARGUMENT   # that call alone fails

    coalescer = broker.topics[T].coalescer
    assert coalescer.messages == 150
    assert coalescer.batches < 150
    assert coalescer.durability_waits < 150
    got = []
    while len(got) < 150:
        d = await asyncio.wait_for(broker.receive(cid, max_messages=1000, max_bytes=1 << 20), 5)
        got += [bytes(r.payload).decode() for r in frames.iter_records(d.frames)]
    assert sorted(got) == sorted(f"m{i}" for i in range(150))
