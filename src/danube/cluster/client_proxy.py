"""Danube's proxy mode on every broker: a client's calls for a topic owned elsewhere go through the
broker the client looked the topic up at, which forwards them to the topic's current owner.

Why: Danube's clients (``danube-client`` 0.5.0) send every call to the ``connect_url`` of their last
lookup and look a topic up again only *at that URL*, after five retries of a failed send (1.5-3 s of
backoff).  With ``connect_url`` naming the owner, a ``kill -9`` or a graceful stop of the owner leaves
the client with no live address at all, and every move costs a producer its retry budget.  So a
lookup answered here for a topic another broker owns says ``Redirect`` with ``broker_url`` = the
owner, ``connect_url`` = this broker and ``proxy`` = true; the client then sends its calls here with
the owner in the ``x-danube-broker-url`` header (what Danube's ingress proxies route on), and this
broker forwards each to the topic's *current* owner:

* a call that fails because the owner went away (it unloaded or moved the topic, it stopped, it was
  killed, it is fenced) is held, not answered: the broker waits until its cluster view names a new
  owner (placement after an unload, or reassignment once the dead owner's lease expired), creates
  the producer or subscription again there (ids are the cluster's, kept in the metadata store, so
  they do not change) and sends the call there.  The client sees one slow call and no error;
* a consumer's message stream stays open across moves: the upstream stream is re-opened at the new
  owner, which delivers again what was not acked (at-least-once, as after any reconnect);
* an ack is answered OK only once the owner applied it: one the owner cannot apply (the topic is
  sealing for a move, the subscription is not open on the new owner yet) is held and sent again,
  to the new owner once there is one, where an ack of a message it has not delivered yet is kept
  and the message skipped (``Subscription.early_acks``).

Fencing is unchanged: forwarding never writes anything itself, the owner's own checks (lease fence,
owner epoch, sealing) decide what is stored.  A call is held at most ``hold_s``; after that the last
error is returned (the client's own retries take over).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from typing import Any

import grpc

from danube import movetrace
from danube.cluster import peers
from danube.metadata import keys
from danube.proto.danube import DanubeApi_pb2 as pb
from danube.proto.danube import DanubeApi_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

PROXY_HEADER = "x-danube-broker-url"
# Failures after which a call is tried again at the topic's (new) owner: the owner is gone, closed the
# topic or does not know the producer/consumer (a new owner); nothing was stored by such a call except
# when the connection broke mid-call (the owner may have stored the message: at-least-once).
_RETRY = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.NOT_FOUND,
    }
)
_RETRY_CREATE = _RETRY - {grpc.StatusCode.NOT_FOUND}  # NOT_FOUND on create: the topic does not exist
# How long a failed forward waits for the cluster view to name another owner before trying again
# (a retry of a dead owner is a refused connection: cheap).
_CHANGE_WAIT_S = 0.5
_MAX_CHANNELS = 64
# How often a held ack is tried again while its owner cannot apply it and the view names no other.
_ACK_RETRY_S = 0.02
# Sent with every ack / nack a proxy forwards: the owner answers one it cannot apply with
# UNAVAILABLE (the proxy sends it again) instead of OK.
HELD_ACK_HEADER = "x-danube-held-ack"
_HELD_ACK_METADATA = ((HELD_ACK_HEADER, "1"),)
# A forwarded call slower than this starts watching the cluster view for a new owner of its topic.
_SLOW_CALL_S = 0.25


class _Moved(Exception):
    """The topic got a new owner while a forwarded call to the old one was unanswered."""


class ProxyError(Exception):
    """A forwarded call's final failure, with the status to answer the client."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


def proxied_to(context: Any, own_url: str) -> str | None:
    """The broker a call names in ``x-danube-broker-url`` when that is not this broker."""
    for key, value in context.invocation_metadata() or ():
        if key == PROXY_HEADER:
            url = value.decode() if isinstance(value, bytes) else value
            return url if url and url != own_url else None
    return None


def is_held_ack(context: Any) -> bool:
    """The ack / nack was forwarded by a broker's proxy, which holds it until it is applied."""
    return any(key == HELD_ACK_HEADER for key, _ in context.invocation_metadata() or ())


class ClientProxy:
    """Forwards Danube's producer / consumer calls to the owner of their topic (see the module)."""

    def __init__(self, node: Any, *, hold_s: float, attempt_timeout_s: float) -> None:
        self.node = node
        self.view = node.view
        self.own_url = node.broker_url
        self.hold_s = hold_s
        self.attempt_timeout_s = attempt_timeout_s
        self._channels: OrderedDict[tuple[str, str | None], grpc.aio.Channel] = OrderedDict()
        self._producers: dict[int, pb.ProducerRequest] = {}
        self._consumers: dict[int, pb.ConsumerRequest] = {}
        self._streams: dict[int, int] = {}  # consumer id -> generation of its newest downstream stream
        self.held_calls = 0  # forwarded calls that had to wait for a new owner
        self.held_acks = 0  # forwarded acks/nacks the owner could not apply at once

    # ------------------------------------------------------------ owners and channels

    def _channel(self, url: str, caller: str | None) -> grpc.aio.Channel:
        key = (url, caller)
        channel = self._channels.get(key)
        if channel is None:
            channel = self._channels[key] = peers.for_broker(self.node.broker).channel(url, caller=caller)
            while len(self._channels) > _MAX_CHANNELS:
                _, old = self._channels.popitem(last=False)
                asyncio.get_running_loop().create_task(old.close(grace=5))
        else:
            self._channels.move_to_end(key)
        return channel

    async def _owner_url(self, topic: str, deadline: float) -> str:
        """The URL of the broker the view names as ``topic``'s owner; a topic with none is placed
        (the node's lookup) and waited for until ``deadline``."""
        while True:
            owner = self.view.owner(topic)
            if owner is not None:
                url = self.own_url if owner == self.node.broker_id else self.view.broker_url(owner)
                if url:
                    return url
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ProxyError(
                    grpc.StatusCode.UNAVAILABLE,
                    f"topic {topic} has no live owner yet (broker {self.node.broker_id} waited "
                    f"{self.hold_s:.0f} s); look it up again",
                )
            if owner is None:
                try:
                    result = await asyncio.wait_for(self.node.lookup(topic), remaining)
                except (TimeoutError, asyncio.TimeoutError):
                    continue
                if result.kind != "failed" and self.view.owner(topic) is not None:
                    continue
            await self._view_change(min(_CHANGE_WAIT_S, remaining))

    async def _view_change(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(self.view.changed(), timeout)
        except (TimeoutError, asyncio.TimeoutError):
            pass

    async def _after_failure(
        self, topic: str, failed_url: str, exc: grpc.aio.AioRpcError, deadline: float, what: str
    ) -> None:
        """A forward to ``failed_url`` failed with a retriable status: wait for the view to name another
        owner (briefly: the failure may have been transient), or raise the final error."""
        if time.monotonic() >= deadline:
            raise ProxyError(exc.code(), exc.details() or exc.code().name)
        self.held_calls += 1
        if exc.code() == grpc.StatusCode.NOT_FOUND:
            return  # the owner is up and does not know the producer/consumer yet: create it there now
        log.debug(
            "%s of %s at %s failed (%s: %s); waiting for its owner",
            what,
            topic,
            failed_url,
            exc.code().name,
            exc.details(),
        )
        end = min(deadline, time.monotonic() + _CHANGE_WAIT_S)
        while time.monotonic() < end:
            owner = self.view.owner(topic)
            url = (
                None
                if owner is None
                else (self.own_url if owner == self.node.broker_id else self.view.broker_url(owner))
            )
            if url != failed_url:
                return
            await self._view_change(end - time.monotonic())

    # ------------------------------------------------------------ producers

    async def create_producer(self, request: pb.ProducerRequest, caller: str | None) -> pb.ProducerResponse:
        response = await self._create(request.topic_name, request, caller, "CreateProducer")
        self._producers[response.producer_id] = request
        return response

    async def _create(self, topic: str, request, caller: str | None, method: str):
        deadline = time.monotonic() + self.hold_s
        while True:
            url = await self._owner_url(topic, deadline)
            stub = _stub(method, self._channel(url, caller))
            try:
                return await getattr(stub, method)(request, timeout=self.attempt_timeout_s)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in _RETRY_CREATE:
                    raise ProxyError(exc.code(), exc.details() or exc.code().name) from None
                await self._after_failure(topic, url, exc, deadline, method)

    async def send(self, request: pb.StreamMessage, caller: str | None) -> pb.MessageResponse:
        topic = request.msg_id.topic_name
        deadline = time.monotonic() + self.hold_s
        known = self._producers.get(request.msg_id.producer_id)
        # a producer not created through this broker for this very topic is created at the owner first,
        # which proves the id belongs to the topic the message names (what the caller was checked for)
        recreate = known is None or known.topic_name != topic
        if known is not None and known.topic_name != topic:
            self._producers.pop(request.msg_id.producer_id, None)
        held = False
        created_at: set[str] = set()  # owners this call created the producer at
        while True:
            url = await self._owner_url(topic, deadline)
            if held:
                movetrace.step(topic, "proxy.owner_known")
            stub = pb_grpc.ProducerServiceStub(self._channel(url, caller))
            try:
                if recreate:
                    created_at.add(url)
                    create = self._producers.get(request.msg_id.producer_id) or await self._create_for(request)
                    created = await stub.CreateProducer(create, timeout=self.attempt_timeout_s)
                    if held:
                        movetrace.step(topic, "proxy.created")
                    if created.producer_id != request.msg_id.producer_id:
                        # the topic was deleted and created again: the client's producer is gone
                        raise ProxyError(
                            grpc.StatusCode.NOT_FOUND,
                            f"producer {request.msg_id.producer_id} of {topic} no longer exists",
                        )
                    self._producers[request.msg_id.producer_id] = create
                    recreate = False
                answer = await self._unless_moved(stub.SendMessage(request, timeout=self.attempt_timeout_s), topic, url)
                if held:
                    movetrace.step(topic, "proxy.sent")
                return answer
            except _Moved:
                recreate = True
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in _RETRY:
                    raise ProxyError(exc.code(), exc.details() or exc.code().name) from None
                if not held:
                    movetrace.step(topic, "proxy.send_failed")
                held = True
                recreate = True
                if url not in created_at and self._url_of(topic) == url:
                    # refused by the broker the view names as the owner, where this call has not
                    # created the producer: a new owner that does not know it yet (or is still
                    # opening the topic).  Create it there now: its open is waited for, where
                    # waiting for the view to name yet another owner would only time out.
                    self.held_calls += 1
                    continue
                await self._after_failure(topic, url, exc, deadline, "SendMessage")

    async def _unless_moved(self, call, topic: str, url: str):
        """``call``'s answer, unless the view names another owner first (a stopped or partitioned
        owner never answers; once its topic was reassigned it cannot ack any more, so the call is
        abandoned and sent to the new owner: at-least-once, like any retry).  The view is watched
        only for a call slower than _SLOW_CALL_S: a timer, no task, on the fast path."""
        moved = False
        watcher: list[asyncio.Task] = []

        async def watch() -> None:
            nonlocal moved
            while self._url_of(topic) == url:
                await self.view.changed()
            moved = True
            self.held_calls += 1
            log.debug("%s: %s did not answer and is no longer the owner; sending to the new one", topic, url)
            call.cancel()

        timer = asyncio.get_running_loop().call_later(
            _SLOW_CALL_S, lambda: watcher.append(asyncio.ensure_future(watch()))
        )
        try:
            return await call
        except asyncio.CancelledError:
            if moved:
                raise _Moved from None
            raise
        finally:
            timer.cancel()
            for task in watcher:
                task.cancel()

    def _url_of(self, topic: str) -> str | None:
        owner = self.view.owner(topic)
        if owner is None:
            return None
        return self.own_url if owner == self.node.broker_id else self.view.broker_url(owner)

    async def _create_for(self, request: pb.StreamMessage) -> pb.ProducerRequest:
        """The CreateProducer of a producer this broker never proxied (it was served here before its
        topic moved away), from the SendMessage and the topic's stored delivery mode."""
        topic = request.msg_id.topic_name
        delivery = await self.node.store.get_json(keys.topic_delivery(topic)) or {}
        reliable = delivery.get("dispatch_strategy") == "reliable"
        create = pb.ProducerRequest(
            request_id=request.request_id,
            producer_name=request.producer_name,
            topic_name=topic,
            producer_access_mode=pb.Shared,
            dispatch_strategy=pb.Reliable if reliable else pb.NonReliable,
        )
        return create

    # ------------------------------------------------------------ consumers

    async def subscribe(self, request: pb.ConsumerRequest, caller: str | None) -> pb.ConsumerResponse:
        response = await self._create(request.topic_name, request, caller, "Subscribe")
        self._consumers[response.consumer_id] = request
        return response

    def knows_consumer(self, consumer_id: int) -> bool:
        return consumer_id in self._consumers

    def consumer_topic(self, consumer_id: int) -> str | None:
        request = self._consumers.get(consumer_id)
        return request.topic_name if request is not None else None

    async def receive(self, request: pb.ReceiveRequest, context: Any, caller: str | None) -> None:
        """Pipe the owner's StreamMessage stream of the consumer to ``context`` until the client goes;
        the upstream is re-opened (after subscribing again) at each new owner."""
        consumer_id = request.consumer_id
        subscribe = self._consumers[consumer_id]
        topic = subscribe.topic_name
        generation = self._streams[consumer_id] = self._streams.get(consumer_id, 0) + 1
        resubscribe = False
        deadline = time.monotonic() + self.hold_s
        while self._streams.get(consumer_id) == generation:
            url = await self._owner_url(topic, deadline)
            channel = self._channel(url, caller)
            call = None
            moved: list[bool] = []
            watcher = None
            try:
                if resubscribe:
                    await pb_grpc.ConsumerServiceStub(channel).Subscribe(subscribe, timeout=self.attempt_timeout_s)
                    movetrace.step(topic, "proxy.resubscribed")
                call = pb_grpc.ConsumerServiceStub(channel).ReceiveMessages(request)
                # an owner that gives the topic up ends its streams only after a pause meant for
                # Danube's clients: follow the view instead, and re-open at the next owner at once
                watcher = asyncio.ensure_future(self._cancel_when_moved(topic, url, call, moved))
                async for message in call:
                    deadline = time.monotonic() + self.hold_s  # healthy again: a fresh budget
                    await context.write(message)
                failure = None  # the owner ended the stream (its topic closed, or superseded)
            except asyncio.CancelledError:
                if not moved:
                    raise
                failure = None
            except grpc.aio.AioRpcError as exc:
                if moved:
                    failure = None
                elif exc.code() not in _RETRY:
                    raise ProxyError(exc.code(), exc.details() or exc.code().name) from None
                else:
                    failure = exc
            finally:
                if watcher is not None:
                    watcher.cancel()
                if call is not None:
                    call.cancel()
            if self._streams.get(consumer_id) != generation:
                return
            movetrace.step(topic, "proxy.stream_ended")
            resubscribe = True
            if failure is not None:
                await self._after_failure(topic, url, failure, deadline, "ReceiveMessages")
            elif self._url_of(topic) == url:  # (the view may already name the next owner)
                await self._view_change(_CHANGE_WAIT_S)

    async def _cancel_when_moved(self, topic: str, url: str, call, moved: list[bool]) -> None:
        while self._url_of(topic) == url:
            await self.view.changed()
        moved.append(True)
        call.cancel()

    async def ack(self, request, caller: str | None, method: str):
        """Forward an Ack / Nack to the topic's owner and answer what the owner answered: OK only
        once it was applied there.  The forwarded call says it is held (HELD_ACK_HEADER), so an
        owner that cannot apply it (its topic is sealing, or the subscription is not open there
        yet) refuses it instead of answering OK; it is then sent again, to the new owner once the
        view names one, until ``hold_s`` (then UNAVAILABLE: the client sends it again)."""
        topic = request.msg_id.topic_name
        deadline = time.monotonic() + self.hold_s
        held = False
        while True:
            url = await self._owner_url(topic, deadline)
            stub = pb_grpc.ConsumerServiceStub(self._channel(url, caller))
            try:
                answer = await getattr(stub, method)(
                    request, metadata=_HELD_ACK_METADATA, timeout=self.attempt_timeout_s
                )
                if held:
                    movetrace.step(topic, "proxy.ack_applied")
                return answer
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in _RETRY:
                    raise ProxyError(exc.code(), exc.details() or exc.code().name) from None
                if time.monotonic() >= deadline:
                    raise ProxyError(exc.code(), exc.details() or exc.code().name) from None
                if not held:
                    self.held_acks += 1
                    held = True
                # the owner is sealing the topic or does not serve the subscription yet (the
                # consumer's stream re-subscribes there at once): look again shortly, or as soon
                # as the view names another owner
                await self._view_change(_ACK_RETRY_S)

    def health(self, client_type: str, client_id: int) -> bool:
        """A proxied producer or consumer is alive while this broker forwards for it."""
        return client_id in (self._producers if client_type == "producer" else self._consumers)

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), OrderedDict()
        for channel in channels:
            await channel.close(grace=1)


def _stub(method: str, channel: grpc.aio.Channel):
    if method == "CreateProducer":
        return pb_grpc.ProducerServiceStub(channel)
    return pb_grpc.ConsumerServiceStub(channel)


__all__ = ["HELD_ACK_HEADER", "PROXY_HEADER", "ClientProxy", "ProxyError", "is_held_ack", "proxied_to"]
