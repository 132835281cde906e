"""Danube's client protocol (package ``danube``) over the broker: the slow, compatible lane.

Each unary ``SendMessage`` becomes one frame (``danube.frames.encode_record``)
handed to ``BrokerService.publish_message``, which stores the calls arriving together
on a topic as one batch; each delivered frame becomes one
``StreamMessage``.  Nothing else in the broker sees a per-message object.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from danube import frames
from danube.broker.service import BrokerService
from danube.broker.subscription import StreamSupersededError
from danube.errors import DanubeError, InvalidArgumentError, NotServedHereError
from danube.proto.danube import DanubeApi_pb2 as pb
from danube.proto.danube import DanubeApi_pb2_grpc as pb_grpc
from danube.server.status import abort

log = logging.getLogger(__name__)

_ACCESS_MODES = {pb.Shared: "shared", pb.Exclusive: "exclusive"}
_SUB_TYPES = {
    pb.ConsumerRequest.Exclusive: "exclusive",
    pb.ConsumerRequest.Shared: "shared",
    pb.ConsumerRequest.Failover: "failover",
    pb.ConsumerRequest.KeyShared: "key_shared",
}
# Messages per broker receive on a StreamMessage stream: enough to amortise the
# pull, few enough that shared consumers take turns.
STREAM_BATCH_MESSAGES = 64
STREAM_BATCH_BYTES = 4 * 1024 * 1024
_CLOSED_BACKOFF_S = 1.0
_encode_record = frames.encode_record
_MessageResponse = pb.MessageResponse


class ProducerService(pb_grpc.ProducerServiceServicer):
    def __init__(self, broker: BrokerService) -> None:
        self.broker = broker
        self._publish_message = broker.publish_message

    async def CreateProducer(self, request, context):
        try:
            mode = _ACCESS_MODES.get(request.producer_access_mode)
            if mode is None:
                raise InvalidArgumentError(f"unknown producer access mode {request.producer_access_mode}")
            producer_id = await self.broker.create_producer(
                request.topic_name, request.producer_name, access_mode=mode,
                reliable=request.dispatch_strategy == pb.Reliable)
        except DanubeError as exc:
            await abort(context, exc)
        return pb.ProducerResponse(request_id=request.request_id, producer_id=producer_id,
                                   producer_name=request.producer_name)

    async def SendMessage(self, request, context):
        # The per-message path of Danube's clients: module-level names, one attribute walk each.
        try:
            producer_id = request.msg_id.producer_id
            frame = _encode_record(
                request.payload, publish_time=request.publish_time, producer_id=producer_id,
                key=request.routing_key if request.HasField("routing_key") else None,
                attributes=request.attributes or None)
            # Concurrent calls on one topic are stored as one batch (one append, one durability wait).
            await self._publish_message(producer_id, frame)
        except DanubeError as exc:
            await abort(context, exc)
        return _MessageResponse(request_id=request.request_id)


class ConsumerService(pb_grpc.ConsumerServiceServicer):
    def __init__(self, broker: BrokerService) -> None:
        self.broker = broker

    async def Subscribe(self, request, context):
        try:
            sub_type = _SUB_TYPES.get(request.subscription_type)
            if sub_type is None:
                raise InvalidArgumentError(f"unknown subscription type {request.subscription_type}")
            consumer_id = await self.broker.subscribe(
                request.topic_name, request.subscription, request.consumer_name, sub_type=sub_type,
                key_filters=list(request.key_filters), reliable=None)
        except DanubeError as exc:
            await abort(context, exc)
        return pb.ConsumerResponse(request_id=request.request_id, consumer_id=consumer_id,
                                   consumer_name=request.consumer_name)

    async def ReceiveMessages(self, request, context):
        broker = self.broker
        consumer_id = request.consumer_id
        broker_url = broker.broker_url
        stream = None
        try:
            try:
                stream = await broker.open_stream(consumer_id)
                while True:
                    delivery = await broker.receive(consumer_id, max_messages=STREAM_BATCH_MESSAGES,
                                                    max_bytes=STREAM_BATCH_BYTES, stream=stream)
                    topic, subscription = broker.consumer_info(consumer_id) or ("", "")
                    for rec in frames.iter_records(delivery.frames):
                        msg = pb.StreamMessage(
                            request_id=rec.offset,
                            msg_id=pb.MsgID(producer_id=rec.producer_id, topic_name=topic,
                                            broker_addr=broker_url, topic_offset=rec.offset),
                            payload=bytes(rec.payload),
                            publish_time=rec.publish_time,
                            producer_name=broker.producer_name(topic, rec.producer_id),
                            subscription_name=subscription,
                            attributes=rec.attributes,
                        )
                        if rec.routing_key is not None:
                            msg.routing_key = rec.routing_key
                        await context.write(msg)
            except StreamSupersededError:
                return  # the client opened a newer stream for this consumer
            except NotServedHereError as exc:
                # The client reopens the stream at once; give its health check time to see CLOSE.
                await asyncio.sleep(_CLOSED_BACKOFF_S)
                await abort(context, exc)
            except DanubeError as exc:
                await abort(context, exc)
        finally:
            if stream is not None:
                broker.detach(consumer_id, stream)

    async def Ack(self, request, context):
        try:
            await self.broker.ack_subscription(request.msg_id.topic_name, request.subscription_name,
                                               (request.msg_id.topic_offset,))
        except DanubeError as exc:
            await abort(context, exc)
        return pb.AckResponse(request_id=request.request_id)

    async def Nack(self, request, context):
        try:
            await self.broker.nack_subscription(
                request.msg_id.topic_name, request.subscription_name, request.msg_id.topic_offset,
                delay_ms=request.delay_ms if request.HasField("delay_ms") else None,
                reason=request.reason if request.HasField("reason") else None)
        except DanubeError as exc:
            await abort(context, exc)
        return pb.NackResponse(request_id=request.request_id)


class DiscoveryService(pb_grpc.DiscoveryServicer):
    def __init__(self, broker: BrokerService) -> None:
        self.broker = broker

    async def TopicLookup(self, request, context):
        try:
            result = await self.broker.lookup(request.topic)
        except DanubeError as exc:
            await abort(context, exc)
        kind = {"connect": pb.TopicLookupResponse.Connect, "redirect": pb.TopicLookupResponse.Redirect}.get(
            result.kind, pb.TopicLookupResponse.Failed)
        return pb.TopicLookupResponse(request_id=request.request_id, response_type=kind,
                                      connect_url=result.connect_url, broker_url=result.broker_url,
                                      proxy=result.proxy)

    async def TopicPartitions(self, request, context):
        try:
            partitions = await self.broker.partitions(request.topic)
        except DanubeError as exc:
            await abort(context, exc)
        return pb.TopicPartitionsResponse(request_id=request.request_id, partitions=partitions)


class HealthCheckService(pb_grpc.HealthCheckServicer):
    def __init__(self, broker: BrokerService) -> None:
        self.broker = broker

    async def HealthCheck(self, request, context):
        kind = "producer" if request.client == pb.HealthCheckRequest.Producer else "consumer"
        ok = self.broker.health(kind, request.id)
        return pb.HealthCheckResponse(
            status=pb.HealthCheckResponse.OK if ok else pb.HealthCheckResponse.CLOSE)


def add_to_server(server: grpc.aio.Server, broker: BrokerService) -> None:
    pb_grpc.add_ProducerServiceServicer_to_server(ProducerService(broker), server)
    pb_grpc.add_ConsumerServiceServicer_to_server(ConsumerService(broker), server)
    pb_grpc.add_DiscoveryServicer_to_server(DiscoveryService(broker), server)
    pb_grpc.add_HealthCheckServicer_to_server(HealthCheckService(broker), server)
