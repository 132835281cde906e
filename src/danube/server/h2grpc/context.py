"""The part of ``grpc.aio.ServicerContext`` a servicer reads and sets on a ``ServerCall``.

Plain accessors over the call's state, kept apart from the call's stream handling so that
``call.py`` holds one job: a request stream in, a handler, an answer out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import grpc

from danube.server.h2grpc import wire

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable

    from danube.server.h2grpc.call import ServerCall
    from danube.server.h2grpc.connection import GrpcConnection


class RequestIterator:
    """The request stream of a client-streaming or bidi call, as grpc.aio hands it over."""

    # ``call`` is public so a handler can tell its call's own iterator from a wrapper around it
    # (the auth guard's per-message check) before it takes messages by sink instead
    __slots__ = ("call",)

    def __init__(self, call: "ServerCall") -> None:
        self.call = call

    def __aiter__(self) -> "RequestIterator":
        return self

    def take_by_sink(self, sink: "Callable[[Any], None]") -> None:
        """From now on the requests go to ``sink`` as they arrive (``ServerCall.set_message_sink``)
        instead of through this iterator.  Offered by the iterator, not only by the call, so a
        wrapper that must see every request (the auth guard's check) offers its own or none."""
        self.call.set_message_sink(sink)

    async def __anext__(self):
        call = self.call
        if call._messages:  # one coroutine less per message when it is already here
            return call._next_message()
        message = await call.read()
        if message is grpc.aio.EOF:
            raise StopAsyncIteration
        return message


class ServicerContextPart:
    """Codes, details, metadata, peer, deadline and done callbacks of one call."""

    # set here and by the call; the rest of the state these read is the call's
    __slots__ = ("_code", "_details", "_trailing_metadata", "_metadata", "_done_callbacks")

    _code: grpc.StatusCode
    _details: str
    _trailing_metadata: tuple
    _metadata: tuple | None
    _headers: list
    _connection: GrpcConnection
    _deadline: float | None
    _cancelled: bool
    _finished: bool
    _task: asyncio.Task | None
    _done_callbacks: list[Callable[[Any], None]] | None

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def set_trailing_metadata(self, trailing_metadata) -> None:
        self._trailing_metadata = tuple(trailing_metadata)

    def trailing_metadata(self) -> tuple:
        return self._trailing_metadata

    def invocation_metadata(self) -> tuple:
        if self._metadata is None:
            self._metadata = wire.metadata_from_headers(self._headers)
        return self._metadata

    def peer(self) -> str:
        return self._connection.peer

    def time_remaining(self) -> float | None:
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - self._connection.loop.time())

    def cancelled(self) -> bool:
        return self._cancelled

    def done(self) -> bool:
        return self._finished

    def add_done_callback(self, callback) -> None:
        if self._finished and self._task is not None and self._task.done():
            callback(self)
        elif self._done_callbacks is None:
            self._done_callbacks = [callback]
        else:
            self._done_callbacks.append(callback)

    def set_compression(self, compression) -> None:
        """Accepted and ignored: responses are always sent uncompressed."""

    def disable_next_message_compression(self) -> None:
        """Accepted and ignored: responses are always sent uncompressed."""

    def auth_context(self) -> dict:
        return {}
