"""The authorization hook both gRPC servers call on every call.

``CallGuard.wrap(method, handler)`` returns the handler with a check in front of it:

1. **who** — :meth:`CallGuard.principal` takes the call's metadata and peer certificate:
   ``authorization: Bearer <jwt>`` verified by :class:`~danube.security.jwt.TokenVerifier`
   (its subject is the principal), else, on an mTLS port, the verified client certificate's
   common name; neither → ``UNAUTHENTICATED`` saying what is missing or wrong.
2. **what** — :data:`RULES` names, per method, the permission and how to find the resource in
   the request (a topic, a namespace, the cluster); ids (producer, consumer) are resolved to
   their topic through the broker.  A method with no rule needs ``admin`` on the cluster
   (default-deny).  Streaming requests (the batch lane's ``Publish`` and ``Consume``) are checked
   message by message, each producer or consumer id once per stream.  A refusal is
   ``PERMISSION_DENIED`` naming the permission and the resource.

danube's own HTTP/2 server gets the wrapped handlers through :class:`GuardedRegistrar` (the
generated ``add_*_to_server`` functions register through it); grpc.aio servers through
:class:`GuardInterceptor`.  Both wrap each method's handler once and reuse it.
"""

from __future__ import annotations

import inspect
import logging
import time
from typing import TYPE_CHECKING, Any, Callable

import grpc

from danube.errors import AuthenticationError, DanubeError
from danube.security.rbac import ANY_RESOURCE, BROKER_PRINCIPAL, CLUSTER, Authorizer
from danube.security.tls import identity_of
from danube.server import status as status_map

if TYPE_CHECKING:
    from danube.broker.service import BrokerService

log = logging.getLogger(__name__)

_BEARER = "bearer "


# ---------------------------------------------------------------- resources of requests


def _producer_topic(broker: BrokerService, producer_id: int) -> str | None:
    topic = broker.producer_topic(producer_id)
    if topic is None:  # a producer known from metadata, not yet reopened after a restart
        topic = broker.registered_topic("producer", producer_id)
    return topic


def _consumer_topic(broker: BrokerService, consumer_id: int) -> str | None:
    info = broker.consumer_info(consumer_id)
    if info is not None:
        return info[0]
    topic = broker.registered_topic("consumer", consumer_id)
    if topic is not None:
        return topic
    # a consumer this broker forwards for (proxy mode, danube.cluster.client_proxy)
    proxy = broker.cluster.client_proxy if broker.cluster is not None else None
    return proxy.consumer_topic(consumer_id) if proxy is not None else None


def _namespace(name: str) -> str:
    return "/" + name.strip("/").split("/", 1)[0] if name and name.strip("/") else CLUSTER


def _admin_resource(request, broker) -> str:
    """The topic or namespace an admin request names, else the cluster."""
    for field in ("topic", "name", "base_name"):
        value = getattr(request, field, None)
        if isinstance(value, str) and value:
            if value.startswith("/") and value.strip("/").count("/") == 1:
                return value
            return _namespace(value)
    for field in ("namespace",):
        value = getattr(request, field, None)
        if isinstance(value, str) and value:
            return _namespace(value)
    return CLUSTER


Resolver = Callable[[Any, Any], "str | None"]

# method -> (permission, resource of the request; None = authentication only)
RULES: dict[str, tuple[str | None, Resolver | None]] = {
    "/danube.ProducerService/CreateProducer": ("produce", lambda r, b: r.topic_name),
    # a producer not served here is forwarded (proxy mode) only to the topic the message names, and
    # only once the owner confirmed the id belongs to that topic (danube.cluster.client_proxy)
    "/danube.ProducerService/SendMessage": (
        "produce",
        lambda r, b: _producer_topic(b, r.msg_id.producer_id) or r.msg_id.topic_name or None,
    ),
    "/danube.ConsumerService/Subscribe": ("consume", lambda r, b: r.topic_name),
    "/danube.ConsumerService/ReceiveMessages": ("consume", lambda r, b: _consumer_topic(b, r.consumer_id)),
    "/danube.ConsumerService/Ack": ("consume", lambda r, b: r.msg_id.topic_name),
    "/danube.ConsumerService/Nack": ("consume", lambda r, b: r.msg_id.topic_name),
    "/danube.Discovery/TopicLookup": ("lookup", lambda r, b: r.topic),
    "/danube.Discovery/TopicPartitions": ("lookup", lambda r, b: r.topic),
    "/danube.HealthCheck/HealthCheck": (None, None),
    "/danube_batch.BatchLane/Health": (None, None),  # HealthCheck for many ids: the same rule
    "/danube_batch.BatchLane/CreateProducer": ("produce", lambda r, b: r.topic),
    "/danube_batch.BatchLane/Ack": ("consume", lambda r, b: _consumer_topic(b, r.consumer_id)),
    "/danube_batch.BatchLane/Nack": ("consume", lambda r, b: _consumer_topic(b, r.consumer_id)),
    # Schema registry: reading schemas needs lookup somewhere, registering needs produce somewhere.
    "/danube_schema.SchemaRegistry/GetSchema": ("lookup", lambda r, b: ANY_RESOURCE),
    "/danube_schema.SchemaRegistry/GetLatestSchema": ("lookup", lambda r, b: ANY_RESOURCE),
    "/danube_schema.SchemaRegistry/ListVersions": ("lookup", lambda r, b: ANY_RESOURCE),
    "/danube_schema.SchemaRegistry/ListSubjects": ("lookup", lambda r, b: ANY_RESOURCE),
    "/danube_schema.SchemaRegistry/CheckCompatibility": ("lookup", lambda r, b: ANY_RESOURCE),
    "/danube_schema.SchemaRegistry/GetTopicSchemaConfig": ("lookup", lambda r, b: ANY_RESOURCE),
    "/danube_schema.SchemaRegistry/RegisterSchema": ("produce", lambda r, b: ANY_RESOURCE),
    # Scalable topics: what their producers and consumers call needs lookup / consume on the topic
    # (publishes go to its segment topics, covered by a grant on the topic); the rest is admin on it.
    "/danube_scalable.ScalableTopics/WatchTopic": ("lookup", lambda r, b: r.topic),
    "/danube_scalable.ScalableTopics/GetScalableTopic": ("lookup", lambda r, b: r.topic),
    "/danube_scalable.ScalableTopics/RegisterConsumer": ("consume", lambda r, b: r.topic),
    "/danube_scalable.ScalableTopics/SegmentDrained": ("consume", lambda r, b: r.topic),
    "/danube_scalable.ScalableTopics/CreateSubscription": ("consume", lambda r, b: r.topic),
    # what a producer stored in a sealed segment (its lost acks): asked by whoever publishes there
    "/danube_scalable.ScalableTopics/StoredMessages": ("produce", lambda r, b: r.segment_topic),
    "/danube_scalable.ScalableTopics/CreateScalableTopic": ("admin", lambda r, b: r.topic),
    "/danube_scalable.ScalableTopics/DescribeScalableTopic": ("admin", lambda r, b: r.topic),
    "/danube_scalable.ScalableTopics/DeleteScalableTopic": ("admin", lambda r, b: r.topic),
    "/danube_scalable.ScalableTopics/SplitSegment": ("admin", lambda r, b: r.topic),
    "/danube_scalable.ScalableTopics/MergeSegments": ("admin", lambda r, b: r.topic),
    "/danube_scalable.ScalableTopics/DeleteSubscription": ("admin", lambda r, b: r.topic),
    "/danube_scalable.ScalableTopics/ListSubscriptions": ("admin", lambda r, b: r.topic),
    "/danube_scalable.ScalableTopics/ListScalableTopics": ("admin", lambda r, b: _namespace(r.namespace)),
}
_ADMIN_PREFIX = "/danube_admin."


def rule_for(method: str) -> tuple[str | None, Resolver | None]:
    rule = RULES.get(method)
    if rule is not None:
        return rule
    if method.startswith(_ADMIN_PREFIX):
        return "admin", _admin_resource
    return "admin", lambda r, b: CLUSTER  # default-deny: an unknown method is for admins only


# Streaming requests: each message's (permission, resource), or None when it names nothing new.
def _publish_resource(request, broker, seen: set) -> tuple[str, str | None] | None:
    # the request's fields as danube's reader gives them (danube._core.publish_request):
    # create and producer_id are None unless the oneof chose them
    create = request.create
    if create is not None:
        key = ("t", create.topic)
        resource = create.topic
    elif request.producer_id is not None:
        key = ("p", request.producer_id)
        resource = None
    else:
        return None
    if key in seen:
        return None
    seen.add(key)
    if resource is None:
        resource = _producer_topic(broker, request.producer_id)
        if resource is None:
            seen.discard(key)  # unknown: the broker answers NOT_FOUND; check again next time
            return None
    return "produce", resource


def _consume_resource(request, broker, seen: set) -> tuple[str, str | None] | None:
    kind = request.WhichOneof("kind")
    if kind == "subscribe":
        return "consume", request.subscribe.topic
    consumer_id = None
    if kind == "consumer_id":
        consumer_id = request.consumer_id
    elif kind == "ack":
        consumer_id = request.ack.consumer_id
    elif kind == "nack":
        consumer_id = request.nack.consumer_id
    if not consumer_id or consumer_id in seen:  # 0 = this stream's consumer, already checked
        return None
    topic = _consumer_topic(broker, consumer_id)
    if topic is None:
        return None
    seen.add(consumer_id)
    return "consume", topic


STREAM_RULES = {
    "/danube_batch.BatchLane/Publish": _publish_resource,
    "/danube_batch.BatchLane/Consume": _consume_resource,
}


# ---------------------------------------------------------------- the guard


class _Denied(Exception):
    """Raised inside a checked request stream; the wrapper turns it into the call's status."""


class CallGuard:
    def __init__(
        self, *, verifier=None, authorizer: Authorizer | None, broker, accept_client_certificates: bool = False
    ) -> None:
        self.verifier = verifier
        self.authorizer = authorizer
        self.broker = broker
        self.accept_client_certificates = accept_client_certificates

    # ------------------------------------------------------------ who

    def principal(self, metadata, cert_of: Callable[[], Any] | None) -> str:
        token = None
        for key, value in metadata or ():
            if key == "authorization":
                text = value.decode() if isinstance(value, bytes) else value
                if text[:7].lower() != _BEARER:
                    raise AuthenticationError("the authorization header is not 'Bearer <jwt>'")
                token = text[7:].strip()
                break
        if token and self.verifier is not None:
            return self.verifier.subject(token)
        if self.accept_client_certificates and cert_of is not None:
            name = identity_of(cert_of())
            if name == BROKER_PRINCIPAL:
                raise AuthenticationError(
                    f"the subject {BROKER_PRINCIPAL!r} is reserved for the brokers' own "
                    "tokens; a client certificate cannot claim it"
                )
            if name:
                return name
        if token:
            raise AuthenticationError(
                "this broker does not accept JWTs (no auth.jwt configured); use a client certificate"
            )
        if self.verifier is not None:
            raise AuthenticationError(
                "no credentials: send the metadata 'authorization: Bearer <jwt>' (danube admin security tokens create)"
            )
        raise AuthenticationError("no credentials: connect with a client certificate signed by the broker's CA")

    def check(self, principal: str, permission: str | None, resource) -> None:
        if permission is None or self.authorizer is None:
            return
        self.authorizer.check(principal, permission, resource)

    # ------------------------------------------------------------ wrapping handlers

    def wrap(self, method: str, handler, cert_lookup: Callable[[Any], Any]):
        """``handler`` (a grpc RpcMethodHandler) with the check in front; None stays None."""
        if handler is None:
            return None
        guard = self
        broker = self.broker
        permission, resolver = rule_for(method)
        stream_rule = STREAM_RULES.get(method)

        def who(context) -> str:
            return guard.principal(context.invocation_metadata(), lambda: cert_lookup(context))

        async def refuse(context, exc: DanubeError):
            _log_refusal(method, context, exc)
            await context.abort(status_map.status_for(exc), status_map.message_for(exc))

        def check_request(principal: str, request) -> None:
            if permission is not None:
                guard.check(principal, permission, resolver(request, broker) if resolver else CLUSTER)

        if not handler.request_streaming:
            if not handler.response_streaming:
                behaviour = handler.unary_unary

                async def unary_unary(request, context):
                    try:
                        check_request(who(context), request)
                    except DanubeError as exc:
                        await refuse(context, exc)
                    return await behaviour(request, context)

                return handler._replace(unary_unary=unary_unary)
            behaviour = handler.unary_stream

            async def unary_stream(request, context):
                try:
                    check_request(who(context), request)
                except DanubeError as exc:
                    await refuse(context, exc)
                await _run_streaming(behaviour(request, context), context)

            return handler._replace(unary_stream=unary_stream)

        def checked_requests(principal: str, requests, denied: list, context):
            seen: set = set()

            def refused(request) -> DanubeError | None:
                need = stream_rule(request, broker, seen) if stream_rule is not None else None
                if need is not None:
                    try:
                        guard.check(principal, need[0], need[1])
                    except DanubeError as exc:
                        return exc
                return None

            async def gen():
                async for request in requests:
                    exc = refused(request)
                    if exc is not None:
                        denied.append(exc)
                        raise _Denied()
                    yield request

            take_by_sink = getattr(requests, "take_by_sink", None)
            fail_now = getattr(context, "fail_now", None)
            if take_by_sink is None or fail_now is None:
                return gen()

            def checked_take_by_sink(sink) -> None:
                """The native server's sink, with every request checked before it is handed
                over: a refused one ends the call with its status, and nothing after it is read."""

                def checked(request) -> None:
                    exc = None if request is grpc.aio.EOF else refused(request)
                    if exc is None:
                        sink(request)
                        return
                    denied.append(exc)
                    _log_refusal(method, context, exc)
                    fail_now(status_map.status_for(exc), status_map.message_for(exc))

                take_by_sink(checked)

            return _CheckedRequests(gen(), checked_take_by_sink)

        async def start(request_iterator, context):
            try:
                principal = who(context)
                if stream_rule is None:
                    guard.check(principal, permission, CLUSTER if permission is not None else None)
            except DanubeError as exc:
                await refuse(context, exc)
            denied: list = []
            return checked_requests(principal, request_iterator, denied, context), denied

        if not handler.response_streaming:
            behaviour = handler.stream_unary

            async def stream_unary(request_iterator, context):
                requests, denied = await start(request_iterator, context)
                try:
                    response = await behaviour(requests, context)
                except _Denied:
                    response = None
                if denied:
                    await refuse(context, denied[0])
                return response

            return handler._replace(stream_unary=stream_unary)
        behaviour = handler.stream_stream

        async def stream_stream(request_iterator, context):
            requests, denied = await start(request_iterator, context)
            try:
                await _run_streaming(behaviour(requests, context), context, denied)
            except _Denied:
                pass
            if denied:
                await refuse(context, denied[0])

        return handler._replace(stream_stream=stream_stream)


class _CheckedRequests:
    """The guard's checked request stream, read by iteration or taken by a sink (``take_by_sink``,
    as the native server's own request iterator offers it); each way every request is checked."""

    __slots__ = ("_requests", "take_by_sink")

    def __init__(self, requests, take_by_sink: Callable[[Callable[[Any], None]], None]) -> None:
        self._requests = requests
        self.take_by_sink = take_by_sink

    def __aiter__(self):
        return self._requests


async def _run_streaming(result, context, denied: list | None = None) -> None:
    """Run a streaming handler: an async generator (its responses written here) or a coroutine."""
    if inspect.isasyncgen(result):
        try:
            async for response in result:
                if denied:
                    break
                await context.write(response)
        finally:
            await result.aclose()
    else:
        await result


_REFUSAL_LOG_PER_S = 10
_refusals = {"window": 0.0, "logged": 0, "suppressed": 0}


def _log_refusal(method: str, context, exc: DanubeError) -> None:
    """Refusals are logged (the reason, never a token), at most 10 lines a second so a client
    retrying with a bad token cannot flood the log; the lines left out are counted."""
    now = time.monotonic()
    state = _refusals
    if now - state["window"] >= 1.0:
        if state["suppressed"]:
            log.info("(%d more refused calls not logged)", state["suppressed"])
        state["window"], state["logged"], state["suppressed"] = now, 0, 0
    if state["logged"] >= _REFUSAL_LOG_PER_S:
        state["suppressed"] += 1
        return
    state["logged"] += 1
    log.info("refused %s from %s: %s", method, _peer(context), exc)


def _peer(context) -> str:
    try:
        return context.peer()
    except Exception:  # noqa: BLE001 - only for a log line
        return "unknown"


# ---------------------------------------------------------------- the two servers


class _WrappingGeneric(grpc.GenericRpcHandler):
    def __init__(self, inner, guard: CallGuard, cert_lookup) -> None:
        self._inner = inner
        self._guard = guard
        self._cert_lookup = cert_lookup
        self._wrapped: dict[str, Any] = {}

    def service(self, handler_call_details):
        method = handler_call_details.method
        wrapped = self._wrapped.get(method)
        if wrapped is None:
            handler = self._inner.service(handler_call_details)
            if handler is None:
                return None
            wrapped = self._wrapped[method] = self._guard.wrap(method, handler, self._cert_lookup)
        return wrapped


class GuardedRegistrar:
    """Stands in for a server while services register: every handler reaches the real server
    wrapped by the guard.  Anything else is passed through to the server."""

    def __init__(self, server, guard: CallGuard, cert_lookup: Callable[[Any], Any]) -> None:
        self._server = server
        self._guard = guard
        self._cert_lookup = cert_lookup

    def add_registered_method_handlers(self, service_name: str, method_handlers: dict) -> None:
        self._server.add_registered_method_handlers(
            service_name,
            {
                name: self._guard.wrap(f"/{service_name}/{name}", handler, self._cert_lookup)
                for name, handler in method_handlers.items()
            },
        )

    def add_generic_rpc_handlers(self, generic_rpc_handlers) -> None:
        self._server.add_generic_rpc_handlers(
            [_WrappingGeneric(g, self._guard, self._cert_lookup) for g in generic_rpc_handlers]
        )

    def __getattr__(self, name: str):
        return getattr(self._server, name)


class GuardInterceptor(grpc.aio.ServerInterceptor):
    """The guard as a grpc.aio interceptor (each method's handler wrapped once, then reused)."""

    def __init__(self, guard: CallGuard) -> None:
        self._guard = guard
        self._wrapped: dict[str, tuple[Any, Any]] = {}

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = self._guard.wrap(method, handler, _grpc_auth_context)
        self._wrapped[method] = (handler, wrapped)
        return wrapped


def _grpc_auth_context(context):
    try:
        return context.auth_context()
    except Exception:  # noqa: BLE001
        return None
