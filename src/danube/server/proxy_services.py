"""Danube's producer, consumer and health-check services with proxy mode (cluster mode): a call
naming another broker in ``x-danube-broker-url`` is forwarded to its topic's current owner by
:class:`danube.cluster.client_proxy.ClientProxy`; every other call is served here as before.

A ``SendMessage`` for a topic this broker does not serve (any more) while the cluster names another
owner, or none yet, is forwarded too: a client connected here directly when the topic was served
here keeps sending here after it moves (Danube's client looks up again only after five failed
retries), and this broker, alive, can carry its sends to the new owner at once.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import grpc

from danube.cluster.client_proxy import ClientProxy, ProxyError, is_held_ack, proxied_to
from danube.cluster.peers import caller_authorization
from danube.proto.danube import DanubeApi_pb2 as pb
from danube.proto.danube import DanubeApi_pb2_grpc as pb_grpc
from danube.server import danube_services as ds
from danube.server.status import cap_message

if TYPE_CHECKING:
    from danube.broker.service import BrokerService


async def _abort(context, exc: ProxyError):
    await context.abort(exc.code, cap_message(exc.details))


class ProxyingProducerService(ds.ProducerService):
    def __init__(self, broker: BrokerService, proxy: ClientProxy) -> None:
        super().__init__(broker)
        self.proxy = proxy
        self._own_url = proxy.own_url
        self._topics = broker.topics
        self._view = proxy.view
        self._me = proxy.node.broker_id

    async def CreateProducer(self, request, context):
        if proxied_to(context, self._own_url) is None:
            return await super().CreateProducer(request, context)
        try:
            return await self.proxy.create_producer(request, caller_authorization(context))
        except ProxyError as exc:
            await _abort(context, exc)

    async def SendMessage(self, request, context):
        topic = request.msg_id.topic_name
        served = self._topics.get(topic)
        if (served is not None and not served.closed) or self._view.owner(topic) == self._me:
            if proxied_to(context, self._own_url) is None:
                return await super().SendMessage(request, context)
        elif not topic:
            return await super().SendMessage(request, context)
        try:
            return await self.proxy.send(request, caller_authorization(context))
        except ProxyError as exc:
            await _abort(context, exc)


class ProxyingConsumerService(ds.ConsumerService):
    def __init__(self, broker: BrokerService, proxy: ClientProxy) -> None:
        super().__init__(broker)
        self.proxy = proxy
        self._own_url = proxy.own_url
        self._topics = broker.topics

    async def Subscribe(self, request, context):
        if proxied_to(context, self._own_url) is None:
            return await super().Subscribe(request, context)
        try:
            return await self.proxy.subscribe(request, caller_authorization(context))
        except ProxyError as exc:
            await _abort(context, exc)

    async def ReceiveMessages(self, request, context):
        if proxied_to(context, self._own_url) is None:
            return await super().ReceiveMessages(request, context)
        if not self.proxy.knows_consumer(request.consumer_id):
            # not subscribed through this broker (it restarted): the client subscribes again once its
            # health check says CLOSE; it reopens a failed stream at once, so do not answer at once
            await asyncio.sleep(1.0)
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"consumer {request.consumer_id} is not known here: subscribe again"
            )
        try:
            await self.proxy.receive(request, context, caller_authorization(context))
        except ProxyError as exc:
            await _abort(context, exc)

    # ``strict`` is the base class's: whether this broker must apply the ack or refuse it; here it
    # follows from the call (a held ack forwarded by a proxy is strict), so the keyword is ignored.
    async def Ack(self, request, context, *, strict: bool = False):
        return await self._ack(request, context, "Ack")

    async def Nack(self, request, context, *, strict: bool = False):
        return await self._ack(request, context, "Nack")

    async def _ack(self, request, context, method: str):
        """An ack is answered OK only once it was applied where the subscription's cursor lives.
        A broker's proxy holds its forwarded acks (HELD_ACK_HEADER) and sends them again when this
        broker cannot apply one (UNAVAILABLE); a client's ack for a topic that left this broker is
        held here the same way and carried to the topic's new owner."""
        if proxied_to(context, self._own_url) is None:
            topic = self._topics.get(request.msg_id.topic_name)
            held = is_held_ack(context)
            if held or (topic is not None and not topic.closed) or not request.msg_id.topic_name:
                serve = super().Ack if method == "Ack" else super().Nack
                return await serve(request, context, strict=held)
        try:
            return await self.proxy.ack(request, caller_authorization(context), method)
        except ProxyError as exc:
            await _abort(context, exc)


class ProxyingHealthCheckService(ds.HealthCheckService):
    def __init__(self, broker: BrokerService, proxy: ClientProxy) -> None:
        super().__init__(broker)
        self.proxy = proxy

    async def HealthCheck(self, request, context):
        if proxied_to(context, self.proxy.own_url) is None:
            return await super().HealthCheck(request, context)
        kind = "producer" if request.client == pb.HealthCheckRequest.Producer else "consumer"
        ok = self.proxy.health(kind, request.id)
        return pb.HealthCheckResponse(status=pb.HealthCheckResponse.OK if ok else pb.HealthCheckResponse.CLOSE)


def add_to_server(server: grpc.aio.Server, broker: BrokerService, proxy: ClientProxy) -> None:
    pb_grpc.add_ProducerServiceServicer_to_server(ProxyingProducerService(broker, proxy), server)
    pb_grpc.add_ConsumerServiceServicer_to_server(ProxyingConsumerService(broker, proxy), server)
    pb_grpc.add_DiscoveryServicer_to_server(ds.DiscoveryService(broker), server)
    pb_grpc.add_HealthCheckServicer_to_server(ProxyingHealthCheckService(broker, proxy), server)
