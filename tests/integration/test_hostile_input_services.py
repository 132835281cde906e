"""Hostile input at the gRPC edge, in process: Danube's services, the batch lane and admin over a real
BrokerService with WAL storage.

A stored record whose routing key is not UTF-8 used to fail Danube's ReceiveMessages with
UNKNOWN on every retry; hostile names reached the storage layer; huge names came back whole
in grpc-message.
"""

from __future__ import annotations

import asyncio
import os
import struct

import grpc
import pytest

from danube import message_codec
from danube.broker import FailurePolicy
from danube.proto.danube import DanubeApi_pb2 as pb
from danube.proto.danube import DanubeApi_pb2_grpc as pb_grpc
from danube.proto.danube_admin import admin_pb2 as apb
from danube.proto.danube_admin import admin_pb2_grpc as apb_grpc
from danube.server import admin, batch_lane, danube_services
from tests.support.inprocess import served_broker

pytestmark = pytest.mark.timeout(60)


def raw_frame(key: bytes | None, *, payload: bytes = b"p") -> bytes:
    body = struct.pack("<QQBBHH", 1, 0, 1 if key is not None else 0, 0, 0, len(key or b"")) + (key or b"") + payload
    len_field = struct.pack("<I", len(body))
    return struct.pack("<QI", 0, message_codec.crc32c(body, message_codec.crc32c(len_field))) + len_field + body


def add_all(server, broker) -> None:
    danube_services.add_to_server(server, broker)
    batch_lane.add_to_server(server, broker)
    admin.add_to_server(server, broker)


def tree(root) -> set[str]:
    return {os.path.relpath(os.path.join(d, e), root) for d, dirs, files in os.walk(root) for e in dirs + files}


async def test_receive_messages_goes_past_a_stored_poison_record(tmp_path):
    policy = FailurePolicy(poison_policy="drop")
    async with served_broker(tmp_path, add_all, sync="never", failure_policy=policy) as (broker, channel):
        producers, consumers = pb_grpc.ProducerServiceStub(channel), pb_grpc.ConsumerServiceStub(channel)
        topic = "/default/stored-poison"
        p = await producers.CreateProducer(
            pb.ProducerRequest(producer_name="p", topic_name=topic, dispatch_strategy=pb.Reliable)
        )
        c = await consumers.Subscribe(pb.ConsumerRequest(topic_name=topic, consumer_name="c", subscription="s"))
        t = broker.topics[topic]
        first, last = t.append(bytearray(raw_frame(b"\xff\xfe", payload=b"poison")))  # below the publish check
        t.committed(1, 0, last, 0.0)
        for text in ("after-1", "after-2"):
            await producers.SendMessage(
                pb.StreamMessage(
                    msg_id=pb.MsgID(producer_id=p.producer_id, topic_name=topic), payload=text.encode(), routing_key="k"
                )
            )
        stream = consumers.ReceiveMessages(pb.ReceiveRequest(consumer_id=c.consumer_id))
        got = []
        async for msg in stream:
            got.append((msg.payload, msg.msg_id.topic_offset))
            if len(got) == 2:
                break
        stream.cancel()
        assert got == [(b"after-1", 1), (b"after-2", 2)]


async def test_hostile_names_at_every_edge_are_invalid_argument_and_touch_no_file(tmp_path):
    async with served_broker(tmp_path, add_all, sync="never") as (broker, channel):
        producers = pb_grpc.ProducerServiceStub(channel)
        consumers = pb_grpc.ConsumerServiceStub(channel)
        discovery = pb_grpc.DiscoveryStub(channel)
        topics_admin = apb_grpc.TopicAdminStub(channel)
        namespaces_admin = apb_grpc.NamespaceAdminStub(channel)
        await producers.CreateProducer(
            pb.ProducerRequest(producer_name="p", topic_name="/default/ok", dispatch_strategy=pb.Reliable)
        )
        before = tree(tmp_path.parent)
        calls = []
        for topic in ("/../..", "/./..", "/../x", "/default/..", "/default/."):
            calls += [
                producers.CreateProducer(
                    pb.ProducerRequest(producer_name="p", topic_name=topic, dispatch_strategy=pb.Reliable)
                ),
                consumers.Subscribe(pb.ConsumerRequest(topic_name=topic, consumer_name="c", subscription="s")),
                discovery.TopicLookup(pb.TopicLookupRequest(topic=topic)),
                topics_admin.UnloadTopic(apb.TopicRequest(name=topic)),
                topics_admin.DescribeTopic(apb.DescribeTopicRequest(name=topic)),
            ]
        for name in ("..", ".", "a/b"):
            calls += [
                producers.CreateProducer(
                    pb.ProducerRequest(producer_name=name, topic_name="/default/ok", dispatch_strategy=pb.Reliable)
                ),
                consumers.Subscribe(pb.ConsumerRequest(topic_name="/default/ok", consumer_name="c", subscription=name)),
                consumers.Subscribe(pb.ConsumerRequest(topic_name="/default/ok", consumer_name=name, subscription="s")),
                namespaces_admin.GetNamespaceTopics(apb.NamespaceRequest(name=name)),
            ]
        for call in calls:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
            assert "invalid" in info.value.details()
        after = tree(tmp_path.parent)
        assert sorted(p for p in after - before if "metadata" not in p) == []
        assert {p for p in before if "wal" in p} <= after


async def test_a_huge_name_is_quoted_by_a_short_prefix(tmp_path):
    async with served_broker(tmp_path, add_all, sync="never") as (broker, channel):
        producers = pb_grpc.ProducerServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await producers.CreateProducer(
                pb.ProducerRequest(
                    producer_name="p" * 100_000, topic_name="/default/" + "t" * 100_000, dispatch_strategy=pb.Reliable
                )
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert len(info.value.details()) < 400 and "(100009 bytes)" in info.value.details()
        await asyncio.sleep(0)
