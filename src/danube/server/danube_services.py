"""Danube's client protocol (package ``danube``) over the broker: the slow, compatible lane.

Each unary ``SendMessage`` becomes one frame (``danube.message_codec.encode_record``)
handed to ``BrokerService.publish_one``, which stores the calls arriving together
on a topic as one batch; each delivered frame becomes one
``StreamMessage``.  Nothing else in the broker sees a per-message object.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from danube import message_codec
from danube.broker.service import BrokerService
from danube.broker.subscription import StreamSupersededError
from danube.errors import DanubeError, InvalidArgumentError, NotServedHereError, quote
from danube.proto.danube import DanubeApi_pb2 as pb
from danube.proto.danube import DanubeApi_pb2_grpc as pb_grpc
from danube.protowire import varint
from danube.schema.validation import SCHEMA_ATTR, schema_value, split_schema_attributes
from danube.server.h2grpc.wire import Encoded
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
_encode_record = message_codec.encode_record
_MessageResponse = pb.MessageResponse


class ProducerService(pb_grpc.ProducerServiceServicer):
    def __init__(self, broker: BrokerService) -> None:
        self.broker = broker
        self._publish_one = broker.publish_one
        self._schema = broker.schema_gate  # danube.schema.validation.SchemaGate

    async def CreateProducer(self, request, context):
        try:
            mode = _ACCESS_MODES.get(request.producer_access_mode)
            if mode is None:
                raise InvalidArgumentError(f"unknown producer access mode {request.producer_access_mode}")
            if self._schema is not None and request.HasField("schema_ref") and request.schema_ref.subject:
                await self._schema.on_create_producer(request.topic_name, request.schema_ref.subject)
            producer_id = await self.broker.create_producer(
                request.topic_name,
                request.producer_name,
                access_mode=mode,
                reliable=request.dispatch_strategy == pb.Reliable,
            )
        except DanubeError as exc:
            await abort(context, exc)
        return pb.ProducerResponse(
            request_id=request.request_id, producer_id=producer_id, producer_name=request.producer_name
        )

    async def SendMessage(self, request, context):
        # The per-message path of Danube's clients: module-level names, one attribute walk each.
        try:
            producer_id = request.msg_id.producer_id
            attributes = request.attributes or None
            if self._schema is not None and (self._schema.active or request.HasField("schema_id")):
                attributes = await _with_schema(self._schema, self.broker, producer_id, request, attributes)
            frame = _encode_record(
                request.payload,
                publish_time=request.publish_time,
                producer_id=producer_id,
                key=request.routing_key if request.HasField("routing_key") else None,
                attributes=attributes,
            )
            # Concurrent calls on one topic are stored as one batch (one append, one durability wait).
            await self._publish_one(producer_id, frame)
        except DanubeError as exc:
            await abort(context, exc)
        return _MessageResponse(request_id=request.request_id)


async def _with_schema(gate, broker, producer_id: int, request, attributes):
    """The topic's schema policy for one message; its attributes with the schema pair added."""
    schema_id = request.schema_id if request.HasField("schema_id") else None
    version = request.schema_version if request.HasField("schema_version") else None
    if gate.active:
        topic = broker.producer_topic(producer_id)
        if topic is None:  # a producer not loaded yet (broker restart): load it to learn its topic
            await broker.producer(producer_id)
            topic = broker.producer_topic(producer_id)
        if topic is not None:
            gate.check_message(topic, schema_id, version, request.payload)
    if schema_id is None:
        return attributes
    attributes = dict(attributes) if attributes else {}
    attributes[SCHEMA_ATTR] = schema_value(schema_id, version)
    return attributes


class ConsumerService(pb_grpc.ConsumerServiceServicer):
    def __init__(self, broker: BrokerService) -> None:
        self.broker = broker

    async def Subscribe(self, request, context):
        try:
            sub_type = _SUB_TYPES.get(request.subscription_type)
            if sub_type is None:
                raise InvalidArgumentError(f"unknown subscription type {request.subscription_type}")
            consumer_id = await self.broker.subscribe(
                request.topic_name,
                request.subscription,
                request.consumer_name,
                sub_type=sub_type,
                key_filters=list(request.key_filters),
                reliable=None,
            )
        except DanubeError as exc:
            await abort(context, exc)
        return pb.ConsumerResponse(
            request_id=request.request_id, consumer_id=consumer_id, consumer_name=request.consumer_name
        )

    async def ReceiveMessages(self, request, context):
        broker = self.broker
        consumer_id = request.consumer_id
        broker_url = broker.broker_url
        stream = None
        # On the native server a message is written as its fields plus the payload's own buffer
        # (the stored frame's bytes, shared by every stream delivering it), not as a copy per stream.
        encoded = getattr(context, "sends_encoded", False)
        # (queued for this turn's socket write when the stream can take it now: no await per message)
        write_nowait = getattr(context, "write_nowait", None)
        try:
            try:
                stream = await broker.open_stream(consumer_id)
                while True:
                    delivery = await broker.receive(
                        consumer_id, max_messages=STREAM_BATCH_MESSAGES, max_bytes=STREAM_BATCH_BYTES, stream=stream
                    )
                    topic, subscription = broker.consumer_info(consumer_id) or ("", "")
                    for rec in _decodable_records(broker, consumer_id, delivery.frames):
                        try:
                            if encoded:
                                msg = _encoded_stream_message(broker, rec, topic, subscription, broker_url)
                            else:
                                msg = _stream_message(broker, rec, topic, subscription, broker_url)
                        except _CONVERSION_ERRORS as exc:
                            broker.reject_delivery(
                                consumer_id,
                                rec.offset,
                                f"it cannot become a StreamMessage: {type(exc).__name__}: {quote(str(exc))}",
                            )
                            continue
                        if write_nowait is None or not write_nowait(msg):
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

    async def Ack(self, request, context, *, strict: bool = False):
        try:
            await self.broker.ack_subscription(
                request.msg_id.topic_name, request.subscription_name, (request.msg_id.topic_offset,), strict=strict
            )
        except DanubeError as exc:
            await abort(context, exc)
        return pb.AckResponse(request_id=request.request_id)

    async def Nack(self, request, context, *, strict: bool = False):
        try:
            await self.broker.nack_subscription(
                request.msg_id.topic_name,
                request.subscription_name,
                request.msg_id.topic_offset,
                delay_ms=request.delay_ms if request.HasField("delay_ms") else None,
                reason=request.reason if request.HasField("reason") else None,
                strict=strict,
            )
        except DanubeError as exc:
            await abort(context, exc)
        return pb.NackResponse(request_id=request.request_id)


# What converting one stored record for Danube's protocol may raise (a UnicodeDecodeError is a
# ValueError); such a record goes to the failure policy instead of failing the stream forever.
_CONVERSION_ERRORS = (ValueError, TypeError, OverflowError, DanubeError)


def _decodable_records(broker: BrokerService, consumer_id: int, buf) -> list:
    """The records of a delivery; one that cannot be decoded goes to its subscription's failure
    policy (logged with its offset) and the others are delivered.  The whole batch is decoded in
    one codec call unless it holds such a record."""
    try:
        return message_codec.decode_batch(buf)
    except _CONVERSION_ERRORS:
        pass
    view = memoryview(buf).cast("B")
    positions = message_codec.frame_positions(view)
    records = []
    for i, pos in enumerate(positions):
        end = positions[i + 1] if i + 1 < len(positions) else len(view)
        try:
            records.append(message_codec.decode_frame(view[pos:end], 0)[0])
        except _CONVERSION_ERRORS as exc:
            offset = int.from_bytes(view[pos : pos + 8], "little")
            broker.reject_delivery(consumer_id, offset, f"it cannot be decoded: {type(exc).__name__}: {exc}")
    return records


# StreamMessage.payload: field 3, length-delimited.
_PAYLOAD_TAG = b"\x1a"


def _encoded_stream_message(broker: BrokerService, rec, topic: str, subscription: str, broker_url: str) -> Encoded:
    """``_stream_message`` serialized without copying the payload: the other fields, then the
    payload field as its tag and length in front of the record's own buffer (protobuf fields may
    come in any order)."""
    payload = rec.payload
    head = _stream_message(broker, rec, topic, subscription, broker_url, payload=b"").SerializeToString()
    return Encoded((head + _PAYLOAD_TAG + varint(len(payload)), payload))


def _stream_message(broker: BrokerService, rec, topic: str, subscription: str, broker_url: str, *, payload=None):
    """Danube's StreamMessage for one stored record (``payload`` instead of the record's own)."""
    attributes, schema_id, schema_version = rec.attributes, None, None
    if attributes and SCHEMA_ATTR in attributes:
        attributes, schema_id, schema_version = split_schema_attributes(attributes)
    msg = pb.StreamMessage(
        request_id=rec.offset,
        msg_id=pb.MsgID(producer_id=rec.producer_id, topic_name=topic, broker_addr=broker_url, topic_offset=rec.offset),
        payload=bytes(rec.payload) if payload is None else payload,
        publish_time=rec.publish_time,
        producer_name=broker.producer_name(topic, rec.producer_id),
        subscription_name=subscription,
        attributes=attributes,
    )
    if schema_id is not None:
        msg.schema_id = schema_id
        if schema_version is not None:
            msg.schema_version = schema_version
    if rec.routing_key is not None:
        msg.routing_key = rec.routing_key
    return msg


class DiscoveryService(pb_grpc.DiscoveryServicer):
    def __init__(self, broker: BrokerService) -> None:
        self.broker = broker

    async def TopicLookup(self, request, context):
        try:
            result = await self.broker.lookup(request.topic)
        except DanubeError as exc:
            await abort(context, exc)
        kind = {"connect": pb.TopicLookupResponse.Connect, "redirect": pb.TopicLookupResponse.Redirect}.get(
            result.kind, pb.TopicLookupResponse.Failed
        )
        return pb.TopicLookupResponse(
            request_id=request.request_id,
            response_type=kind,
            connect_url=result.connect_url,
            broker_url=result.broker_url,
            proxy=result.proxy,
        )

    async def TopicPartitions(self, request, context):
        try:
            partitions = await self.broker.partitions(request.topic)
        except DanubeError as exc:
            await abort(context, exc)
        return pb.TopicPartitionsResponse(request_id=request.request_id, partitions=partitions)


# Answers are serialized as they are returned and never changed: a thousand producers polling every
# few seconds need no new message per call.
_HEALTH_OK = pb.HealthCheckResponse(status=pb.HealthCheckResponse.OK)
_HEALTH_CLOSE = pb.HealthCheckResponse(status=pb.HealthCheckResponse.CLOSE)


class HealthCheckService(pb_grpc.HealthCheckServicer):
    def __init__(self, broker: BrokerService) -> None:
        self.broker = broker

    async def HealthCheck(self, request, context):
        kind = "producer" if request.client == pb.HealthCheckRequest.Producer else "consumer"
        return _HEALTH_OK if self.broker.health(kind, request.id) else _HEALTH_CLOSE


def add_to_server(server: grpc.aio.Server, broker: BrokerService) -> None:
    proxy = broker.cluster.client_proxy if broker.cluster is not None else None
    if proxy is not None:  # cluster mode: Danube's proxy mode (docs/cluster.md, "Faults")
        from danube.server import proxy_services

        return proxy_services.add_to_server(server, broker, proxy)
    pb_grpc.add_ProducerServiceServicer_to_server(ProducerService(broker), server)
    pb_grpc.add_ConsumerServiceServicer_to_server(ConsumerService(broker), server)
    pb_grpc.add_DiscoveryServicer_to_server(DiscoveryService(broker), server)
    pb_grpc.add_HealthCheckServicer_to_server(HealthCheckService(broker), server)
