"""Calls answered, per method and gRPC status: Danube's ``danube_broker_rpc_total``.

Counted where each call's status is decided: danube's own HTTP/2 server hands every
status it sends to :meth:`RpcCounts.observe` (``H2Server.on_status``); a grpc.aio server
gets :class:`CountingInterceptor`.  A count is one dict update per call, never per
message: a publish stream of the batch lane is one call however many batches it
carries (a batch refused inside the stream is answered in its ack, not as a status).

Labels are built at scrape time from the method path: ``service`` and ``method`` in
Danube's spelling (``/danube.ProducerService/SendMessage`` is ``producer`` /
``send_message``), ``result`` ``ok`` or ``error`` as Danube's (``cancelled`` when the client
cancelled: a closed stream is no error), and ``code`` (the status name) added so a dashboard
can tell a refused request from a server failure.  Paths no
service registered are counted under one ``unknown`` method: client input never becomes
a label value.
"""

from __future__ import annotations

import asyncio
import inspect
import re
from functools import lru_cache

import grpc

UNKNOWN_METHOD = "/unknown/unknown"

# The codes that say the server failed, not the request (HTTP's 5xx in gRPC's own mapping), less
# UNIMPLEMENTED: a method this broker does not offer (a cluster call asked of a standalone broker,
# as every page of the gateway's console does) is no failure of the broker.
SERVER_ERROR_CODES = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    }
)

# A client that cancels (closes its stream, gives up) made no error: counted apart from Danube's two.
_RESULTS = {grpc.StatusCode.OK: "ok", grpc.StatusCode.CANCELLED: "cancelled"}

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def _snake(name: str) -> str:
    return _CAMEL.sub("_", name).lower()


@lru_cache(maxsize=1024)
def method_labels(path: str) -> tuple[str, str]:
    """``(service, method)`` of ``/package.Service/Method`` as Danube's metrics name them."""
    service, _, method = path.lstrip("/").partition("/")
    service = service.rpartition(".")[2]
    if service.endswith("Service") and service != "Service":
        service = service[: -len("Service")]
    return _snake(service), _snake(method)


_OK = grpc.StatusCode.OK


class RpcCounts:
    def __init__(self) -> None:
        # Calls answered OK by method path apart: a str key's hash is cached, where hashing a
        # StatusCode (an Enum) is a Python call, which the successful calls never pay.
        self._ok: dict[str, int] = {}
        self._other: dict[tuple[str, grpc.StatusCode], int] = {}

    def observe(self, method: str, code: grpc.StatusCode) -> None:
        if code is _OK:
            ok = self._ok
            ok[method] = ok.get(method, 0) + 1
        else:
            key = (method, code)
            other = self._other
            other[key] = other.get(key, 0) + 1

    def samples(self) -> list[tuple[str, str, str, str, int]]:
        """``(service, method, result, code, count)`` for every method and status seen."""
        out = []
        # copies: the event loop keeps counting while the metrics thread reads
        seen = [((path, _OK), count) for path, count in self._ok.copy().items()]
        for (path, code), count in seen + list(self._other.copy().items()):
            service, method = method_labels(path)
            out.append((service, method, _RESULTS.get(code, "error"), code.name, count))
        return out


class CountingInterceptor(grpc.aio.ServerInterceptor):
    """The counts for a grpc.aio server: each method's handler wrapped once, then reused."""

    def __init__(self, counts: RpcCounts) -> None:
        self._counts = counts
        self._wrapped: dict[str, tuple[object, object]] = {}

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        if handler is None:  # grpc answers UNIMPLEMENTED itself
            self._counts.observe(UNKNOWN_METHOD, grpc.StatusCode.UNIMPLEMENTED)
            return None
        method = handler_call_details.method
        cached = self._wrapped.get(method)
        if cached is not None and cached[0] is handler:
            return cached[1]
        wrapped = _counted(method, handler, self._counts)
        self._wrapped[method] = (handler, wrapped)
        return wrapped


def _code_of(context, default: grpc.StatusCode) -> grpc.StatusCode:
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    if isinstance(code, int):  # grpc.aio keeps the number once set
        for member in grpc.StatusCode:
            if member.value[0] == code:
                return member
    return default


def _counted(method: str, handler, counts: RpcCounts):
    observe = counts.observe
    kind = (
        ("stream" if handler.request_streaming else "unary")
        + "_"
        + ("stream" if handler.response_streaming else "unary")
    )
    behaviour = getattr(handler, kind)

    async def run(request, context):
        code = grpc.StatusCode.OK
        try:
            result = behaviour(request, context)
            if not handler.response_streaming:
                return await result
            if inspect.isasyncgen(result):
                try:
                    async for response in result:
                        await context.write(response)
                finally:
                    await result.aclose()
            else:
                await result
            return None
        except asyncio.CancelledError:
            code = grpc.StatusCode.CANCELLED
            raise
        except BaseException:  # an abort (its code is the context's) or a handler's bug (UNKNOWN)
            code = _code_of(context, grpc.StatusCode.UNKNOWN)
            raise
        finally:
            observe(method, code if code is not grpc.StatusCode.OK else _code_of(context, code))

    return handler._replace(**{kind: run})
